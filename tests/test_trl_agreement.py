"""Numeric agreement with TRL's GRPOTrainer loss (runs when ``trl`` is installed: ``.[bench]``).

TRL's own ``GRPOTrainer._compute_loss`` is called on a stand-in ``self`` (bench/trl_agreement.py)
with the same log-probs, old/ref log-probs, rewards and ragged mask as ours. Where the two agree
the tolerance is 1e-7 relative: TRL's ``nanstd`` computes Bessel's factor G/(G-1) in float32
(4/3 -> 1.3333333731, relative error 3.0e-8, so the std is off by 1.5e-8 relative) -- everything
else is float64. Where they differ, the difference is predicted from the stated convention by hand.
"""

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

_spec = importlib.util.spec_from_file_location("trl_agreement",
                                               Path(__file__).parents[1] / "bench" / "trl_agreement.py")
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)

CASES = {c[0]: c for c in ta.CASES}
REL = 1e-7


def _close(a, b, rel=REL):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def _grad_close(ga, gb, rel=REL):
    return float((ga - gb).abs().max()) <= rel * float(gb.abs().max())


def test_case_exercises_both_clip_sides():
    # A case where no token is clipped would make "equal" trivial: check some ratio r = exp(lp - old)
    # lies outside [0.8, 1.2] with A > 0 and some with A < 0 (group rewards [1,0,0,1], [0,0,1,0]).
    c = ta.make_case()
    r = torch.exp(c.logprobs - c.old)
    a = torch.tensor(ta.REWARDS) - torch.tensor([0.5] * 4 + [0.25] * 4)  # sign of A per row
    out = ((r > 1.2) | (r < 0.8)) & c.mask
    assert (out & (a > 0).unsqueeze(-1)).any() and (out & (a < 0).unsqueeze(-1)).any()


@pytest.mark.parametrize("label", [c[0] for c in ta.CASES if c[4] == "equal"])
def test_equal_where_conventions_match(label):
    _, spec, kw, sr, _, _ = CASES[label]
    r = ta.compare(spec, kw, sr, ta.make_case())
    assert _close(r["loss_ours"], r["loss_trl"]), r
    lo, go, _ = ta.ours(spec, ta.make_case())
    lt, gt, _ = ta.trl(kw, ta.make_case(), sr)
    assert _grad_close(go, gt), float((go - gt).abs().max())
    assert float(gt.abs().max()) > 1e-3  # a real gradient, not two zeros


def test_trl_kl_times_ratio_difference_by_hand():
    # TRL's default use_bias_correction_kl multiplies k3 by r = exp(lp - old) (with grad). Per token
    # the loss differs by beta k3 (r - 1) and its derivative by beta [(r - 1) k3' + r k3], k3' =
    # 1 - exp(ref - lp); the 'grpo' reduce weighs a token of row i by 1 / (|y_i| B), B = 8.
    _, spec, kw, _, _, _ = CASES["grpo, TRL KL x ratio (TRL default)"]
    c = ta.make_case()
    lo, go, ao = ta.ours(spec, c)
    lt, gt, _ = ta.trl(kw, c, advantages=ao)  # same advantages: only the KL term differs
    beta, lp, m = 0.04, c.logprobs, c.mask.double()
    r = torch.exp(lp - c.old)
    k3 = torch.exp(c.ref - lp) - (c.ref - lp) - 1
    w = m / m.sum(-1, keepdim=True) / 8
    assert abs((lt - lo) - float((beta * k3 * (r - 1) * w).sum())) < 1e-12
    expect = beta * ((r - 1) * (1 - torch.exp(c.ref - lp)) + r * k3) * w
    assert float((gt - go - expect).abs().max()) < 1e-12


def test_std_eps_convention_by_hand():
    # Group 0 rewards [1,0,0,1]: mean 0.5, sample std sqrt(1/3) = 0.5773502692; group 1 [0,0,1,0]:
    # mean 0.25, sample std sqrt(0.75/3) = 0.5. Row 0: ours (eps 1e-6) 0.5/0.5773512692 = 0.8660238,
    # TRL (eps 1e-4) 0.5/0.5774502692 = 0.8659040. Row 6: 0.75/0.500001 = 1.4999970 vs 0.75/0.5001 =
    # 1.4997001.
    _, spec, kw, _, _, _ = CASES["grpo, our std eps 1e-6 (default)"]
    _, _, ao = ta.ours(spec, ta.make_case())
    _, _, at = ta.trl(kw, ta.make_case())
    assert math.isclose(float(ao[0]), 0.5 / (math.sqrt(1 / 3) + 1e-6), rel_tol=1e-12)
    assert math.isclose(float(at[0]), 0.5 / (math.sqrt(1 / 3) + 1e-4), rel_tol=REL)
    assert math.isclose(float(ao[6]), 1.4999970000, rel_tol=1e-9)
    assert math.isclose(float(at[6]), 1.4997000600, rel_tol=REL)


def test_empty_row_normaliser_by_hand():
    # Row 7 has no token. With the same advantages, TRL's 'grpo' averages the 8 per-row means
    # (row 7 contributes 0), ours averages over the N = 7 rows with a token: ours = TRL x 8/7.
    _, spec, kw, _, _, _ = CASES["grpo"]
    c = ta.make_case(lengths=ta.EMPTY_ROW)
    lo, go, ao = ta.ours(spec, c)
    lt, gt, _ = ta.trl(kw, c, advantages=ao)
    assert math.isclose(lo, lt * 8 / 7, rel_tol=1e-12)
    assert float((go - gt * 8 / 7).abs().max()) < 1e-12
    # Own advantages: TRL's group 1 is [0, 0, 1, 0] over 4 rows (A of row 6 = 0.75/(0.5+1e-4)); ours
    # drops row 7: [0, 0, 1], mean 1/3, sample variance (1/9 + 1/9 + 4/9)/2 = 1/3: A = (2/3)/(0.57735+1e-4).
    _, _, at = ta.trl(kw, c)
    assert math.isclose(float(at[6]), 0.75 / 0.5001, rel_tol=REL)
    assert math.isclose(float(ao[6]), (2 / 3) / (math.sqrt(1 / 3) + 1e-4), rel_tol=1e-9)
    assert float(ao[7]) == 0.0


def test_gspo_extreme_log_ratio_by_hand():
    # Row 4 (rewards group [0,0,1,0], A = -0.25/(0.5+1e-4) = -0.49990002) gets mean log r = 50.
    # Ours clamps it to 10: the row's loss is -A e^10 (clipped side inactive for A < 0 and r > 1), with
    # zero gradient (clamp active). TRL: -A e^50 / B = 0.4999 x 5.18e21 / 8 = 3.24e20.
    c = ta.make_case()
    c.old[4] = c.logprobs[4] - 50.0
    _, spec, kw, _, _, _ = CASES["gspo"]
    lo, go, _ = ta.ours(spec, c)
    lt, gt, _ = ta.trl(kw, c)
    a4 = 0.25 / (0.5 + 1e-4)
    assert math.isfinite(lo) and float(go[4].abs().max()) == 0.0
    assert math.isclose(lt, a4 * math.exp(50) / 8, rel_tol=1e-6)
    # the other 7 rows add |loss| < 1 (|A| <= 1.5, r within 1 +- 4e-4 after the clip, divided by 8)
    assert abs(lo - a4 * math.exp(10) / 8) < 1.0


@pytest.mark.parametrize("label", [c[0] for c in ta.MICRO_CASES[:2]])
def test_exact_under_micro_batching(label):
    # grpo and dapo over 2 micro-batches of 4 rows with 24 and 5 tokens (gradient accumulation):
    # both frameworks give the full-batch loss and gradient (same advantages on both sides).
    _, spec, kw, _ = {c[0]: c for c in ta.MICRO_CASES}[label]
    c = ta.make_case(lengths=ta.UNEVEN)
    full, gfull, adv = ta.ours(spec, c)
    lo, go = ta.ours_accumulated(spec, c)
    lt, gt = ta.trl_accumulated(kw, c, adv)
    assert math.isclose(lo, full, rel_tol=1e-12) and math.isclose(lt, full, rel_tol=1e-12)
    assert float((go - gfull).abs().max()) < 1e-15 and float((gt - gfull).abs().max()) < 1e-15


def test_trl_bnpo_is_a_mean_of_micro_batch_means_by_hand():
    # Micro-batch k has token-loss sum S_k and n_k tokens (n = 24, 5). Ours (token_mean) gives
    # L_k = S_k / 29 per micro-batch; TRL's 'bnpo' with 2 accumulation steps gives
    # 1/2 (S_1/24 + S_2/5) = 29/2 (L_1/24 + L_2/5), and scales row gradients by 29/(2 n_k).
    _, spec, kw, _ = ta.MICRO_CASES[2]
    c = ta.make_case(lengths=ta.UNEVEN)
    parts: list = []
    _, go = ta.ours_accumulated(spec, c, parts=parts)
    lt, gt = ta.trl_accumulated(kw, c, ta.ours(spec, c)[2])
    assert math.isclose(lt, 29 / 2 * (parts[0] / 24 + parts[1] / 5), rel_tol=1e-12)
    assert float((gt[:4] - go[:4] * 29 / 48).abs().max()) < 1e-15
    assert float((gt[4:] - go[4:] * 29 / 10).abs().max()) < 1e-15
