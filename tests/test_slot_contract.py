"""The slot contract: base classes enforced by the catalog, hook results checked at the boundary,
bundle inheritance, settings that travel with their component, and metrics that mean what they say.

Step-level cases run on the bandit test bed (policyzoo.testing.bandit) with fixed prompt streams."""

import subprocess
import sys

import pytest
import torch
from pydantic import Field
from test_catalog_plugins import make_dist

from policyzoo import Bundle, Clip, Component, PluginError, Reward, Surrogate, UserError, use
from policyzoo.catalog import load_catalog
from policyzoo.cli import main as cli_main
from policyzoo.contract import LOCAL
from policyzoo.errors import ComponentError
from policyzoo.step import train_step
from policyzoo.testing import make_plugin
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ALWAYS, MIXED = 0, 1


def two_questions():
    """Question 0: both candidates right (every group constant); question 1: one right, one wrong."""
    return Bandit([[3, 5], [3, 5]], [[True, True], [True, False]], optimizer="sgd", lr=0.1)


def stream(bandit, questions):
    rows = {q: {"prompt": f"question {q}", "question": q, "scores": bandit.scores[q].tolist()} for q in (0, 1)}
    return lambda: [dict(rows[q]) for q in questions]


def catalog_with(*items):
    import policyzoo.testing.bandit as bandit_mod

    return load_catalog(autoload=False, extra=[bandit_mod, make_plugin(*items)])


# ----------------------------------------------------------------------------- the catalog refuses
class NoWeight(Component):
    """A reward that is not a policyzoo.contract.Reward (so it has no weight). Source: a test double."""

    slot, name = "reward", "no_weight"

    def reward(self, rollout):
        return torch.ones(len(rollout))


class OwnParams(Reward):
    """A Reward whose Params drops the declared weight. Source: a test double."""

    name = "own_params"

    class Params(Component.Params):
        scale: float = Field(1.0, description="a scale")

    def reward(self, rollout):
        return torch.ones(len(rollout))


class ExtraArg(Clip):
    """A clip whose hook asks for an argument the step never passes. Source: a test double."""

    name = "extra_arg"

    def clip(self, ratio, advantages, temperature):
        return Surrogate(-advantages * ratio)


@pytest.mark.parametrize("cls, why, fix", [
    (NoWeight, "does not derive from policyzoo.contract.Reward", "class NoWeight(policyzoo.contract.Reward)"),
    (OwnParams, "its Params does not extend Reward.Params (it lacks weight)", "class Params(Reward.Params)"),
    (ExtraArg, "clip() takes 'temperature', which the hook does not pass", "may take any of: ratio, advantages"),
])
def test_catalog_refuses_a_component_outside_the_contract(cls, why, fix):
    with pytest.raises(PluginError) as e:
        catalog_with(cls)
    assert why in e.value.why and fix in e.value.fix
    assert cls.__qualname__ in e.value.where  # names the class and the distribution it came from


def test_reward_plugin_without_weight_is_a_clear_cli_error(tmp_path):
    code = '''
    import torch
    from policyzoo import Component, hookimpl

    class Plain(Component):
        """A reward without the Reward base. Source: a test double."""
        slot, name = "reward", "plain"

        def reward(self, rollout):
            return torch.ones(len(rollout))

    @hookimpl
    def register_components(register):
        register(Plain)
    '''
    make_dist(tmp_path, "policyzoo-plain", "pz_plain", code)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"}
    proc = subprocess.run([sys.executable, "-m", "policyzoo.cli", "components"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error at policyzoo-plain 0.3.1 (pz_plain): Plain:" in proc.stderr
    assert "does not derive from policyzoo.contract.Reward" in proc.stderr


def test_hook_methods_need_no_decorator():
    class Undecorated(Clip):
        """-A r without @hookimpl. Source: a test double."""

        name = "undecorated"

        def clip(self, ratio, advantages):
            return Surrogate(-advantages * ratio)

    run = bandit_run({"base": "grpo", "clip": {"use": "undecorated"}}, catalog_with(Undecorated))
    assert len(run.hook.clip.get_hookimpls()) == 1


# ----------------------------------------------------------------------------- boundary checks
def _reward_returning(value_for):
    class Bad(Reward):
        """Returns a wrong shape. Source: a test double."""

        name = "bad_shape"

        def reward(self, rollout):
            return value_for(len(rollout))

    return Bad


@pytest.mark.parametrize("value_for, shown", [
    (lambda b: torch.ones(1), "a tensor of shape [1]"),
    (lambda b: torch.tensor(1.0), "a tensor of shape [] (a scalar)"),
    (lambda b: torch.ones(b - 1), "a tensor of shape [31]"),
    (lambda b: torch.ones(b, 1), "a tensor of shape [32, 1]"),
    (lambda b: [1.0] * (b + 1), "a list of 33 values"),
    (lambda b: "good", "a str"),
])
def test_reward_of_the_wrong_shape_names_the_component(value_for, shown):
    cat = catalog_with(_reward_returning(value_for))
    run = bandit_run({"base": "grpo", "reward": [{"use": "bad_shape"}]}, cat)
    bandit = two_questions()
    with pytest.raises(ComponentError) as e:  # 4 prompts x G 8 = 32 rows
        train_step(run, bandit, stream(bandit, [MIXED] * 4), seed=0, settings=step_settings(run))
    assert isinstance(e.value, UserError)  # the CLI prints it as one block, exit 2, no traceback
    assert e.value.where == "reward component bad_shape(weight=1.0)"
    assert shown in e.value.why


def test_clip_of_the_wrong_shape_names_the_component():
    class RowClip(Clip):
        """One loss per row instead of per token. Source: a test double."""

        name = "row_clip"

        def clip(self, ratio, advantages):
            return Surrogate((-advantages * ratio).sum(-1))

    run = bandit_run({"base": "grpo", "clip": {"use": "row_clip"}}, catalog_with(RowClip))
    bandit = two_questions()
    with pytest.raises(ComponentError, match=r"clip component row_clip\(\)") as e:
        train_step(run, bandit, stream(bandit, [MIXED] * 4), seed=0, settings=step_settings(run))
    assert "loss is a tensor of shape [32]" in e.value.why and "expected shape [32," in e.value.why


def test_cli_prints_a_component_error_without_traceback(monkeypatch, capsys):
    def boom(args, out):
        raise ComponentError("reward component bad_shape(weight=1.0)", "returned a tensor of shape [1] for 32 rows")

    monkeypatch.setattr("policyzoo.cli.cmd_zoo", boom)
    assert cli_main(["zoo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error at reward component bad_shape(weight=1.0):") and "Traceback" not in err


# ----------------------------------------------------------------------------- inheritance
def test_zoo_bundles_state_only_what_differs_from_their_parent():
    import policyzoo.zoo as zoo

    cat = load_catalog(autoload=False)
    children = [m.BUNDLE for m in zoo.MODULES if m.BUNDLE.parent]
    assert {b.name for b in children} == {"cispo", "dapo", "dr_grpo", "gspo", "reinforce_pp", "luspo", "gmpo", "dppo",
                                          "clip_cov", "kl_cov", "reinforce_pp_baseline", "gpg", "gdpo", "remax",
                                          "opo", "distill"}
    for raw in children:
        parent = cat.bundle(raw.parent)
        for slot, mine in raw.slots().items():
            assert repr(mine) == "INHERIT" or mine != getattr(parent, slot), f"{raw.name}.{slot} repeats its parent"


def test_inherited_slots_equal_the_parent_and_params_merge():
    cat = load_catalog(autoload=False)
    dapo, grpo = cat.bundle("dapo"), cat.bundle("grpo")
    assert dapo.inherited == {"sample", "env", "baseline", "ratio", "term"}  # env, term: grpo has none, nor has dapo
    assert (dapo.sample, dapo.env, dapo.baseline, dapo.ratio) == (grpo.sample, None, grpo.baseline, grpo.ratio)
    # dapo states clip=use("ppo_clip", eps_high=0.28): grpo's eps_low 0.2 is kept
    assert dapo.clip == use("ppo_clip", eps_low=0.2, eps_high=0.28) and dapo.kl is None


def test_explain_marks_inherited_slots(capsys):
    assert cli_main(["explain", "dapo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    slot_line = {line.split()[0]: line for line in lines if line.startswith("  ") and not line.startswith("   ")}
    for slot in ("sample", "baseline", "ratio"):
        assert slot_line[slot].endswith("(inherited from grpo)")
    for slot in ("clip", "reduce", "filter", "reward", "kl"):
        assert "inherited" not in slot_line[slot]


@pytest.mark.parametrize("bundle, why", [
    (Bundle(name="orphan", parent="gpro", clip=use("none")), "parent 'gpro' is not a registered algorithm "
                                                              "(did you mean 'grpo'"),  # a swap: distance 1
    (Bundle(name="rootless", clip=use("none")), "the bundle states no sample component and has no parent"),
])
def test_bundle_inheritance_errors(bundle, why):
    with pytest.raises(PluginError) as e:
        catalog_with(bundle)
    assert why in e.value.why


def test_bundle_parent_cycle_is_refused():
    a = Bundle(name="cyc_a", parent="cyc_b", clip=use("none"))
    b = Bundle(name="cyc_b", parent="cyc_a", reduce=use("token_mean"))
    with pytest.raises(PluginError, match="cycle: cyc_a -> cyc_b -> cyc_a|cycle: cyc_b -> cyc_a -> cyc_b"):
        catalog_with(a, b)


# ----------------------------------------------------------------------------- settings travel
def test_rloo_with_dapos_resampling_filter_resamples(catalog):
    # rloo (G = 8 here) + nonconstant_groups: the filter brings its own budget (3 rounds).
    # 4 prompts x 8 = 32 target rows; per round the 2 MIXED groups (16 rows) are kept and the 2
    # ALWAYS groups dropped: round 1 keeps 16 < 32, round 2 reaches 32 -> 2 rounds, 64 rows sampled.
    run = bandit_run({"base": "rloo", "sample": {"n": 8}, "filter": [{"use": "nonconstant_groups"}]}, catalog)
    assert step_settings(run).max_sample_rounds == 3
    bandit = two_questions()
    m = train_step(run, bandit, stream(bandit, [ALWAYS, ALWAYS, MIXED, MIXED]), seed=0, settings=step_settings(run))
    assert m["sample_rounds"] == 2 and m["sampled_rows"] == 64 and m["rows"] == 32 and m["skipped"] == 0


def test_the_filters_budget_shows_in_the_resolved_config():
    from policyzoo.assembly import assemble
    from policyzoo.resolve import resolved_view
    from policyzoo.run_config import load_config

    cfg = load_config(algo="rloo", overrides=["algorithm.filter=[{use: nonconstant_groups}]"])
    view = resolved_view(cfg, assemble(cfg.algorithm))
    assert view["algorithm"]["slots"]["filter"]["components"] == [
        {"use": "nonconstant_groups", "resample": True, "max_sample_rounds": 3, "tolerance": 0.0}]


# ----------------------------------------------------------------------------- metrics
PATTERN = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # per group of 8: mean 3/8


class Pattern(Reward):
    """Reward PATTERN[i mod 8] for row i, whatever the answer. Source: a test double."""

    name = "pattern"

    def reward(self, rollout):
        return torch.tensor([PATTERN[i % 8] for i in range(len(rollout))])


def test_dapo_filled_in_one_round_logs_the_true_reward_mean():
    # DAPO with the overlong penalty out of reach (L_max 32, L_cache 8: lengths <= 20 get 0).
    # Every group is [1,0,0,1,1,0,0,0]: none constant, so round 1 of DAPO's 3 fills the batch and
    # every sampled row is kept. reward/pattern = 3/8 = 0.375 (the old code divided by the 3-round
    # budget: 0.125); reward/overlong_penalty = 0.
    from policyzoo.assembly import Run
    from policyzoo.resolve import resolve_algorithm

    cat = catalog_with(Pattern)
    dapo = resolve_algorithm({"base": "dapo", "sample": {"max_tokens": 32},
                              "reward": [{"use": "overlong_penalty", "cache": 8}]}, cat)
    run = Run(dapo, cat, rewards=(use("pattern"),))
    bandit = two_questions()
    m = train_step(run, bandit, stream(bandit, [ALWAYS] * 4), seed=0, settings=step_settings(run))
    assert m["sample_rounds"] == 1 and m["rows"] == 32 and m["kept_frac"] == 1.0
    assert m["reward/pattern"] == 0.375 and m["reward_mean"] == 0.375
    assert m["reward/overlong_penalty"] == 0.0


def test_two_rewards_of_one_kind_get_their_own_keys():
    from policyzoo.assembly import Run

    cat = catalog_with(Pattern)
    run = Run(cat.bundle("grpo"), cat, rewards=(use("pattern"), use("pattern", weight=2.0), use("bandit_correct")))
    assert run.reward_labels == ["pattern", "pattern_2", "bandit_correct"]
    bandit = two_questions()
    m = train_step(run, bandit, stream(bandit, [MIXED] * 4), seed=0, settings=step_settings(run))
    # each key is its own component's mean: 3/8 for both pattern rewards (the weight is not in it)
    assert m["reward/pattern"] == 0.375 and m["reward/pattern_2"] == 0.375 and 0 <= m["reward/bandit_correct"] <= 1


def test_zero_std_frac_counts_what_the_baseline_zeroes():
    # One group [1, 1, 1, 1 + 1.5e-6]: population std = 1.5e-6 x sqrt(3)/4 = 6.5e-7 <= 1e-6, sample
    # std = 1.5e-6 / 2 = 7.5e-7 <= 1e-6 too; with zero_std_tol 7e-7 only the population std is below
    # it. group_norm(std=sample, tol 7e-7) gives nonzero advantages, so the group is not flat for it.
    cat = load_catalog(autoload=False)
    from policyzoo.assembly import Run

    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0 + 1.5e-6], dtype=torch.float64)
    ids, mask = torch.zeros(4, dtype=torch.long), torch.ones(4, 3, dtype=torch.bool)
    for std, flat in (("sample", 0.0), ("population", 1.0)):
        bundle = cat.bundle("grpo").replace(baseline=use("group_norm", std=std, zero_std_tol=7e-7))
        base = Run(bundle, cat).baseline
        assert base.zero_std_fraction(rewards, ids, mask) == flat
        adv = base.baseline(rewards=rewards, group_ids=ids, response_mask=mask, token_rewards=None,
                            collective=LOCAL).advantages
        assert bool((adv == 0).all()) == (flat == 1.0)


@pytest.mark.parametrize("cls, why", [(NoWeight, "does not derive from policyzoo.contract.Reward"),
                                      (OwnParams, "it lacks weight"), (ExtraArg, "takes 'temperature'")])
def test_contract_suite_checks_the_base_class(cls, why):
    from policyzoo.testing.contract import run_checks

    assert why in run_checks(cls, load_catalog(autoload=False))["base"]
