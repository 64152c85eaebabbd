"""``policyzoo.from_trl`` / ``policyzoo train --trl-config``: a TRL GRPOConfig ported key by key.

Each mapped key has a row with the value stated by hand from TRL's documentation; refused keys
name themselves; the loss of a ported config equals TRL's own ``_compute_loss`` on one batch
(the harness of tests/test_trl_agreement.py, bench/trl_agreement.py).
"""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
import yaml  # noqa: E402
from trl import GRPOConfig  # noqa: E402

import policyzoo  # noqa: E402
from policyzoo import cli  # noqa: E402
from policyzoo.errors import ConfigError  # noqa: E402
from policyzoo.resolve import resolve_algorithm  # noqa: E402
from policyzoo.run_config import load_config, validate  # noqa: E402
from policyzoo.trl_port import port_trl  # noqa: E402
from policyzoo.trl_port.keys import DEFAULTS, IGNORED, MAPPED, REFUSED  # noqa: E402

_spec = importlib.util.spec_from_file_location("trl_agreement",
                                               Path(__file__).parents[1] / "bench" / "trl_agreement.py")
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)


def _value(trl: dict, key: str, world: int = 1):
    """The value ``key`` takes in the validated config ported from ``trl``: ``train.lr``,
    ``algorithm.clip`` (the component's name) or ``algorithm.clip.eps_high`` (its parameter,
    conventions applied); ``algorithm.term`` is the list of names."""
    tree = port_trl(trl, world_size=world).tree
    if key.startswith("algorithm."):
        bundle = resolve_algorithm(tree["algorithm"])
        slot, _, param = key.removeprefix("algorithm.").partition(".")
        u = getattr(bundle, slot)
        if isinstance(u, tuple):
            return [x.name for x in u] if not param else u[0].params[param]
        if u is None or not param:
            return None if u is None else u.name
        return u.params[param]
    node = validate(tree)
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_tables_cover_every_key_of_the_installed_grpo_config():
    names = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    assert set(MAPPED) | set(IGNORED) | set(REFUSED) == names == set(DEFAULTS)
    assert not (set(MAPPED) & set(IGNORED) or set(MAPPED) & set(REFUSED) or set(IGNORED) & set(REFUSED))
    for f in dataclasses.fields(GRPOConfig):
        if f.init:
            d = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert DEFAULTS[f.name] == getattr(d, "value", d), f.name


# (TRL keys given, policyzoo key, expected value): every expectation from TRL 1.16's docs by hand
ROWS = [
    ({}, "algorithm.kl", None),                                       # beta 0.0 by default (not grpo's 0.04)
    ({"beta": 0.04}, "algorithm.kl", "k3"),
    ({"beta": 0.04}, "algorithm.kl.beta", 0.04),
    ({"beta": 0.04}, "algorithm.kl.times_ratio", True),               # use_bias_correction_kl default True
    ({"beta": 0.04, "use_bias_correction_kl": False}, "algorithm.kl.times_ratio", False),
    ({}, "algorithm.reduce", "token_mean"),                           # loss_type dapo by default
    ({"loss_type": "grpo"}, "algorithm.reduce", "seq_mean_token_mean"),
    ({"loss_type": "grpo"}, "algorithm.reduce.empty_rows", "count"),  # TRL divides by every row
    ({"loss_type": "dr_grpo", "max_completion_length": 64}, "algorithm.reduce", "token_sum_norm"),
    ({"loss_type": "dr_grpo", "max_completion_length": 64}, "algorithm.reduce.constant", 64.0),
    ({"loss_type": "dr_grpo"}, "algorithm.kl", None),                 # dr_grpo is only the reduce in TRL
    ({"loss_type": "dr_grpo"}, "algorithm.baseline", "group_norm"),   # ... and keeps the std (scale group)
    ({"loss_type": "bnpo"}, "algorithm.reduce", "token_mean"),        # one micro-batch, one rank
    ({"loss_type": "cispo", "epsilon_high": 5.0}, "algorithm.clip", "cispo"),
    ({"loss_type": "cispo", "epsilon_high": 5.0}, "algorithm.clip.eps_high", 5.0),
    ({"loss_type": "cispo"}, "algorithm.clip.eps_high", 0.2),         # TRL: epsilon_high None -> epsilon
    ({"loss_type": "sapo", "sapo_temperature_neg": 1.5}, "algorithm.clip.tau_neg", 1.5),
    ({"loss_type": "sapo"}, "algorithm.clip.tau_pos", 1.0),
    ({"loss_type": "sapo", "sapo_temperature_pos": 0.8}, "algorithm.clip.tau_pos", 0.8),
    ({"loss_type": "sapo"}, "algorithm.reduce", "seq_mean_token_mean"),
    ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, "algorithm.reduce", "seq_mean_token_sum"),
    ({"loss_type": "vespo", "vespo_k_pos": 1.5}, "algorithm.clip.k_pos", 1.5),
    ({"loss_type": "vespo", "vespo_lambda_pos": 2.5}, "algorithm.clip.lambda_pos", 2.5),
    ({"loss_type": "vespo", "vespo_k_neg": 2.5}, "algorithm.clip.k_neg", 2.5),
    ({"loss_type": "vespo", "vespo_lambda_neg": 1.5}, "algorithm.clip.lambda_neg", 1.5),
    ({"epsilon": 0.1}, "algorithm.clip.eps_low", 0.1),
    ({"epsilon": 0.1}, "algorithm.clip.eps_high", 0.1),              # epsilon_high None -> epsilon
    ({"epsilon_high": 0.28}, "algorithm.clip.eps_high", 0.28),
    ({"delta": 1.5}, "algorithm.clip.dual_clip", 1.5),
    ({}, "algorithm.baseline.eps", 1e-4),                             # TRL's std + 1e-4 (conventions: trl)
    ({}, "algorithm.baseline.zero_std_tol", 0.0),
    ({"scale_rewards": "batch"}, "algorithm.baseline.scale", "batch"),
    ({"scale_rewards": "none"}, "algorithm.baseline", "group_mean"),
    ({"scale_rewards": False}, "algorithm.baseline", "group_mean"),
    ({"scale_rewards": True}, "algorithm.baseline.scale", "group"),
    ({"multi_objective_aggregation": "normalize_then_sum"}, "algorithm.baseline", "gdpo"),
    ({"num_generations": 4}, "algorithm.sample.n", 4),
    ({"max_completion_length": 100}, "algorithm.sample.max_tokens", 100),
    ({"temperature": 0.7}, "algorithm.sample.temperature", 0.7),
    ({"top_p": 0.9}, "algorithm.sample.top_p", 0.9),
    ({"top_k": 20}, "algorithm.sample.top_k", 20),
    ({"min_p": 0.05}, "algorithm.sample.min_p", 0.05),
    ({}, "algorithm.sample.min_p", 0.0),                             # None: no min-p filter
    ({"repetition_penalty": 1.1}, "algorithm.sample.repetition_penalty", 1.1),
    ({"importance_sampling_level": "sequence"}, "algorithm.ratio", "sequence"),
    ({}, "algorithm.ratio", "token"),
    ({"use_vllm": True}, "algorithm.ratio", "mis"),                   # TRL's default correction: sequence_mask, 3.0
    ({"use_vllm": True}, "algorithm.ratio.high", 3.0),
    ({"use_vllm": True}, "algorithm.ratio.level", "sequence"),
    ({"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"}, "algorithm.ratio", "tis"),
    ({"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"}, "algorithm.ratio.level", "token"),
    ({"use_vllm": True, "vllm_importance_sampling_clip_max": 2.0}, "algorithm.ratio.high", 2.0),
    ({"use_vllm": True, "vllm_importance_sampling_cap": 4.0}, "algorithm.ratio.high", 4.0),
    ({"use_vllm": True, "vllm_importance_sampling_clip_min": 0.5}, "algorithm.ratio.low", 0.5),
    ({"use_vllm": True, "vllm_importance_sampling_correction": False}, "algorithm.ratio", "token"),
    ({"off_policy_mask_threshold": 0.3}, "algorithm.ratio.threshold", 0.3),
    ({}, "algorithm.term", []),
    ({"entropy_coef": 0.01}, "algorithm.term", ["entropy"]),
    ({"entropy_coef": 0.01}, "algorithm.term.coef", 0.01),
    ({"use_adaptive_entropy": True}, "algorithm.term", ["entropy_adaptive"]),
    ({"use_adaptive_entropy": True, "entropy_target": 0.3}, "algorithm.term.target", 0.3),
    ({"use_adaptive_entropy": True, "entropy_coef_delta": 0.01}, "algorithm.term.delta", 0.01),
    ({"use_adaptive_entropy": True, "entropy_coef_min": 0.1}, "algorithm.term.coef_min", 0.1),
    ({"use_adaptive_entropy": True, "entropy_coef_max": 0.5}, "algorithm.term.coef_max", 0.5),
    # 8 completions per device x 1 accumulation x 1 rank / 8 per prompt = 1 prompt (TRL's defaults)
    ({}, "train.prompts_per_step", 1),
    ({"per_device_train_batch_size": 8, "num_generations": 4, "gradient_accumulation_steps": 3},
     "train.prompts_per_step", 6),                                    # 8 x 3 / 4
    ({"gradient_accumulation_steps": 3}, "train.micro_batches", 3),
    ({"gradient_accumulation_steps": 2, "steps_per_generation": 2}, "train.micro_batches", 2),
    ({"generation_batch_size": 16, "gradient_accumulation_steps": 2}, "train.prompts_per_step", 2),
    ({"num_iterations": 2}, "train.updates_per_batch", 2),
    ({"max_steps": 10, "num_iterations": 2}, "train.steps", 5),      # 10 optimizer steps = 5 batches x 2
    ({"learning_rate": 3e-6}, "train.lr", 3e-6),
    ({}, "train.lr", 1e-6),
    ({}, "train.lr_scheduler_type", "linear"),                      # TrainingArguments' default
    ({"lr_scheduler_type": "cosine"}, "train.lr_scheduler_type", "cosine"),
    ({"lr_scheduler_type": "constant_with_warmup"}, "train.lr_scheduler_type", "constant"),
    ({"warmup_steps": 5}, "train.warmup_steps", 5),
    ({"warmup_steps": 0.1}, "train.warmup_ratio", 0.1),
    ({"warmup_ratio": 0.05}, "train.warmup_ratio", 0.05),              # transformers < 5's key
    ({"weight_decay": 0.01}, "train.weight_decay", 0.01),
    ({"adam_beta1": 0.8}, "train.adam_beta1", 0.8),
    ({"adam_beta2": 0.99}, "train.adam_beta2", 0.99),
    ({"adam_epsilon": 1e-6}, "train.adam_epsilon", 1e-6),
    ({"max_grad_norm": 0.5}, "train.grad_clip", 0.5),
    ({"optim": "adamw_torch"}, "train.lr", 1e-6),                    # AdamW: nothing to change
    ({}, "train.autocast", True),                                     # bf16 None -> True (fp16 unset)
    ({"bf16": False}, "train.autocast", False),
    ({"tf32": False}, "train.tf32", False),
    ({}, "train.tf32", None),                                          # TRL's None: the GPU profile decides
    ({}, "train.gradient_checkpointing", True),                       # GRPOConfig's default
    ({"gradient_checkpointing": False}, "train.gradient_checkpointing", False),
    ({}, "train.seed", 42),
    ({"seed": 3}, "train.seed", 3),
    ({"data_seed": 7}, "data.seed", 7),
    ({}, "train.report_to", []),                                      # report_to 'none'
    ({"report_to": ["tensorboard"]}, "train.report_to", ["tensorboard"]),
    ({"report_to": "wandb"}, "train.report_to", ["wandb"]),
    ({"report_to": ["none"]}, "train.report_to", []),
    ({"log_completions": True, "logging_steps": 5}, "train.log_completions_every", 5),
    ({"logging_steps": 5}, "train.log_completions_every", 0),
    ({}, "data.eval_size", 0),                                       # eval_strategy 'no': no held-out rows
    ({"eval_strategy": "steps", "eval_steps": 25}, "data.eval_size", 100),  # policyzoo's default held-out rows
    ({"eval_strategy": "steps", "eval_steps": 25}, "train.eval_every", 25),
    ({"eval_strategy": "steps"}, "train.eval_every", 10),           # eval_steps None -> logging_steps
    ({}, "train.save_every", 500),
    ({"save_strategy": "no"}, "train.save_every", 0),
    ({"save_steps": 50}, "train.save_every", 50),
    ({"save_total_limit": 3}, "engine.keep_checkpoints", 3),
    ({"deepspeed": {"zero_optimization": {"stage": 1}}}, "engine.deepspeed", {"zero_optimization": {"stage": 1}}),
    ({"output_dir": "runs/x"}, "output_dir", "runs/x"),
    ({"trust_remote_code": True}, "model.trust_remote_code", True),
    ({}, "engine.rollout", "transformers"),                           # use_vllm False: transformers generate
    ({"use_vllm": True}, "engine.rollout", "vllm"),
    ({"use_vllm": True, "vllm_enable_sleep_mode": True}, "engine.vllm_sleep", 2),
    ({"vllm_gpu_memory_utilization": 0.5}, "engine.gpu_memory_utilization", 0.5),
    ({"eval_strategy": "steps", "num_generations_eval": 4, "temperature": 0.6}, "eval.n", 4),
    ({"eval_strategy": "steps", "num_generations_eval": 4, "temperature": 0.6}, "eval.temperature", 0.6),
    ({"num_generations_eval": 4}, "eval.n", 1),                     # eval_strategy 'no': nothing evaluated
    ({}, "train.reward_nan", "nansum"),                               # conventions: trl
]


@pytest.mark.parametrize("trl,key,expected", ROWS, ids=[f"{k}<-{sorted(t)}" for t, k, _ in ROWS])
def test_key_maps(trl, key, expected):
    assert _value(trl, key) == expected


def test_every_mapped_key_has_a_row():
    keys = {k for t, _, _ in ROWS for k in t} | {"num_train_epochs"}   # refused alone: a row below
    assert set(MAPPED) - keys == set()


def test_world_size_counts_in_prompts():
    # 4 completions x 2 accumulation x 4 ranks / 8 per prompt = 4 prompts per step
    trl = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 8}
    assert _value(trl, "train.prompts_per_step", world=4) == 4


REFUSALS = [
    ({"num_train_epochs": 1.0}, "num_train_epochs"),
    ({"mask_truncated_completions": True}, "mask_truncated_completions"),
    ({"top_entropy_quantile": 0.2}, "top_entropy_quantile"),
    ({"sync_ref_model": True}, "sync_ref_model"),
    ({"fp16": True}, "fp16"),
    ({"reward_weights": [1.0, 2.0]}, "reward_weights"),
    ({"steps_per_generation": 4}, "steps_per_generation"),
    ({"generation_batch_size": 24}, "generation_batch_size"),
    ({"per_device_train_batch_size": 6}, "per_device_train_batch_size"),  # 6 completions, groups of 8
    ({"num_generations": 1, "per_device_train_batch_size": 1}, "num_generations"),
    ({"loss_type": "bnpo", "gradient_accumulation_steps": 2}, "loss_type"),
    ({"loss_type": "nope"}, "loss_type"),
    ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type"),
    ({"optim": "sgd"}, "optim"),
    ({"report_to": "all"}, "report_to"),
    ({"save_strategy": "epoch"}, "save_strategy"),
    ({"max_steps": 5, "num_iterations": 2}, "max_steps"),
    ({"importance_sampling_level": "sequence", "use_vllm": True}, "vllm_importance_sampling_correction"),
    ({"off_policy_mask_threshold": 0.5, "importance_sampling_level": "sequence"}, "off_policy_mask_threshold"),
    ({"loss_type": "grpo", "entropy_coef": 0.01}, "entropy_coef"),
    ({"entropy_coef": 0.01, "gradient_accumulation_steps": 2}, "entropy_coef"),
    ({"max_prompt_length": 256}, "max_prompt_length"),                 # TRL < 1.0's key: prompts never cut
    ({"warmup_ratio": 0.1, "warmup_steps": 5}, "warmup_ratio"),
    ({"max_completion_len": 64}, "max_completion_len"),                 # a typo
    ({"lr_scheduler_kwargs": {"num_cycles": 2}}, "lr_scheduler_kwargs"),
    ({"vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size"),
]


@pytest.mark.parametrize("trl,key", REFUSALS, ids=[k for _, k in REFUSALS])
def test_refused_by_name(trl, key):
    with pytest.raises(ConfigError) as e:
        port_trl(trl, world_size=1)
    assert e.value.where == f"TRL config: {key}"
    assert key in e.value.why


def test_default_valued_refused_key_passes_and_ignored_keys_are_listed():
    port = port_trl({"fp16": False, "logging_first_step": True, "vllm_mode": "server", "use_cpu": True})
    assert set(port.ignored) == {"logging_first_step", "vllm_mode", "use_cpu"}
    assert "colocate" in port.ignored["vllm_mode"]


def test_grpo_config_object_and_yaml_file(tmp_path):
    obj = GRPOConfig(output_dir=str(tmp_path / "out"), loss_type="grpo", beta=0.04, learning_rate=2e-6,
                     per_device_train_batch_size=4, num_generations=4, report_to=[], bf16=False)
    port = port_trl(obj)
    assert port.tree["algorithm"]["kl"]["beta"] == 0.04 and port.tree["train"]["lr"] == 2e-6
    assert port.tree["train"]["prompts_per_step"] == 1 and port.tree["output_dir"] == str(tmp_path / "out")
    assert "(default)" not in port.origins["algorithm.reduce"]  # loss_type was given
    assert port.origins["train.seed"] == "seed=42 (default)"
    f = tmp_path / "grpo.yaml"
    f.write_text(yaml.safe_dump({"loss_type": "grpo", "beta": 0.04, "learning_rate": 2e-6}))
    assert policyzoo.from_trl(str(f))["algorithm"] == port.tree["algorithm"] | {
        "sample": {**port.tree["algorithm"]["sample"], "n": 8}}


def test_command_line_overrides_win(tmp_path, capsys):
    f = tmp_path / "grpo.yaml"
    f.write_text(yaml.safe_dump({"beta": 0.04, "learning_rate": 2e-6}))
    config = load_config(None, None, ["train.lr=5e-6", "algorithm.kl.beta=0.1"], tree=port_trl(str(f)).tree)
    assert config.train.lr == 5e-6 and config.algorithm["kl"]["beta"] == 0.1
    report = port_trl(str(f)).report({"train.lr": "5e-6"})
    assert report["set"]["train.lr"] == "command line (train.lr) over TRL learning_rate=2e-06"
    assert cli.main(["train", "--trl-config", str(f), "--algo", "grpo", "--dry-run"]) == 2
    assert "--trl-config" in capsys.readouterr().err


# TRL GRPOConfig kwargs whose ported loss must equal TRL's _compute_loss on the harness's batch
LOSS_CASES = [
    {},                                                                   # TRL's default: dapo, beta 0
    {"loss_type": "grpo", "beta": 0.04},                                  # KL x ratio (use_bias_correction_kl)
    {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False},
    {"loss_type": "dapo", "epsilon_high": 0.28},
    {"loss_type": "dr_grpo"},
    {"loss_type": "cispo", "epsilon_high": 5.0},
    {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    {"loss_type": "vespo"},
    {"loss_type": "sapo"},
    {"loss_type": "grpo", "delta": 1.3},
    {"loss_type": "grpo", "scale_rewards": "none"},
    {"loss_type": "dapo", "scale_rewards": "batch"},
    {"loss_type": "bnpo"},
]


@pytest.mark.parametrize("kw", LOSS_CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "default"
                                                 for c in LOSS_CASES])
def test_ported_loss_equals_trl_compute_loss(kw):
    # ta.trl builds GRPOConfig(**kw, max_completion_length=T) and computes TRL's advantages (its
    # scale_rewards) and TRL's _compute_loss; ours runs the ported algorithm through the hooks.
    spec = policyzoo.from_trl({**kw, "max_completion_length": ta.T, "num_generations": ta.G,
                               "per_device_train_batch_size": 8}, world_size=1)["algorithm"]
    lo, go, ao = ta.ours(spec, ta.make_case())
    lt, gt, at = ta.trl(kw, ta.make_case())
    # TRL's nanstd carries a 1.5e-8 relative error (float32 Bessel factor), so the advantages agree
    # to 1e-7 relative; the loss to 1e-7 of its terms' size: sapo's loss (4/tau) sigmoid(.) A sums
    # terms of size ~2|A| that nearly cancel within each group (sum_g A = 0), so the bound is taken
    # on max(|loss|, 4 mean|A|), not on the small loss alone.
    assert float((ao - at).abs().max()) <= 1e-7 * float(at.abs().max())
    assert abs(lo - lt) <= 1e-7 * max(abs(lo), abs(lt), 4 * float(at.abs().mean())), (lo, lt)
    assert float((go - gt).abs().max()) <= 1e-7 * float(gt.abs().max())
    assert float(gt.abs().max()) > 1e-3  # a real gradient
    # with the same advantages the two losses agree to float64 rounding; TRL's sapo builds its
    # temperatures with torch.where from Python floats, i.e. in float32 (1.05 -> 1.0499999523),
    # so ours gets the same float32-rounded temperatures for this comparison
    if spec["clip"]["use"] == "sapo":
        f32 = {k: float(torch.tensor(spec["clip"][k], dtype=torch.float32)) for k in ("tau_pos", "tau_neg")}
        lo, go, _ = ta.ours({**spec, "clip": {**spec["clip"], **f32}}, ta.make_case())
    lt_same, gt_same, _ = ta.trl(kw, ta.make_case(), advantages=ao)
    assert abs(lo - lt_same) <= 1e-12 and float((go - gt_same).abs().max()) <= 1e-12


def test_dry_run_prints_each_keys_source(tmp_path, monkeypatch, capsys):
    from _engine_helpers import tiny_model

    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    rows = tmp_path / "d.jsonl"
    rows.write_text("".join(f'{{"prompt": "what is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(8)))
    f = tmp_path / "grpo.yaml"
    f.write_text(yaml.safe_dump({"loss_type": "grpo", "beta": 0.04, "learning_rate": 2e-6, "num_generations": 4,
                                 "per_device_train_batch_size": 8, "max_completion_length": 12, "use_cpu": True}))
    args = ["train", "--trl-config", str(f), "--dry-run", f"model.path={tiny_model()}", f"data.path={rows}",
            "rewards=[{use: answer_match}]", f"output_dir={tmp_path / 'run'}", "train.lr=5e-6"]
    assert cli.main(args) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["train"]["lr"] == 5e-6 and out["train"]["prompts_per_step"] == 2  # 8 completions / 4
    assert out["algorithm"]["slots"]["reduce"]["components"][0]["use"] == "seq_mean_token_mean"
    src = out["from_trl"]["set"]
    assert src["train.lr"] == "command line (train.lr) over TRL learning_rate=2e-06"
    assert src["algorithm.kl"] == "TRL beta=0.04, use_bias_correction_kl=True (default)"
    assert out["from_trl"]["ignored"] == {"use_cpu": IGNORED["use_cpu"]}
    # TRL's default eval_strategy 'no': no held-out evaluation, said in the dry run
    assert out["data"]["eval_size"] == 0 and src["data.eval_size"] == "TRL eval_strategy='no' (default)"
    assert any(n.startswith("eval_strategy is no (TRL's default): no held-out evaluation")
               for n in out["from_trl"]["notes"])
    assert not (tmp_path / "run").exists()


def test_python_api_takes_the_ported_config(tmp_path):
    from policyzoo.api import build_config

    def brevity(completions, **kw):
        return [-len(c) / 100 for c in completions]

    tree = policyzoo.from_trl(GRPOConfig(output_dir=str(tmp_path / "out"), loss_type="dr_grpo", beta=0.0,
                                         learning_rate=3e-6, max_steps=4, num_generations=4,
                                         per_device_train_batch_size=4, use_cpu=True, report_to=[]))
    config = build_config(config=tree, rewards=[brevity], **{"train.lr": 1e-5})  # an override wins
    assert config.train.lr == 1e-5 and config.train.steps == 4 and config.train.prompts_per_step == 1
    assert config.output_dir == str(tmp_path / "out")
    assert config.algorithm["reduce"] == {"use": "token_sum_norm", "constant": 512.0}  # max_completion_length
    assert config.rewards[0]["use"] == "function"
