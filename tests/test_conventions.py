"""algorithm.conventions: one key sets every convention switch to a peer's default; what the bundle or
the user states wins; --dry-run's resolved view names what the preset set. Each preset is checked
against the peer's own numbers, worked out by hand from its code."""

import pytest
import torch

import policyzoo
from policyzoo.assembly import Run
from policyzoo.conventions import PRESETS
from policyzoo.errors import ConfigError
from policyzoo.resolve import resolve_algorithm, resolved_view
from policyzoo.run_config import load_config
from policyzoo.testing.ranks import advantages


def _run(**algo):
    return policyzoo.assemble({"base": "grpo", **algo})


def test_trl_preset_gives_trls_numbers():
    run = _run(conventions="trl")
    # TRL: (r - mean) / (nanstd + 1e-4); rewards [1, 0]: sample std sqrt(0.5) = 0.70710678,
    # A = 0.5 / 0.70720678 = 0.70700680 (ours by default: 0.5 / (0.70710678 + 1e-6) = 0.70710578)
    mask = torch.ones(2, 1, dtype=torch.bool)
    a = advantages(run.baseline, torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0]), mask)
    assert float(a.advantages[0, 0]) == pytest.approx(0.5 / (0.5 ** 0.5 + 1e-4), rel=1e-9)
    assert run.reduce.params.empty_rows == "count"  # loss_type grpo divides by every row
    assert run.baseline.params.whiten_std == "sample" and run.baseline.params.whiten_eps == 1e-4
    assert load_config(None, None, ["algorithm.conventions=trl"]).train.reward_nan == "nansum"


def test_verl_preset_gives_verls_numbers():
    run = _run(conventions="verl")
    # compute_grpo_outcome_advantage: a group of one has mean 0 and std 1 -> A = 2 / (1 + 1e-6)
    mask = torch.ones(3, 1, dtype=torch.bool)
    a = advantages(run.baseline, torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64), torch.tensor([0, 0, 1]), mask)
    assert float(a.advantages[2, 0]) == pytest.approx(2.0 / (1.0 + 1e-6), rel=1e-12)
    # clip_ratio_c 3: ratio 5 with A = -1 -> PPO loss max(5, 1.2) = 5, capped at 3 x |A| = 3
    sur = run.clip.clip(ratio=torch.tensor([[5.0]]), advantages=torch.tensor([[-1.0]]),
                        response_mask=torch.ones(1, 1, dtype=torch.bool))
    assert float(sur.loss) == 3.0
    # low_var_kl clamped to +-10: log r = -15 -> k3 = e^15 - 1 - 15 ~ 3.3e6 -> 10
    k = run.kl.kl(logprobs=torch.tensor([[-16.0]]), ref_logprobs=torch.tensor([[-1.0]]),
                  response_mask=torch.ones(1, 1, dtype=torch.bool), ratio=torch.ones(1, 1))
    assert float(k) == 10.0
    assert load_config(None, None, ["algorithm.conventions=verl"]).train.reward_nan == "unscorable"


def test_policyzoo_preset_is_the_plain_bundle():
    assert PRESETS["policyzoo"] == {}
    assert resolve_algorithm({"base": "grpo", "conventions": "policyzoo"}) == resolve_algorithm("grpo")


def test_explicit_settings_win():
    run = _run(conventions="verl", clip={"dual_clip": 2.0}, baseline={"singleton": "zero"})
    assert run.clip.params.dual_clip == 2.0 and run.baseline.params.singleton == "zero"
    assert run.baseline.params.eps == 1e-6  # the rest of the preset still applies
    run = _run(conventions="verl", clip={"use": "ppo_clip", "eps_high": 0.28})  # a swapped-in component too
    assert run.clip.params.dual_clip == 3.0
    cfg = load_config(None, None, ["algorithm.conventions=trl", "train.reward_nan=unscorable"])
    assert cfg.train.reward_nan == "unscorable"


def test_dry_run_view_names_what_the_preset_set():
    cfg = load_config(None, None, ["algorithm.conventions=trl", "algorithm.baseline.eps=1e-3"])
    view = resolved_view(cfg, Run(resolve_algorithm(cfg.algorithm), rewards=(policyzoo.use("answer_match"),)))
    got = view["algorithm"]["conventions"]
    assert got["name"] == "trl"
    assert got["set"] == {"baseline.whiten_std": "sample", "baseline.whiten_eps": 1e-4, "reduce.empty_rows": "count",
                          "train.reward_nan": "nansum"}  # baseline.eps is the user's 1e-3, not the preset's
    again = policyzoo.assemble(view["algorithm"])  # the printed view reads back to the same components
    assert again.baseline.params == policyzoo.assemble(cfg.algorithm).baseline.params


def test_unknown_preset_is_refused():
    with pytest.raises(ConfigError, match="unknown conventions 'trll'.*did you mean 'trl'"):
        resolve_algorithm({"base": "grpo", "conventions": "trll"})
