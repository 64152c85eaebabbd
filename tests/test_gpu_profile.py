"""The GPU profile and the start-up fit check, proven on this CPU machine: a run resolved for a CUDA device
(``torch.cuda`` monkeypatched, or ``engine.plan_gpu`` for a dry run) takes the profile's defaults, builds the
DeepSpeed config and vLLM's arguments from them, and is refused before any weights load when its step does not
fit; the CPU defaults stay as they are; a launcher that binds one GPU per task gets ``cuda:0``.
The 7B model is a *shape*: a folder with Qwen2.5-7B's config.json and a byte-level tokenizer (no weights load)."""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
import types
from pathlib import Path

import pytest
import torch

from policyzoo.cli import main
from policyzoo.engine import device
from policyzoo.engine.rollout.vllm_options import llm_kwargs
from policyzoo.engine.run import gpu_fit, gpu_profile
from policyzoo.engine.run.checks import check_ranks
from policyzoo.engine.run.preload import preload
from policyzoo.engine.sync import Sleeper
from policyzoo.engine.trainer.dsconfig import ds_config, merge, read_user_config
from policyzoo.errors import ConfigError
from policyzoo.plan import GiB
from policyzoo.plan.gpu import per_gpu
from policyzoo.plan.shapes import shape_config
from policyzoo.resolve import resolve_algorithm
from policyzoo.run_config import load_config

ROOT = Path(__file__).resolve().parents[1]
H100 = 81559 * 2**20  # nvidia-smi's memory.total of an H100 80GB HBM3, MiB -> bytes (plan/gpu.py GPUS)


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory) -> Path:
    """A model folder of Qwen2.5-7B's shape: its config.json, a byte-level tokenizer, an empty weights file
    (the pre-load checks look for one; nothing loads it)."""
    from policyzoo.testing.tiny import build_tokenizer

    folder = tmp_path_factory.mktemp("qwen2.5-7b")
    cfg, _ = shape_config("qwen2.5-7b")
    cfg = {**cfg, "architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 32768}
    (folder / "config.json").write_text(json.dumps(cfg))
    build_tokenizer(folder)
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch sees 8 CUDA GPUs of an H100's memory; nothing else of torch.cuda is used by the checks."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(total_memory=H100, name="NVIDIA H100 80GB HBM3"))


# ----------------------------------------------------------------------------- devices
@pytest.mark.parametrize("count,local,expected", [(8, 3, 3), (1, 3, 0), (2, 3, 0), (4, 0, 0)])
def test_a_launcher_that_binds_one_gpu_per_task_gets_cuda_0(monkeypatch, count, local, expected):
    # torchrun on a node of 8: cuda:LOCAL_RANK; Slurm's --gpus-per-task=1 (one visible GPU): cuda:0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setenv("LOCAL_RANK", str(local))
    monkeypatch.delenv(device.LAUNCHER_LOCAL_RANK, raising=False)
    assert device.local_device() == torch.device("cuda", expected)
    assert device.bind_visible_gpu() is (expected != local)
    # after binding, DeepSpeed and vLLM read LOCAL_RANK = the visible GPU's index; the launcher's value is kept
    import os

    assert os.environ["LOCAL_RANK"] == str(expected)
    assert os.environ.get(device.LAUNCHER_LOCAL_RANK) == (str(local) if expected != local else None)


def test_gpus_torch_cannot_see_are_refused_with_the_wheel_to_install(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device, "nvidia_present", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ConfigError) as e:
        device.check_gpu_visible()
    text = str(e.value)
    assert "built for CUDA 13.0" in text and "R580" in text and "whl/cu126" in text and "vLLM's wheel pins" in text
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build of torch on a GPU machine
    with pytest.raises(ConfigError, match="CPU-only build"):
        device.check_gpu_visible()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # GPUs hidden on purpose: no refusal
    device.check_gpu_visible()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(device, "nvidia_present", lambda: False)  # no NVIDIA driver: a CPU machine
    device.check_gpu_visible()


@pytest.mark.parametrize("prompts,ranks,fix", [(4, 8, "use 8 or 16"), (12, 8, "use 8 or 16"), (20, 8, "use 16 or 24"),
                                               (3, 2, "use 2 or 4")])
def test_prompts_not_divisible_by_the_ranks_name_the_nearest_multiples(prompts, ranks, fix):
    # 4 // 8 * 8 = 0: none below, so the first two multiples 8, 16; 12 // 8 * 8 = 8 and 16; 20: 16 and 24
    with pytest.raises(ConfigError, match=fix):
        check_ranks(prompts, ranks)
    check_ranks(2 * ranks, ranks)


# ----------------------------------------------------------------------------- the profile's device choices
def test_cpu_defaults_are_untouched():
    config = load_config(None, "grpo", [])
    before = config.model_dump()
    assert gpu_profile.apply_device(config) == []
    assert config.model_dump() == before
    assert (config.model.dtype, config.engine.zero_stage, config.engine.vllm_sleep, config.engine.sync_check,
            config.train.tf32, config.engine.gpu_memory_utilization) == ("float32", 0, 0, False, None, 0.3)


def test_on_cuda_every_free_key_takes_the_profile_and_builds_the_deepspeed_config(fake_gpu):
    config = load_config(None, "grpo", [])
    chosen = {c.key: c.value for c in gpu_profile.apply_device(config)}
    assert chosen == {"engine.zero_stage": 1, "model.dtype": "bfloat16",
                      "engine.deepspeed": {"data_types": {"grad_accum_dtype": "fp32"},
                                           "communication_data_type": "fp32"},
                      "train.tf32": True, "engine.vllm_sleep": 2, "engine.sync_check": True,
                      "engine.sync_tolerance": 1.5, "algorithm.ratio": "tis"}
    assert resolve_algorithm(config.algorithm).ratio.name == "tis"
    # the DeepSpeed config the trainer builds: policyzoo's with the profile's keys merged as a user's would be
    cfg = merge(ds_config(config.engine.zero_stage, 1e-6, 0.0, 1.0, config.model.dtype),
                read_user_config(config.engine.deepspeed))
    assert cfg["bf16"] == {"enabled": True} and cfg["zero_optimization"] == {"stage": 1}
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["communication_data_type"] == "fp32"


def test_keys_the_config_sets_win_over_the_profile(fake_gpu):
    config = load_config(None, "grpo", ["engine.zero_stage=0", "engine.vllm_sleep=1", "engine.sync_check=false",
                                        "engine.deepspeed={communication_data_type: bf16}", "train.tf32=false"])
    chosen = {c.key: c.value for c in gpu_profile.apply_device(config)}
    # ZeRO 0 kept: DeepSpeed's bf16 needs ZeRO >= 1, so bf16 compute comes from autocast over fp32 weights
    assert chosen == {"train.autocast": True, "algorithm.ratio": "tis"}
    assert (config.model.dtype, config.engine.vllm_sleep, config.engine.sync_check, config.train.tf32) == \
        ("float32", 1, False, False)
    bf16 = load_config(None, "grpo", ["model.dtype=bfloat16", "engine.zero_stage=2",
                                      "engine.deepspeed={communication_data_type: bf16}"])
    chosen = {c.key: c.value for c in gpu_profile.apply_device(bf16)}
    assert chosen["engine.deepspeed"] == {"data_types": {"grad_accum_dtype": "fp32"},
                                          "communication_data_type": "bf16"}  # the user's key kept
    assert "model.dtype" not in chosen and "engine.zero_stage" not in chosen
    trl = load_config(None, "grpo", ["train.autocast=true"])  # a ported TRL config's bf16: true
    chosen = {c.key for c in gpu_profile.apply_device(trl)}
    assert "model.dtype" not in chosen and "engine.zero_stage" not in chosen and trl.model.dtype == "float32"


def test_a_bundles_own_ratio_and_overlap_keep_theirs(fake_gpu):
    gspo = load_config(None, "gspo", [])
    chosen = {c.key for c in gpu_profile.apply_device(gspo)}
    assert "algorithm.ratio" not in chosen and resolve_algorithm(gspo.algorithm).ratio.name == "sequence"
    overlap = load_config(None, "grpo", ["engine.overlap=one_step"])  # vLLM samples while training: no sleep
    assert "engine.vllm_sleep" not in {c.key for c in gpu_profile.apply_device(overlap)}
    assert overlap.engine.vllm_sleep == 0


# ----------------------------------------------------------------------------- the plan's choices and the fit
def test_utilization_is_what_the_trainer_leaves_rounded_down():
    # sleep mode: (100 GiB - (10 + 20 + 7) GiB resident - 3 GiB headroom) / 100 GiB = 0.60; activations and
    # vLLM's parts are not resident while vLLM samples
    parts = {"policy weights": 10 * GiB, "optimizer": 20 * GiB, "reference": 7 * GiB, "activations": 50 * GiB,
             "vLLM copy": 14 * GiB, "KV cache": 2 * GiB}
    assert gpu_fit._utilization(parts, 100 * GiB, sleep=2) == 0.60
    # without sleep: vLLM's copy + KV cache, 16 of 100 GiB, rounded up: 0.16; at most 0.9
    assert gpu_fit._utilization(parts, 100 * GiB, sleep=0) == 0.16
    assert gpu_fit._utilization({"policy weights": GiB}, 100 * GiB, sleep=2) == 0.9


def _step(config, prompt_lengths, world=8):
    run_bundle = resolve_algorithm(config.algorithm)
    from policyzoo.assembly import Run

    run = Run(run_bundle)
    model_cfg, _ = shape_config("qwen2.5-7b")
    return gpu_fit.make_step(config, run, model_cfg, prompt_lengths, world, config.engine.zero_stage)


def test_the_plan_chooses_the_smallest_activation_change_and_vllms_limits(monkeypatch):
    # P=64 prompts x G=8 x L=1024 on 8 H100s at ZeRO 3: the step (354 GiB of activations in fp32)
    config = load_config(None, "grpo", ["engine.zero_stage=3", "train.prompts_per_step=64",
                                        "algorithm.sample.max_tokens=1024", "engine.plan_gpu=h100-80gb"])
    gpu_profile.apply_device(config)
    step = _step(config, [100, 300])  # mean 200 prompt tokens per row, longest 300
    assert step.budget == H100 and step.sizes.prompt == 200
    assert step.problem(config) is not None  # as given it does not fit
    chosen, lines = gpu_fit.plan_and_check(config, step)
    keys = {c.key: c.value for c in chosen}
    assert keys["train.gradient_checkpointing"] is True
    k = keys.get("train.max_tokens_per_micro_batch")
    assert step.problem(config) is None and lines[0].endswith("(h100-80gb): fits")
    if k is not None:  # checkpointing alone did not fit, and k is the largest power of two that does: twice as
        # many tokens per micro-batch does not fit
        assert step.problem(gpu_fit._with(config, max_tokens_per_micro_batch=None))
        assert k & (k - 1) == 0 and step.problem(gpu_fit._with(config, max_tokens_per_micro_batch=2 * k))
    # vLLM: 64 / 8 = 8 prompts x 8 samples = 64 rows per engine; 8 prompts x 300 tokens = 2400, rounded up to
    # 256: 2560 (within 2048-16384)
    assert keys["engine.vllm_max_num_seqs"] == 64 and keys["engine.vllm_max_num_batched_tokens"] == 2560
    # utilization: the budget less the trainer's resident parts and 3 GiB, rounded down to 0.01
    parts = per_gpu(step.shape, step.sizes, gpu_fit._options(config, step.run, step.shape, 8), step.place,
                    H100)["trainer GPU"]
    resident = sum(v for p, v in parts.items() if p not in gpu_fit.VLLM_PARTS and p != "activations")
    assert keys["engine.gpu_memory_utilization"] == math.floor(100 * (H100 - resident - 3 * GiB) / H100) / 100


def test_a_step_that_cannot_fit_is_refused_with_the_change_that_would(monkeypatch):
    config = load_config(None, "grpo", ["engine.zero_stage=3", "train.prompts_per_step=64",
                                        "algorithm.sample.max_tokens=1024", "engine.plan_gpu=h100-80gb",
                                        "train.gradient_checkpointing=false", "train.micro_batches=1"])
    gpu_profile.apply_device(config)
    step = _step(config, [100, 300])
    with pytest.raises(ConfigError) as e:
        gpu_fit.plan_and_check(config, step)
    assert "more than the 79.6 GiB of one h100-80gb" in str(e.value)  # 81559 MiB / 1024 = 79.65 GiB
    assert "fix: train.gradient_checkpointing=true" in str(e.value)


# ----------------------------------------------------------------------------- vLLM as the profile starts it
def test_vllm_starts_with_the_profiles_arguments_and_sleeps_at_level_2(fake_gpu, monkeypatch, tmp_path):
    from policyzoo.engine.rollout.vllm_engine import VLLMRollout

    config = load_config(None, "grpo", ["engine.zero_stage=3", "train.prompts_per_step=64"])
    gpu_profile.apply_device(config)
    gpu_fit.plan_and_check(config, _step(config, [100, 300]))
    e = config.engine
    started = []

    class FakeLLM:
        def __init__(self, model, **kwargs):
            started.append(kwargs)

        def collective_rpc(self, fn):
            return [fn(types.SimpleNamespace(available_kv_cache_memory_bytes=2**30))]

    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    limits = {"max_num_seqs": e.vllm_max_num_seqs, "max_num_batched_tokens": e.vllm_max_num_batched_tokens}
    r = VLLMRollout(types.SimpleNamespace(path=tmp_path, tokenizer=None), config.model.dtype, 1400, 0,
                    e.gpu_memory_utilization, e.vllm_sleep, limits=limits)
    assert started[0] == llm_kwargs(on_cuda=True, dtype="bfloat16", max_model_len=1400, seed=0,
                                    tokenizer=str(tmp_path), gpu_memory_utilization=e.gpu_memory_utilization,
                                    sleep_level=2, **limits)
    assert started[0]["enable_sleep_mode"] is True and started[0]["max_num_seqs"] == 64
    assert started[0]["distributed_executor_backend"] == "external_launcher" and r.sleeper.level == 2
    calls = []
    llm = types.SimpleNamespace(sleep=lambda level: calls.append(f"sleep({level})"),
                                wake_up=lambda tags: calls.append(f"wake({tags[0]})"))
    s = Sleeper(llm, config.engine.vllm_sleep, release=lambda: calls.append("empty_cache"))
    s.for_sampling(), s.for_training(), s.for_push(), s.for_sampling()  # sample, train, push, sample
    assert calls == ["sleep(2)", "empty_cache", "wake(weights)", "wake(kv_cache)"]


# ----------------------------------------------------------------------------- docs/usage.md's recipes, dry runs
def _usage_recipes() -> list[list[str]]:
    text = (ROOT / "docs" / "usage.md").read_text()
    para = text[text.index("**On GPUs**"):text.index("**Rollout on its own GPUs or nodes**")]
    return [shlex.split(cmd) for cmd in re.findall(r"`(torchrun [^`]+)`", para)]


def _dry_run(argv, world, model, tmp_path, monkeypatch, capsys, extra=()):
    """docs/usage.md's ``torchrun ... -m policyzoo.cli ARGS`` as a dry run of ``world`` ranks on the 7B shape."""
    args = argv[argv.index("policyzoo.cli") + 1:]
    args = [f"model.path={model}" if a.startswith("model.path=") else a for a in args]
    monkeypatch.setenv("WORLD_SIZE", str(world))
    code = main([*args, "--dry-run", "--output-dir", str(tmp_path / "run"), "engine.plan_gpu=h100-80gb", *extra])
    return code, capsys.readouterr().err


def test_usage_recipes_fit_8_and_16_h100s(qwen7b, tmp_path, monkeypatch, capsys):
    one, two = _usage_recipes()
    assert "--nproc_per_node" in one and "--nnodes" in two
    for argv, world in ((one, 8), (two, 16)):
        p = next(a for a in argv if a.startswith("train.prompts_per_step="))
        assert int(p.split("=")[1]) % world == 0 and "engine.vllm_sleep=1" not in argv
        code, err = _dry_run(argv, world, qwen7b, tmp_path, monkeypatch, capsys)
        assert code == 0, err
        assert f"plan: {world} trainer GPUs colocated with TP 1 (ZeRO 3): " in err and "(h100-80gb): fits" in err
        assert "GPU profile: model.dtype=bfloat16" in err and "GPU profile: engine.vllm_sleep=2" in err


def test_the_old_recipe_is_refused_with_the_fix(qwen7b, tmp_path, monkeypatch, capsys):
    old = shlex.split("torchrun --nproc_per_node 8 -m policyzoo.cli train --algo grpo model.path=M "
                      "model.dtype=bfloat16 engine.zero_stage=3 engine.vllm_sleep=1")
    code, err = _dry_run(old, 8, qwen7b, tmp_path, monkeypatch, capsys)  # train.prompts_per_step's default 4
    assert code == 2 and "use 8 or 16" in err
    code, err = _dry_run(old, 8, qwen7b, tmp_path, monkeypatch, capsys, ["train.prompts_per_step=64",
                         "algorithm.sample.max_tokens=1024", "train.gradient_checkpointing=false",
                         "train.micro_batches=1"])
    assert code == 2 and "more than the 79.6 GiB" in err and "fix: train.gradient_checkpointing=true" in err


def test_a_dry_run_records_the_profile_and_plans_with_torchs_gpu_memory(qwen7b, fake_gpu, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    config = load_config(None, "grpo", [f"model.path={qwen7b}", "train.prompts_per_step=64", "engine.zero_stage=3"])
    pre = preload(config, dry_run=True)
    assert pre.resolved["gpu_profile"]["model.dtype"]["value"] == "bfloat16"
    assert pre.resolved["engine"]["vllm_sleep"] == 2 and pre.resolved["train"]["tf32"] is True
    assert pre.plan_lines[0].endswith(f"GiB of {H100 / GiB:.1f} GiB per GPU (NVIDIA H100 80GB HBM3): fits")
    # the line names the phase it sums (the training step's peak) and what it holds at once
    assert ": the training step's peak, the trainer's state and the training step's activations, with vLLM's " \
           "copy and KV cache counted as held at once" in pre.plan_lines[0]


def test_a_real_run_of_a_planned_gpu_on_a_cpu_is_refused(monkeypatch):
    # engine.plan_gpu is for dry runs: a run would train the GPU profile (bf16, sleep mode) on the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = load_config(None, "grpo", ["engine.plan_gpu=h100-80gb"])
    with pytest.raises(ConfigError, match="torch sees no CUDA GPU"):
        gpu_profile.check_planned_gpu(config)
    gpu_profile.check_planned_gpu(load_config(None, "grpo", []))  # no plan_gpu: nothing to refuse


def test_vllms_batch_limits_are_checked_against_the_context_and_the_sequences():
    e = load_config(None, "grpo", ["engine.vllm_max_num_batched_tokens=512", "engine.vllm_max_num_seqs=64"]).engine
    with pytest.raises(ConfigError, match="less than this run's 1024-token context"):
        gpu_fit.check_vllm_limits(e, 1024, on_gpu=False)  # CPU: no chunked prefill, 512 < 1024
    gpu_fit.check_vllm_limits(e, 1024, on_gpu=True)  # GPU: prefills are chunked; 512 >= 64 sequences
    few = load_config(None, "grpo", ["engine.vllm_max_num_batched_tokens=32", "engine.vllm_max_num_seqs=64"]).engine
    with pytest.raises(ConfigError, match="less than engine.vllm_max_num_seqs=64"):
        gpu_fit.check_vllm_limits(few, 16, on_gpu=True)  # 32 tokens < 64 sequences
    gpu_fit.check_vllm_limits(load_config(None, "grpo", []).engine, 1024, on_gpu=False)  # null: vLLM's defaults


def test_tf32_is_switched_on_only_on_cuda(monkeypatch):
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        config = load_config(None, "grpo", ["train.tf32=true"])
        assert gpu_profile.set_tf32(config) is False  # CPU: nothing to switch
        assert torch.backends.cuda.matmul.allow_tf32 is False
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert gpu_profile.set_tf32(config) is True
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
        assert gpu_profile.set_tf32(load_config(None, "grpo", [])) is False  # null: left as it is
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_a_fix_with_a_token_budget_drops_a_count_of_micro_batches():
    # the two cannot both be set (rules.py): the advice sets train.micro_batches=1 with the token budget.
    # 2048-token answers: checkpointing with 2 micro-batches of whole rows is not enough there (at 1024 it is)
    config = load_config(None, "grpo", ["engine.zero_stage=3", "train.prompts_per_step=64",
                                        "algorithm.sample.max_tokens=2048", "engine.plan_gpu=h100-80gb",
                                        "train.gradient_checkpointing=false", "train.micro_batches=2"])
    gpu_profile.apply_device(config)
    with pytest.raises(ConfigError) as e:
        gpu_fit.plan_and_check(config, _step(config, [100, 300]))
    assert re.search(r"fix: train.gradient_checkpointing=true train.max_tokens_per_micro_batch=\d+ "
                     r"train.micro_batches=1", str(e.value)), str(e.value)
