"""Agreement with TRL 1.16 for the advantage variants it ships: ``scale_rewards="batch"`` and
``multi_objective_aggregation="normalize_then_sum"`` (GDPO). TRL's advantage branches are restated
with TRL's own ``nanstd`` (bench/trl_agreement.py: they live inside the generation method); the loss
and its gradient are TRL's own ``GRPOTrainer._compute_loss``. Tolerance as tests/test_trl_agreement.py."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

import policyzoo  # noqa: E402
from policyzoo import use  # noqa: E402
from policyzoo.contract import Rollout, StepBatch  # noqa: E402
from policyzoo.plugins.baseline import GDPO  # noqa: E402
from policyzoo.step import micro_loss, prepare, step_totals  # noqa: E402
from policyzoo.testing.ranks import advantages  # noqa: E402

_spec = importlib.util.spec_from_file_location("trl_agreement",
                                               Path(__file__).parents[1] / "bench" / "trl_agreement.py")
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)

REL = 1e-7
TRL_LOSS = dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False)


def _close(a, b, rel=REL):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def test_scale_rewards_batch_equals_group_norm_batch_scale():
    # Rewards (1,0,0,1 | 0,0,1,0): batch mean 3/8, sample variance (3 (5/8)^2 + 5 (3/8)^2) / 7
    # = 120/448, std 0.5175492. Row 0: (1 - 0.5) / (0.5175492 + 1e-4) = 0.9659058;
    # row 6: (1 - 0.25) / 0.5176492 = 1.4488576.
    spec = {"base": "grpo", "baseline": {"scale": "batch", "eps": 1e-4, "zero_std_tol": 0.0}}
    c = ta.make_case()
    lo, go, ao = ta.ours(spec, c)
    lt, gt, at = ta.trl(TRL_LOSS, ta.make_case(), "batch")
    assert float(ao[0]) == pytest.approx(0.5 / ((120 / 448) ** 0.5 + 1e-4), rel=1e-9)
    assert float(ao[6]) == pytest.approx(0.75 / ((120 / 448) ** 0.5 + 1e-4), rel=1e-9)
    assert float((ao - at).abs().max()) < 1e-7
    assert _close(lo, lt) and float((go - gt).abs().max()) <= REL * float(gt.abs().max())
    assert float(gt.abs().max()) > 1e-3


PARTS = torch.tensor([[1, 0.5], [0, 1], [0, 0], [1, 0.5], [0, 0], [0, 1], [1, 1], [0, 0]], dtype=torch.float64)
WEIGHTS = torch.tensor([1.0, 0.5], dtype=torch.float64)


def _ours_gdpo(case):
    run = policyzoo.assemble({"base": "gdpo", "baseline": {"eps": 1e-4, "whiten_eps": 1e-4, "zero_std_tol": 0.0}},
                             rewards=(use("answer_match"), use("answer_match", weight=0.5)))
    b, t = case.mask.shape
    rollout = Rollout(prompt_ids=[[1]] * b, response_ids=torch.ones(b, t, dtype=torch.long),
                      response_mask=case.mask.clone(), rollout_logprobs=case.old.clone(),
                      group_ids=case.group_ids.clone(), truncated=torch.zeros(b, dtype=torch.bool))
    batch = StepBatch(rollout, (PARTS * WEIGHTS).sum(-1), old_logprobs=case.old.clone(), ref_logprobs=case.ref.clone(),
                      reward_components=PARTS.clone())
    batch, _ = prepare(run, batch)
    lp = case.logprobs.clone().requires_grad_(True)
    loss, _ = micro_loss(run, batch, lp, step_totals(batch))
    loss.backward()
    return float(loss.detach()), lp.grad.detach(), batch.advantages[:, 0]


def test_normalize_then_sum_equals_gdpo():
    lo, go, ao = _ours_gdpo(ta.make_case())
    adv = ta.trl_normalize_then_sum(PARTS.clone(), WEIGHTS, ta.G)
    lt, gt, _ = ta.trl(TRL_LOSS, ta.make_case(), advantages=adv)
    assert float((ao - adv).abs().max()) < 1e-7
    assert _close(lo, lt) and float((go - gt).abs().max()) <= REL * float(gt.abs().max())
    assert float(gt.abs().max()) > 1e-3
    # The per-reward sums before the batch step, by hand. Group 0: f0 [1, 0, 0, 1] (mean 0.5, sample
    # std sqrt(1/3) = 0.5773503), f1 [.5, 1, 0, .5] (mean 0.5, sample std sqrt(1/6) = 0.4082483).
    # Row 0: 0.5 / 0.5774503 + 0.5 x 0 = 0.8658754; row 1: -0.8658754 + 0.5 x 0.5 / 0.4083483 = -0.2536530.
    m = ta.make_case().mask
    sums = advantages(GDPO(eps=1e-4, zero_std_tol=0.0, whiten=False), (PARTS * WEIGHTS).sum(-1),
                      torch.arange(8) // 4, m, reward_components=PARTS, reward_weights=WEIGHTS).advantages[:, 0]
    assert float(sums[0]) == pytest.approx(0.8658754, abs=1e-7)
    assert float(sums[1]) == pytest.approx(-0.2536530, abs=1e-7)


def test_empty_rows_counted_equals_trl_grpo():
    # Row 7 has no token. TRL's 'grpo' averages the 8 per-row means (row 7 adds 0); ours with
    # empty_rows: count divides by the 8 rows too (the default divides by the 7 non-empty: x 8/7,
    # tests/test_trl_agreement.py::test_empty_row_normaliser_by_hand). Same advantages on both sides.
    spec = {"base": "grpo", "baseline": {"eps": 1e-4, "zero_std_tol": 0.0}, "reduce": {"empty_rows": "count"}}
    c = ta.make_case(lengths=ta.EMPTY_ROW)
    lo, go, ao = ta.ours(spec, c)
    lt, gt, _ = ta.trl(TRL_LOSS, c, advantages=ao)
    assert _close(lo, lt) and float((go - gt).abs().max()) <= REL * float(gt.abs().max())
    default = ta.ours({k: v for k, v in spec.items() if k != "reduce"}, ta.make_case(lengths=ta.EMPTY_ROW))[0]
    assert default == pytest.approx(lo * 8 / 7, rel=1e-12)
