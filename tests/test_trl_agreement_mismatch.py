"""Agreement with TRL 1.16's own code for the rollout/trainer mismatch corrections (bench/trl_mismatch.py).

Each case runs TRL's IS-ratio block of ``_generate_and_score_completions`` and TRL's
``_compute_loss`` on the same float64 tensors as ours (GRPO, weight on the loss, TRL given our
advantages so that only the correction is compared), with a sampler that differs from the trainer
so that some tokens are truncated or masked. Both compute the same float64 operations in the same
order here, so the losses and gradients agree to 1e-12 relative.
"""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

_spec = importlib.util.spec_from_file_location("trl_mismatch", Path(__file__).parents[1] / "bench" / "trl_mismatch.py")
tm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tm)

LABELS = [c[0] for c in tm.CASES]


@pytest.mark.parametrize("label", LABELS)
def test_loss_and_gradient_equal_trl(label):
    r = tm.compare(label)
    assert abs(r["loss_ours"] - r["loss_trl"]) <= 1e-12 * abs(r["loss_trl"])
    assert float((r["grad_ours"] - r["grad_trl"]).abs().max()) <= 1e-12 * float(r["grad_trl"].abs().max())
    assert float(r["grad_trl"].abs().max()) > 1e-3  # a real gradient, not two zeros
    # the correction acted on some valid tokens and not on all of them, so "equal" is not trivial
    imp, m = r["importance"], r["case"].mask
    hit = (imp.truncated if imp.truncated is not None else torch.zeros_like(m)) | \
          (imp.masked if imp.masked is not None else torch.zeros_like(m))
    assert 0 < int((hit & m).sum()) < int(m.sum())


@pytest.mark.parametrize("label", [c[0] for c in tm.CASES if c[2].get("use_vllm")])
def test_weight_equals_trls_importance_sampling_ratio(label):
    # TRL's ratio is [B, 1] in the sequence modes and [B, T] in the token modes; on valid tokens
    # our weight is the same number (padding: TRL exp(0) = 1 or a row's value, ours 1).
    r = tm.compare(label)
    m = r["case"].mask
    theirs = r["is_ratio"].expand(m.shape)
    assert torch.equal(r["importance"].weight[m], theirs[m])


def test_opsm_mask_is_trls_get_off_policy_mask():
    from trl import GRPOTrainer

    r = tm.compare("opsm, threshold 0.05")
    case, rollout = tm.make_case(0.15)
    _, _, adv, imp = tm.ours({"use": "opsm", "threshold": 0.05}, case, rollout)
    keep = GRPOTrainer.get_off_policy_mask(advantages=adv.unsqueeze(1), per_token_logps=case.logprobs,
                                           sampling_per_token_logps=rollout, mask=case.mask.double(),
                                           off_policy_threshold=0.05)  # [B, 1], 1.0 = keep
    m = case.mask
    assert torch.equal(imp.masked[m], (keep == 0).expand(m.shape)[m])
    assert torch.equal(r["importance"].masked, imp.masked)
    assert 0 < int(imp.masked.sum()) < int(m.sum())


def test_the_comparison_sees_a_different_placement():
    # The same weight on the ratio instead of the loss: the clip sees r x w, so the numbers differ
    # from TRL's (the stated convention of placement: ratio); a guard that the test above can fail.
    case, rollout = tm.make_case(0.3)
    lo, go, adv, _ = tm.ours({"use": "tis", "cap": 1.5, "placement": "ratio"}, case, rollout)
    lt, gt, _ = tm.trl(dict(use_vllm=True, vllm_importance_sampling_mode="sequence_truncate",
                            vllm_importance_sampling_clip_max=1.5), case, rollout, adv)
    assert abs(lo - lt) > 1e-3 and float((go - gt).abs().max()) > 1e-3
