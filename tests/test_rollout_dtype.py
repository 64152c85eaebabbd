"""engine.rollout_dtype: a bf16 rollout with fp32 training turns on a mismatch correction (the
ratio ``engine.rollout_correction``, TIS by default) unless the algorithm sets its own ratio, and
the sync check then needs a tolerance chosen for it."""

from __future__ import annotations

import pytest

from policyzoo.assembly import Run, resolve_algorithm
from policyzoo.config import load_config
from policyzoo.errors import ConfigError

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


def test_sync_check_needs_a_tolerance_chosen_for_the_mismatch():
    with pytest.raises(ConfigError, match="sync_tolerance"):
        load_config(overrides=[BF16, "engine.sync_check=true"])
    assert load_config(overrides=[BF16, "engine.sync_check=true", "engine.sync_tolerance=0.1"]).engine.sync_check


def test_unknown_rollout_dtype_is_refused():
    with pytest.raises(ConfigError):
        load_config(overrides=["engine.rollout_dtype=float16"])
