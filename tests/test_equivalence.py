"""The gradient probe (policyzoo.equivalence): algorithms equal at a run's settings, slots inert there.

Every verdict below is worked out from the definitions first (the comment says why), then asserted.
Notation: A the advantage, r = exp(logprobs - old_logprobs) the token ratio, g = grad log pi.
"""

from __future__ import annotations

import math

import pytest
import torch

from policyzoo.assembly import assemble
from policyzoo.cli import main
from policyzoo.contract import Rollout
from policyzoo.equivalence import (
    ProbeBatch,
    Regime,
    equal_entries,
    gradient,
    inert_slots,
    probe_batches,
    run_warnings,
    same,
    verdict,
)
from policyzoo.errors import ConfigError
from policyzoo.resolve import resolve_algorithm
from policyzoo.run_config import load_config


class Binary:  # a reward component class as the regime reads it: 0/1 correctness
    binary = True


class Continuous:  # a real-valued score (a reward model): groups are never constant
    binary = False


def entries(*names: str, overrides: tuple[str, ...] = ()) -> dict:
    """``{entry: config}`` as compare plans them (an entry's slot changes as overrides)."""
    from policyzoo.resolve import parse_entry

    out = {}
    for name in names:
        base, changes = parse_entry(name)
        out[name] = load_config(None, base, [*changes, *overrides])
    return out


def warnings_of(algo: str, *overrides: str, rewards=(Binary,)) -> list[str]:
    config = load_config(None, algo, list(overrides))
    return run_warnings(config, resolve_algorithm(config.algorithm), list(rewards))


# ----------------------------------------------------------------------------------------- the gradient by hand
def _hand_batch(ref_shift: float) -> ProbeBatch:
    """G = 2 rows of one prompt, rewards [1, 0], lengths 1 and 2 (T = 2), first update (old None)."""
    mask = torch.tensor([[True, False], [True, True]])
    lp = torch.tensor([[-1.0, 0.0], [-2.0, -0.5]], dtype=torch.float64)
    rollout = Rollout([[1], [1]], torch.ones(2, 2, dtype=torch.long), mask, lp.float(), torch.tensor([0, 0]),
                      torch.tensor([False, False]), max_tokens=2)
    zero = torch.zeros(2, 2, dtype=torch.float64)
    return ProbeBatch(rollout, torch.tensor([1.0, 0.0]), lp, None, torch.where(mask, lp - ref_shift, zero), zero,
                      zero + 1.0, zero + 0.5)


def test_the_gradient_is_the_steps_own_worked_by_hand():
    # group_norm: mean 0.5, sample std sqrt(((0.5)^2 + (0.5)^2) / 1) = 0.70711, eps 1e-6:
    # A = +-0.5 / (0.707107 + 1e-6) = +-0.7071058. At r = 1 the clip's gradient is -A g; seq_mean_token_mean
    # divides by |y_i| and by N = 2 rows: row 0 (1 token) -0.7071058 / 1 / 2 = -0.3535529,
    # row 1 (2 tokens) +0.7071058 / 2 / 2 = +0.1767765 per token, padding 0.
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    plain = gradient(assemble({"base": "grpo", "kl": None}), _hand_batch(0.5)).grad
    assert plain[0, 0].item() == pytest.approx(-a / 2, rel=1e-6)
    assert plain[1].tolist() == pytest.approx([a / 4, a / 4], rel=1e-6) and plain[0, 1].item() == 0.0
    # grpo adds beta x k3 with k3 = exp(-(lp - ref)) - 1 + (lp - ref): d/dlp = 1 - exp(-(lp - ref)); with
    # ref = lp - 0.5: 1 - exp(-0.5) = 0.3934693, times beta 0.04, / |y_i| / N: row 0 +0.0078694, row 1 +0.0039347
    kl = 0.04 * (1 - math.exp(-0.5))
    full = gradient(assemble("grpo"), _hand_batch(0.5)).grad
    assert full[0, 0].item() == pytest.approx(-a / 2 + kl / 2, rel=1e-6)
    assert full[1, 1].item() == pytest.approx(a / 4 + kl / 4, rel=1e-6)


def test_the_batches_follow_the_regime():
    # first update: old None (the step's ratio is exactly 1); a later update: old = the log-probs at sampling
    # time, the live ones moved; stale: old = the sampler's log-probs, policy_lag 1. Binary rewards: group 0
    # all right, group 1 all wrong (two constant groups), the others mixed. 2 batches per kind.
    batches = probe_batches(Regime(n=4, updates_per_batch=2, stale=True, rewards=("binary",)))
    assert [b.kind for b in batches] == ["first update"] * 2 + ["later update"] * 2 + ["stale"] * 2
    first, later, stale = batches[0], batches[2], batches[4]
    assert first.old_logprobs is None and later.old_logprobs is not None
    mask = later.rollout.response_mask
    assert (later.logprobs - later.old_logprobs)[mask].abs().max() > 0.2  # ratios far enough from 1 to clip
    assert torch.equal(stale.old_logprobs.float(), stale.rollout.rollout_logprobs)
    assert stale.rollout.policy_lag.eq(1).all() and first.rollout.policy_lag.eq(0).all()
    r = first.rewards.view(-1, 4)
    assert r[0].tolist() == [1.0] * 4 and r[1].tolist() == [0.0] * 4 and all(0 < g.sum() < 4 for g in r[2:])
    assert first.rollout.truncated.any() and len(set(mask.sum(-1).tolist())) > 1  # varied lengths, one truncated
    assert len(probe_batches(Regime(n=4, rewards=("binary", "continuous")))) == 4  # 2 kinds x 2 first updates


# ------------------------------------------------------------------------------------------- pairs: equal
@pytest.mark.parametrize("other, slot", [
    ("grpo+clip=cispo", "clip: cispo vs ppo_clip"),
    ("grpo+clip.eps_high=0.28", "clip: ppo_clip(eps_high=0.28) vs ppo_clip(eps_high=0.2)")])
def test_compare_refuses_entries_equal_at_one_update_per_batch(other, slot):
    # At r = 1 (the first update, the only one at train.updates_per_batch=1): PPO's loss max(-A r, -A clip(r))
    # has gradient -A r g = -A g (1 lies inside [1 - eps_low, 1 + eps_high] for any eps, 0.2 or 0.28), and
    # CISPO's -sg(min(r, eps_max)) A log pi has gradient -min(1, 5) A g = -A g: the same update.
    with pytest.raises(ConfigError) as e:
        equal_entries(entries("grpo", other))
    text = str(e.value)
    assert f"{other} equals grpo at train.updates_per_batch=1 (every ratio is 1 on the first update)" in text
    assert slot in text and "set train.updates_per_batch >= 2" in text and "--allow-equal" in text


def test_gspo_equals_grpo_without_its_kl_at_one_update():
    # GSPO's sequence ratio s_i = exp(mean_t log r_it) is 1 with gradient s_i / |y_i| x sum_t g_t; through
    # seq_mean_token_mean's 1/|y_i| sum_t it gives token t -A_i / |y_i| g_t, the token ratio's gradient; its
    # clip (3e-4 / 4e-4) holds 1 inside. grpo without the KL is then the same update; the ratio and the clip differ.
    with pytest.raises(ConfigError, match=r"(?s)gspo equals grpo\+kl=null .*ratio: sequence vs token.*ratio and clip"):
        equal_entries(entries("grpo+kl=null", "gspo"))


def test_allow_equal_runs_them_with_a_note():
    (note,) = equal_entries(entries("grpo", "grpo+clip=cispo"), allow_equal=True)
    assert note.startswith("note: grpo+clip=cispo equals grpo at train.updates_per_batch=1")


# --------------------------------------------------------------------------------------- pairs: not equal
@pytest.mark.parametrize("pair, overrides", [
    # dr_grpo: A = r - mean (no std: +-0.5 instead of +-0.707 in a 1/0 group of 2) and a token sum over a
    # constant instead of per-row means, no KL: every row's gradient differs
    (("grpo", "dr_grpo"), ()),
    # 4 updates: on a later update r = exp(lp - old) moves away from 1; where r > 1.2 and A > 0 PPO's clip passes
    # no gradient, CISPO passes -min(r, 5) A g
    (("grpo", "grpo+clip=cispo"), ("train.updates_per_batch=4",)),
    # stale batches (old = the sampler's log-probs): the same, from the first update on
    (("grpo", "grpo+clip=cispo"), ("engine.max_staleness=1",)),
    # grpo's k3 KL at beta 0.04 adds 0.04 (1 - exp(ref - lp)) / |y_i| / N to each token's gradient; gspo has none
    (("grpo", "gspo"), ()),
])
def test_entries_that_differ_at_these_settings_are_accepted(pair, overrides):
    assert equal_entries(entries(*pair, overrides=overrides)) == []


@pytest.mark.parametrize("algo, a, b", [
    # an adaptive KL starting at grpo's beta 0.04 with grpo's k3 in the loss: the same first gradient, but its
    # controller moves beta after every step
    ("grpo", [], ["algorithm.kl={use: adaptive, estimator: k3, beta: 0.04, placement: loss}"]),
    # ppo's critic with and without a value clip: the same policy gradient, another critic loss (not probed)
    ("ppo", [], ["algorithm.baseline.value_clip=0.5"]),
])
def test_a_differing_critic_or_a_stateful_component_is_never_called_equal(algo, a, b):
    pa, pb = (verdict.probed(resolve_algorithm(c.algorithm), c, [Binary])
              for c in (load_config(None, algo, a), load_config(None, algo, b)))
    assert same(pa.probes, pb.probes) and not verdict.equal(pa, pb)


# -------------------------------------------------------------------------------------- one slot inert
def test_a_clip_at_ratio_one_is_said_and_acts_from_the_second_update():
    # at r = 1 ppo_clip gives -A g, the gradient of `clip: none` (-A r): inert; at 4 updates it clips
    (line,) = [w for w in warnings_of("grpo") if w.startswith("clip:")]
    assert line.startswith("clip: ppo_clip acts only from the second update: every ratio is 1 on the first update")
    assert "set train.updates_per_batch >= 2" in line
    assert not [w for w in warnings_of("grpo", "train.updates_per_batch=4") if w.startswith("clip:")]


def test_a_kl_at_beta_zero_is_said_and_not_at_beta_above_zero():
    # beta 0: the step adds 0 x k3 to the loss, the gradient is grpo+kl=null's; beta 0.04 adds the term above
    assert [w for w in warnings_of("grpo", "algorithm.kl.beta=0") if w.startswith("kl: k3 (beta=0) adds nothing")]
    assert [w for w in warnings_of("rloo", "algorithm.kl.beta=0") if w.startswith("kl:")]  # in reward placement
    assert not [w for w in warnings_of("grpo") if w.startswith("kl:")]


def test_a_term_with_coefficient_zero_is_said():
    # the entropy bonus adds coef x (-H): d/dH = -coef / |y_i| / N, 0 at coef 0
    zero = warnings_of("grpo", "algorithm.term=[{use: entropy, coef: 0.0}]")
    assert [w for w in zero if w.startswith("term: entropy (coef=0) adds nothing")]
    assert not [w for w in warnings_of("grpo", "algorithm.term=[{use: entropy, coef: 0.01}]") if w.startswith("term:")]


def test_a_filter_that_cannot_drop_follows_the_reward_kind():
    # nonconstant_groups drops groups whose rewards are all equal: binary rewards have such groups (all right,
    # all wrong), continuous ones never do
    assert not [w for w in warnings_of("dapo") if w.startswith("filter:")]
    (line,) = [w for w in warnings_of("dapo", rewards=(Continuous,)) if w.startswith("filter:")]
    assert line.startswith("filter: nonconstant_groups cannot drop a row at these settings (continuous rewards")


def test_a_run_equal_to_its_base_is_said_in_its_warnings():
    (line,) = [w for w in warnings_of("grpo", "algorithm.clip.use=cispo") if "equals" in w]
    assert line.startswith("grpo+clip=cispo equals grpo at train.updates_per_batch=1")


def test_a_probe_that_fails_claims_nothing_and_stops_nothing(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("a component refused synthetic batches")

    monkeypatch.setattr(verdict, "probe", broken)
    assert warnings_of("grpo") == ["the equality probe claims nothing: RuntimeError: a component refused "
                                   "synthetic batches"]
    assert equal_entries(entries("grpo", "grpo+clip=cispo"))[0].startswith("note: the equality probe claims nothing")


def test_inert_slots_names_every_identity_of_gspo_at_one_update():
    config = load_config(None, "gspo", [])
    bundle = resolve_algorithm(config.algorithm)
    from policyzoo.equivalence import regime
    from policyzoo.equivalence.gradient import build_run

    lines = inert_slots(bundle, regime(config, build_run(bundle), [Binary]))
    assert [w.split(":")[0] for w in lines] == ["ratio", "clip"]


def test_an_equal_pair_inert_for_two_reasons_names_each_reason_and_each_fix():
    # gspo vs grpo with beta 0 at one update: grpo's k3 KL is inert (beta 0) and gspo's sequence ratio and its
    # clip are inert (every ratio is 1); the fix of the KL alone would leave the ratio and clip inert
    with pytest.raises(ConfigError) as e:
        equal_entries(entries("gspo", "grpo+kl.beta=0"))
    assert ("(a KL with beta 0 adds nothing to the loss or the rewards; every ratio is 1 on the first update)"
            in e.value.why)
    assert e.value.fix.startswith("set algorithm.kl.beta > 0 for the kl to act; or set train.updates_per_batch >= 2 "
                                  "(or engine.max_staleness >= 1) for the ratio and clip to act; or drop one")


# ------------------------------------------------------------------------------------------- the commands
def test_compare_refuses_the_equal_pair_in_seconds_and_accepts_it_at_four_updates(tmp_path, capsys):
    args = ["compare", "--algos", "grpo,grpo+clip=cispo", "--seeds", "1", "--output-dir", str(tmp_path),
            "--print-commands"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "grpo+clip=cispo equals grpo at train.updates_per_batch=1 (every ratio is 1 on the first update)" in err
    assert "fix: set train.updates_per_batch >= 2 (or engine.max_staleness >= 1) for the clip to act" in err
    assert main([*args, "train.updates_per_batch=4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("train.updates_per_batch=4" in line for line in out)
    assert main([*args, "--allow-equal"]) == 0
    assert "note: grpo+clip=cispo equals grpo" in capsys.readouterr().err


def test_explain_with_overrides_says_what_the_probe_finds(capsys):
    assert main(["explain", "grpo", "algorithm.clip.use=cispo"]) == 0
    out = capsys.readouterr().out
    assert "grpo+clip=cispo equals grpo at train.updates_per_batch=1" in " ".join(out.split())
    assert main(["explain", "grpo", "train.updates_per_batch=4"]) == 0
    assert "acts only from the second update" not in capsys.readouterr().out


def test_the_dry_run_warns_of_the_equal_base_and_the_inert_clip(tmp_path, capsys):
    from _engine_helpers import tiny_model

    assert main(["train", "--algo", "grpo", "--dry-run", "--output-dir", str(tmp_path / "run"),
                 f"model.path={tiny_model()}", "algorithm.clip.use=cispo"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert ("warning: grpo+clip=cispo equals grpo at train.updates_per_batch=1 (every ratio is 1 on the first "
            "update)") in err
    assert "warning: clip: cispo acts only from the second update" in err


def test_the_dry_run_of_a_zoo_bundle_says_its_inert_clip_as_a_note_not_a_warning(tmp_path, capsys):
    # grpo as the zoo defines it (one update per batch, its paper's setting): PPO's clip at r = 1 is -A grad log pi,
    # the gradient of clip: none; that is the bundle's own design, said as a note; a hybrid's is a warning (above)
    from _engine_helpers import tiny_model

    assert main(["train", "--algo", "grpo", "--dry-run", "--output-dir", str(tmp_path / "run"),
                 f"model.path={tiny_model()}"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "note: clip: ppo_clip acts only from the second update" in err
    assert "warning: clip:" not in err


def test_a_line_on_a_slot_the_user_changed_is_a_warning_the_zoo_bundles_own_a_note():
    from policyzoo.equivalence import notes_and_warnings

    def split(*overrides):
        config = load_config(None, "grpo", list(overrides))
        bundle = resolve_algorithm(config.algorithm)
        return notes_and_warnings(config, bundle, run_warnings(config, bundle, [Binary]))

    notes, warns = split("algorithm.sample.max_tokens=8")  # the sample slot changed; the clip is grpo's own
    assert [n for n in notes if n.startswith("clip: ppo_clip acts only")] and not warns
    notes, warns = split("algorithm.clip.eps_high=0.28")  # the clip itself changed: it does nothing here
    assert [w for w in warns if w.startswith("clip: ppo_clip acts only")]
    # a bf16 sampler with an fp32 trainer adds engine.rollout_correction (tis) as the ratio: the engine's choice,
    # not the user's; the clip line stays a note
    notes, warns = split("engine.rollout_dtype=bfloat16")
    assert [n for n in notes if n.startswith("clip:")] and not [w for w in warns if w.startswith("clip:")]


def test_the_probe_leaves_the_random_state_of_the_run_as_it_was():
    # the probe seeds the CPU generator inside torch.random.fork_rng(devices=[]): the run's draws after it are
    # the draws it would have made without it, and no CUDA context or CUDA seed is touched
    torch.manual_seed(123)
    before = torch.get_rng_state()
    warnings_of("grpo")
    assert torch.equal(torch.get_rng_state(), before)
    assert not torch.cuda.is_initialized()


def test_allow_equal_without_algos_is_refused_not_ignored(tmp_path, capsys):
    assert main(["compare", str(tmp_path), "--allow-equal"]) == 2
    assert "--allow-equal only go with --algos" in capsys.readouterr().err
