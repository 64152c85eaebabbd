"""engine.rollout_dtype: a bf16 rollout with fp32 training turns on a mismatch correction (the
ratio ``engine.rollout_correction``, TIS by default) unless the algorithm sets its own ratio, and
the sync check takes bf16's tolerance; ``auto`` chooses bf16 on CPUs with bf16 instructions."""

from __future__ import annotations

import pytest

from policyzoo import native_bf16
from policyzoo.assembly import Run
from policyzoo.engine.sync import SYNC_TOLERANCE, sync_mean_tolerance, sync_tolerance
from policyzoo.errors import ConfigError
from policyzoo.resolve import resolve_algorithm
from policyzoo.run_config import load_config

BF16 = "engine.rollout_dtype=bfloat16"


def _ratio(cfg) -> str:
    return Run(resolve_algorithm(cfg.algorithm)).ratio.name


def test_default_off_and_same_dtype_changes_nothing():
    assert load_config().algorithm == "grpo" and _ratio(load_config()) == "token"  # GRPO's plain token ratio
    assert load_config(overrides=["engine.rollout_dtype=float32"]).algorithm == "grpo"  # model.dtype float32


def test_bf16_rollout_turns_tis_on_for_a_bundle_and_keeps_its_other_slots():
    cfg = load_config(algo="dapo", overrides=[BF16])
    assert cfg.algorithm == {"base": "dapo", "ratio": {"use": "tis"}} and _ratio(cfg) == "tis"
    cfg = load_config(overrides=[BF16, "algorithm.clip.use=cispo"])
    assert _ratio(cfg) == "tis" and Run(resolve_algorithm(cfg.algorithm)).clip.name == "cispo"


def test_the_algorithms_own_ratio_and_a_null_correction_are_kept():
    assert _ratio(load_config(overrides=[BF16, "algorithm.ratio.use=mis", "algorithm.ratio.high=2.0"])) == "mis"
    assert _ratio(load_config(overrides=[BF16, "engine.rollout_correction=icepop"])) == "icepop"
    assert load_config(overrides=[BF16, "engine.rollout_correction=null"]).algorithm == "grpo"


def test_sync_check_of_a_bf16_sampler_takes_the_bf16_tolerance():
    # the trainer's fp32 against the sampler's bf16: the less precise dtype's defaults, max 1.5 and mean 0.12 nats
    assert load_config(overrides=[BF16, "engine.sync_check=true"]).engine.sync_check
    assert sync_tolerance("float32", None, "bfloat16") == SYNC_TOLERANCE["float32+bfloat16"] == 1.5
    assert sync_tolerance("bfloat16", None, "bfloat16") == 0.25  # bf16 on both sides: the bf16 trainer's
    assert sync_mean_tolerance("float32", None, "bfloat16") == 0.12
    assert sync_tolerance("float32", None, "float32") == sync_mean_tolerance("float32", None, "float32") == 1e-3
    assert sync_tolerance("float32", 0.5, "bfloat16") == sync_mean_tolerance("float32", 0.5, "bfloat16") == 0.5


def _cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
    native_bf16._cpu_has_bf16.cache_clear()
    return str(path)


def test_the_cpu_probe_reads_the_bf16_flags(tmp_path):
    assert native_bf16._cpu_has_bf16(_cpuinfo(tmp_path, "avx2 avx512f amx_bf16 amx_tile"))  # Sapphire Rapids
    assert native_bf16._cpu_has_bf16(_cpuinfo(tmp_path, "avx2 avx512f avx512_bf16"))  # Zen 4, Cooper Lake
    assert not native_bf16._cpu_has_bf16(_cpuinfo(tmp_path, "avx2 fma"))  # an AVX2-only EPYC
    assert not native_bf16._cpu_has_bf16(str(tmp_path / "missing"))
    native_bf16._cpu_has_bf16.cache_clear()


def test_auto_samples_in_bf16_only_for_an_fp32_vllm_trainer_on_a_bf16_cpu(monkeypatch):
    monkeypatch.setenv("POLICYZOO_NATIVE_BF16", "1")
    cfg = load_config(overrides=["engine.rollout_dtype=auto"])
    assert cfg.engine.rollout_dtype == "bfloat16" and _ratio(cfg) == "tis"  # the correction comes with it
    assert load_config(overrides=["engine.rollout_dtype=auto", "engine.rollout=transformers"]).engine.rollout_dtype \
        == "float32"
    same = load_config(overrides=["engine.rollout_dtype=auto", "model.dtype=bfloat16", "engine.zero_stage=1"])
    assert same.engine.rollout_dtype == "bfloat16" and same.algorithm == "grpo"  # as trained: no correction
    monkeypatch.setenv("POLICYZOO_NATIVE_BF16", "0")
    cfg = load_config(overrides=["engine.rollout_dtype=auto"])
    assert cfg.engine.rollout_dtype == "float32" and cfg.algorithm == "grpo"


def test_unknown_rollout_dtype_is_refused():
    with pytest.raises(ConfigError):
        load_config(overrides=["engine.rollout_dtype=float16"])


@pytest.mark.parametrize("value, chosen", [("yes", "bfloat16"), ("ON", "bfloat16"), ("false", "float32"),
                                           ("off", "float32")])
def test_the_switch_takes_the_usual_spellings(monkeypatch, value, chosen):
    monkeypatch.setenv("POLICYZOO_NATIVE_BF16", value)
    assert load_config(overrides=["engine.rollout_dtype=auto"]).engine.rollout_dtype == chosen


def test_an_unreadable_switch_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("POLICYZOO_NATIVE_BF16", "2")
    with pytest.raises(ConfigError, match="POLICYZOO_NATIVE_BF16") as e:
        load_config(overrides=["engine.rollout_dtype=auto"])
    assert "set it to 1 or 0" in str(e.value)


def test_auto_says_what_it_chose_and_why(monkeypatch):
    auto = "engine.rollout_dtype=auto"
    monkeypatch.delenv("POLICYZOO_NATIVE_BF16")
    monkeypatch.setattr(native_bf16, "_cpu_has_bf16", lambda: ("amx_bf16",))
    assert native_bf16.rollout_dtype_notes(load_config(overrides=[auto])) == [
        "rollout dtype: bfloat16 (engine.rollout_dtype auto: this CPU has AMX-BF16)"]
    monkeypatch.setattr(native_bf16, "_cpu_has_bf16", lambda: ())
    assert native_bf16.rollout_dtype_notes(load_config(overrides=[auto])) == [
        "rollout dtype: float32 (engine.rollout_dtype auto: no bf16 instructions on this CPU)"]
    assert native_bf16.rollout_dtype_notes(load_config(overrides=[auto, "engine.rollout=transformers"])) == [
        "rollout dtype: float32 (engine.rollout_dtype auto: bf16 only for the trainer's own vLLM engine, and "
        "engine.rollout is transformers)"]
    monkeypatch.setenv("POLICYZOO_NATIVE_BF16", "1")
    assert native_bf16.rollout_dtype_notes(load_config(overrides=[auto])) == [
        "rollout dtype: bfloat16 (engine.rollout_dtype auto: POLICYZOO_NATIVE_BF16=1)"]
    head = "engine.fp32_lm_head=true"
    assert native_bf16.rollout_dtype_notes(load_config(overrides=[auto, head])) == [
        "rollout dtype: bfloat16 (engine.rollout_dtype auto: POLICYZOO_NATIVE_BF16=1)"]  # the head does its work
    monkeypatch.setenv("POLICYZOO_NATIVE_BF16", "0")
    assert native_bf16.rollout_dtype_notes(load_config(overrides=[auto, head])) == [
        "rollout dtype: float32 (engine.rollout_dtype auto: POLICYZOO_NATIVE_BF16=0)",
        "engine.fp32_lm_head is idle: auto sampled in float32, whose logits are fp32 already (it takes effect where "
        "auto chooses bfloat16)"]
    assert native_bf16.rollout_dtype_notes(load_config(overrides=[BF16])) == []  # a dtype named: nothing to say
    assert native_bf16.rollout_dtype_notes(load_config()) == []


def test_the_start_up_console_says_what_auto_chose(monkeypatch, tmp_path, capsys):
    from _engine_helpers import TINY_OVERRIDES, tiny_model

    from policyzoo.engine.run import train

    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(train, "setup_process", lambda *a: 1)  # the process as it is
    monkeypatch.setattr(train, "quiet_libraries", lambda *a: None)
    monkeypatch.setattr(train, "start", lambda prepared, verbose: None)  # no model loads
    monkeypatch.setattr(train, "RunLoop", lambda part, rows_drawn: None)
    cfg = load_config(None, "grpo", [f"model.path={tiny_model()}", *TINY_OVERRIDES, "engine.rollout_dtype=auto",
                                     f"output_dir={tmp_path / 'run'}"])
    train.open_run(cfg)
    err = " ".join(capsys.readouterr().err.split())
    assert "rollout dtype: float32 (engine.rollout_dtype auto: POLICYZOO_NATIVE_BF16=0)" in err
