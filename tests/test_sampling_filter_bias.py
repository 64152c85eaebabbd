"""Sampling filters and the ratios that read the sampler's log-probs: the bias by hand, and the
warning given before any model loads (session.prepare and --dry-run)."""

import math

import pytest
import torch

import policyzoo
from policyzoo.engine.run.checks import filter_bias_warning
from policyzoo.plugins.ratio.mismatch import TIS


def test_a_filter_biases_the_sampler_ratio_by_the_kept_mass():
    # p = [0.5, 0.3, 0.2]; top_p 0.8 keeps {0.5, 0.3} and vLLM (processed_logprobs) reports the renormalised
    # q = [0.625, 0.375]. The trainer scores the full p, so for token 0: pi_old / pi_rollout = 0.5 / 0.625 = 0.8
    # and for token 1: 0.3 / 0.375 = 0.8 -- the kept mass, on every sampled token, although both engines agree.
    old = torch.tensor([[math.log(0.5), math.log(0.3)]])
    rollout = torch.tensor([[math.log(0.625), math.log(0.375)]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    w, _, _ = TIS(level="token").correction(old, old, rollout, mask, torch.ones(1, 2))
    assert torch.allclose(w, torch.tensor([[0.8, 0.8]]))
    # without the filter the sampler reports p itself and the weight is exactly 1
    w, _, _ = TIS(level="token").correction(old, old, old, mask, torch.ones(1, 2))
    assert torch.equal(w, torch.ones(1, 2))


@pytest.mark.parametrize("sample, ratio, overlap, says", [
    ({"top_p": 0.8}, "tis", "none", ["top_p=0.8", "'tis'"]),
    ({"top_k": 20, "min_p": 0.1}, "icepop", "none", ["top_k=20", "min_p=0.1", "'icepop'"]),
    ({"repetition_penalty": 1.1}, "token", "one_step", ["repetition_penalty=1.1", "engine.overlap=one_step"]),
    ({}, "tis", "one_step", None),  # no filter: the sampler's log-probs are of the distribution the trainer scores
    ({"top_p": 0.9}, "token", 2, ["top_p=0.9", "engine.max_staleness=2"]),  # async: stale rows read them
    ({"top_p": 0.8}, "token", "none", None),  # nothing reads the sampler's log-probs
])
def test_filter_with_a_rollout_logprob_reader_is_warned(sample, ratio, overlap, says):
    run = policyzoo.assemble({"base": "grpo", "sample": sample, "ratio": {"use": ratio}})
    text = (filter_bias_warning(run, "none", overlap) if isinstance(overlap, int)  # engine.max_staleness
            else filter_bias_warning(run, overlap))
    if says is None:
        assert text is None
    else:
        assert all(s in text for s in says) and "kept probability mass" in text
