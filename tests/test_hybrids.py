"""Hybrids: a zoo bundle with one slot swapped, written in YAML or in Python, resolved through
assembly and trained on the bandit through the real step. Contrib parts included."""

import math

import pytest
import yaml

from policyzoo import ConfigError, assemble, resolve_algorithm, use
from policyzoo.catalog import load_catalog
from policyzoo.testing.training import tiny_run
from policyzoo.zoo.dapo import BUNDLE as DAPO
from policyzoo.zoo.grpo import BUNDLE as GRPO

CATALOG = load_catalog(autoload=True, allow=["policyzoo-sapo", "policyzoo-tis"])

YAML = """
algorithm:
  base: grpo
  clip: {use: cispo, eps_high: 5.0}
"""


def _components(run):
    return {slot: [(type(c), c.params) for c in (v if isinstance(v, list) else [v] if v else [])]
            for slot, v in ((s, getattr(run, s)) for s in run.bundle.slots())}


def test_yaml_and_python_hybrids_are_the_same_run():
    from_yaml = resolve_algorithm(yaml.safe_load(YAML)["algorithm"], CATALOG)
    from_python = GRPO.replace(clip=use("cispo", eps_high=5.0))
    assert from_yaml == from_python
    assert from_yaml.clip == use("cispo", eps_high=5.0) and from_yaml.parent == "grpo"
    # every other slot is GRPO's, including the k3 KL in the loss
    for slot in ("sample", "baseline", "ratio", "kl", "reduce", "reward", "filter"):
        assert getattr(from_yaml, slot) == getattr(GRPO, slot), slot
    assert _components(assemble(from_yaml, catalog=CATALOG)) == _components(assemble(from_python, catalog=CATALOG))


def test_parameter_override_keeps_the_component_and_its_other_parameters():
    b = resolve_algorithm({"base": "grpo", "clip": {"eps_high": 0.28}}, CATALOG)
    assert b.clip == use("ppo_clip", eps_low=0.2, eps_high=0.28)
    run = assemble(b, catalog=CATALOG)
    assert (run.clip.params.eps_low, run.clip.params.eps_high) == (0.2, 0.28)


def test_kl_null_removes_the_reference_model():
    b = resolve_algorithm({"base": "grpo", "kl": None}, CATALOG)
    assert b.kl is None and assemble(b, catalog=CATALOG).kl is None


def test_hybrids_with_contrib_parts_name_their_sources():
    run = assemble({"base": "sapo", "ratio": {"use": "geo_tis", "cap": 3.0}}, catalog=CATALOG)
    assert run.sources["clip"].startswith("sapo from policyzoo-sapo 0.1.0")
    assert run.sources["ratio"].startswith("geo_tis from policyzoo-tis 0.2.0")
    assert run.sources["baseline"].startswith("group_norm from policyzoo 0.1.0")
    b = DAPO.replace(ratio=use("tis", placement="ratio"))
    with pytest.warns(UserWarning, match="acts on r x w"):  # cap 2 (the default) > 1 + DAPO's 0.28
        assert assemble(b, catalog=CATALOG).ratio.params.cap == 2.0


def test_a_misspelled_or_misplaced_part_is_a_config_error():
    with pytest.raises(ConfigError, match="did you mean 'sapo'"):
        assemble({"base": "grpo", "clip": {"use": "sapoo"}}, catalog=CATALOG)
    with pytest.raises(ConfigError, match="'sapo' is a clip component"):
        assemble({"base": "grpo", "ratio": {"use": "sapo"}}, catalog=CATALOG)
    with pytest.raises(ConfigError, match="tau_pos"):
        assemble({"base": "grpo", "clip": {"use": "sapo", "tau_pos": -1.0}}, catalog=CATALOG)


def test_a_hybrid_the_components_reject_fails_before_training():
    # GSPO's sequence ratio under GMPO, which averages the token log-ratios itself: the clip's check explains why
    with pytest.raises(ConfigError, match="sequence-level ratio"):
        assemble({"base": "grpo", "ratio": {"use": "sequence"}, "clip": {"use": "gmpo"}}, catalog=CATALOG)


@pytest.mark.parametrize("algorithm", [
    {"base": "grpo", "clip": {"use": "cispo", "eps_high": 5.0}},
    {"base": "grpo", "clip": {"use": "sapo"}},
    {"base": "dapo", "ratio": {"use": "tis", "cap": 1.28}},
    {"base": "rloo", "ratio": {"use": "tis"}},
    {"base": "sapo", "ratio": {"use": "tis", "level": "token"}},
    {"base": "grpo", "ratio": {"use": "geo_tis", "placement": "ratio", "cap": 1.2}},
    "sapo",
], ids=str)
def test_hybrid_trains_two_steps_on_the_bandit(algorithm):
    result = tiny_run(algorithm, steps=2, catalog=_bandit_catalog())
    assert len(result.history) == 2 and result.weights_changed
    assert all(math.isfinite(h["loss"]) for h in result.history)


def test_soft_gate_hybrid_learns():
    # 4 questions x 4 candidates with 1 right: accuracy starts at 1/4 under uniform logits.
    result = tiny_run({"base": "grpo", "clip": {"use": "sapo"}, "kl": None}, steps=40, catalog=_bandit_catalog())
    assert result.history[0]["accuracy"] < 0.4 and result.history[-1]["accuracy"] > 0.8


def _bandit_catalog():
    import policyzoo.testing.bandit

    return load_catalog(autoload=True, allow=["policyzoo-sapo", "policyzoo-tis"], extra=[policyzoo.testing.bandit])
