"""The training keys of a TRL config (batch sizes, schedule, logging, checkpoints, evaluation) as policyzoo's
``train``, ``engine``, ``data`` and ``eval`` keys; ``r`` is the reader of :mod:`policyzoo.trl_port.port` (the
effective TRL value of a key, ``refuse``, ``origins``) and ``port`` the :class:`~policyzoo.trl_port.port.Port`
being built (its ``notes`` and ``ignored``)."""

from __future__ import annotations

from typing import Any


def set_key(r, tree: dict, key: str, value: Any, *trl_keys: str) -> None:
    """``tree[key] = value`` (``key`` dotted, e.g. ``train.lr``), its origin the ``trl_keys`` in ``r.origins``."""
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    r.origins[key] = r.src(*trl_keys)


def batch_keys(r, tree: dict, world: int) -> None:
    """Batch sizes and step counts: ``train.prompts_per_step`` (completions per step / ``num_generations``),
    ``micro_batches``, ``updates_per_batch``, ``steps``, for ``world`` data-parallel ranks. Raises
    :class:`~policyzoo.errors.ConfigError` (``r.refuse``) for sizes policyzoo cannot honour."""
    per, gas, g = r("per_device_train_batch_size"), r("gradient_accumulation_steps"), r("num_generations")
    if g < 2:
        r.refuse("num_generations", "GRPO needs at least 2 completions per prompt (TRL refuses it too)")
    spg = r("steps_per_generation")
    if spg is not None and spg != gas:
        r.refuse("steps_per_generation", "policyzoo takes one optimizer step on each whole sampled batch; TRL's "
                 "steps_per_generation != gradient_accumulation_steps splits one generation over several optimizer "
                 "steps", "set steps_per_generation = gradient_accumulation_steps (or leave it unset)")
    gbs = r("generation_batch_size")
    if gbs is not None and gbs != per * world * gas:
        r.refuse("generation_batch_size", f"it must equal per_device_train_batch_size x world size x "
                 f"gradient_accumulation_steps = {per * world * gas} (one optimizer step per generation)",
                 "leave generation_batch_size unset")
    rows = per * gas * world
    if rows % g:
        r.refuse("per_device_train_batch_size", f"{per} x gradient_accumulation_steps {gas} x world size {world} = "
                 f"{rows} completions is not a whole number of groups of num_generations={g}",
                 "choose sizes whose product is a multiple of num_generations")
    set_key(r, tree, "train.prompts_per_step", rows // g, "per_device_train_batch_size", "gradient_accumulation_steps",
         "num_generations")
    r.origins["train.prompts_per_step"] += f" x WORLD_SIZE={world} / num_generations"
    set_key(r, tree, "train.micro_batches", gas, "gradient_accumulation_steps")
    iters = r("num_iterations")
    set_key(r, tree, "train.updates_per_batch", iters, "num_iterations")
    if "max_steps" in r.given and r("max_steps") > 0:
        if r("max_steps") % iters:
            r.refuse("max_steps", f"policyzoo runs num_iterations={iters} optimizer steps per sampled batch, so "
                     "max_steps must be a multiple of it")
        set_key(r, tree, "train.steps", r("max_steps") // iters, "max_steps", "num_iterations")
    elif "num_train_epochs" in r.given:
        r.refuse("num_train_epochs", "policyzoo counts optimizer steps, not epochs", "set max_steps")


def schedule_keys(r, tree: dict, port) -> None:
    """The optimizer and its schedule: ``train.lr``, AdamW's betas, warm-up, clip, precision; differing
    conventions as ``port.notes``. Raises :class:`ConfigError` for a schedule or optimizer policyzoo lacks."""
    t = "train"
    for ours, theirs in (("lr", "learning_rate"), ("weight_decay", "weight_decay"), ("adam_beta1", "adam_beta1"),
                         ("adam_beta2", "adam_beta2"), ("adam_epsilon", "adam_epsilon"),
                         ("grad_clip", "max_grad_norm"), ("gradient_checkpointing", "gradient_checkpointing"),
                         ("seed", "seed")):
        set_key(r, tree, f"{t}.{ours}", r(theirs), theirs)
    kind = r("lr_scheduler_type")
    kinds = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
    if kind not in kinds:
        r.refuse("lr_scheduler_type", f"policyzoo's schedules are {', '.join(kinds)}")
    set_key(r, tree, f"{t}.lr_scheduler_type", kinds[kind], "lr_scheduler_type")
    if "warmup_ratio" in r.given:  # an older config's key: the same schedule as warmup_steps < 1
        if "warmup_steps" in r.given:
            r.refuse("warmup_ratio", "it and warmup_steps both set the warm-up", "keep one of them")
        set_key(r, tree, f"{t}.warmup_ratio", float(r.given["warmup_ratio"]), "warmup_ratio")
        port.notes.append("warmup_ratio is transformers < 5's key (warmup_steps < 1 now); mapped to train.warmup_ratio")
    warm = r("warmup_steps")
    if 0 < warm < 1:
        set_key(r, tree, f"{t}.warmup_ratio", float(warm), "warmup_steps")
    elif warm != int(warm) or warm < 0:
        r.refuse("warmup_steps", "a warm-up is a whole number of steps, or a float in (0, 1) for a ratio")
    else:
        set_key(r, tree, f"{t}.warmup_steps", int(warm), "warmup_steps")
    if warm:
        port.notes.append("warm-up: policyzoo's factor at update k is (k + 1) / (w + 1), transformers' k / w "
                          "(no update at lr 0; docs/glossary.md)")
    if r("optim") not in ("adamw_torch", "adamw_torch_fused", "adamw_hf"):
        r.refuse("optim", "policyzoo trains with AdamW (adamw_torch, adamw_torch_fused)")
    bf16 = r("bf16")
    set_key(r, tree, f"{t}.autocast", bool(not r("fp16") if bf16 is None else bf16), "bf16")
    if r("tf32") is not None:  # TRL's None leaves torch's setting: here the GPU profile's (train.tf32 null)
        set_key(r, tree, f"{t}.tf32", bool(r("tf32")), "tf32")
    if "steps" not in tree[t] and "num_train_epochs" not in r.given:
        port.notes.append("max_steps not given: TRL would train num_train_epochs=3.0 epochs; policyzoo counts "
                          "optimizer steps, train.steps keeps its default (set max_steps)")


def bookkeeping_keys(r, tree: dict, port) -> None:
    """Seeds, trackers, logging, evaluation and checkpoint cadence, output folder, rollout engine and vLLM
    memory. Raises :class:`ConfigError` for a strategy or tracker policyzoo lacks."""
    if r("data_seed") is not None:
        set_key(r, tree, "data.seed", r("data_seed"), "data_seed")
    report = r("report_to")
    report = [x for x in ([report] if isinstance(report, str) else list(report or [])) if x != "none"]
    if any(x not in ("tensorboard", "wandb") for x in report):
        r.refuse("report_to", "policyzoo reports to tensorboard and wandb", "name them: report_to: [tensorboard]")
    set_key(r, tree, "train.report_to", report, "report_to")
    log = r("logging_steps")
    if r("log_completions") and (log < 1 or log != int(log)):
        r.refuse("logging_steps", "with log_completions policyzoo needs a whole number of steps")
    set_key(r, tree, "train.log_completions_every", int(log) if r("log_completions") else 0, "log_completions",
         "logging_steps")
    for what, ours in (("eval", "eval_every"), ("save", "save_every")):
        strategy = r(f"{what}_strategy")
        if strategy not in ("no", "steps"):
            r.refuse(f"{what}_strategy", "policyzoo counts steps (no, steps)")
        every = 0 if strategy == "no" else r(f"{what}_steps") or r("logging_steps")
        if every != int(every):
            r.refuse(f"{what}_steps", "policyzoo needs a whole number of steps")
        set_key(r, tree, f"train.{ours}", int(every), f"{what}_strategy", f"{what}_steps")
    if r("save_total_limit") is not None:
        set_key(r, tree, "engine.keep_checkpoints", r("save_total_limit"), "save_total_limit")
    if r("deepspeed") is not None:
        set_key(r, tree, "engine.deepspeed", r("deepspeed"), "deepspeed")
    if "output_dir" in r.given and r("output_dir"):
        set_key(r, tree, "output_dir", str(r("output_dir")), "output_dir")
    set_key(r, tree, "model.trust_remote_code", bool(r("trust_remote_code")), "trust_remote_code")
    set_key(r, tree, "engine.rollout", "vllm" if r("use_vllm") else "transformers", "use_vllm")
    set_key(r, tree, "engine.vllm_sleep", 2 if r("vllm_enable_sleep_mode") else 0, "vllm_enable_sleep_mode")
    set_key(r, tree, "engine.gpu_memory_utilization", r("vllm_gpu_memory_utilization"), "vllm_gpu_memory_utilization")
    _evaluation(r, tree, port)


#: why a TRL evaluation key has no effect when eval_strategy is no
NO_EVAL = "eval_strategy is no: no held-out evaluation (data.eval_size=0)"


def _evaluation(r, tree: dict, port) -> None:
    """TRL's evaluation keys: ``eval_strategy: no`` (TRL's default) turns policyzoo's held-out evaluation off
    (``data.eval_size=0``: no rows held out, none evaluated); ``steps`` evaluates every ``eval_steps``
    (:func:`bookkeeping_keys` sets ``train.eval_every``) on ``data.eval_size`` held-out rows, with
    ``num_generations_eval`` samples each at ``temperature``."""
    if r("eval_strategy") == "no":
        set_key(r, tree, "data.eval_size", 0, "eval_strategy")
        port.notes.append("eval_strategy is no (TRL's default): no held-out evaluation (data.eval_size=0); for "
                          "one, set eval_strategy: steps and eval_steps, or data.eval_size=N on the command line")
        for key in ("eval_steps", "num_generations_eval", "per_device_eval_batch_size"):
            if key in r.given:
                port.ignored[key] = NO_EVAL
        return
    port.notes.append(f"eval_strategy is steps: policyzoo evaluates data.eval_size held-out rows (default 100) "
                      f"every {tree['train']['eval_every']} steps, and also before the first step and after the last")
    if r("num_generations_eval") is not None:
        set_key(r, tree, "eval.n", r("num_generations_eval"), "num_generations_eval")
        set_key(r, tree, "eval.temperature", r("temperature"), "temperature")
