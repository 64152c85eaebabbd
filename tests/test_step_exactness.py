"""policyzoo.step.train_step, checked on the bandit: micro-batching is exact, and the first update
after sampling has ratio exactly 1 and no clipping, for every bundle.

SGD (no momentum) makes the parameter change exactly -lr x the accumulated gradient, so equal
updates mean equal gradients.
"""

import pytest
import torch

from policyzoo.step import train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


BUNDLES = ["ppo", "grpo", "rloo", "reinforce_pp", "dapo", "dr_grpo", "gspo", "cispo", "luspo", "gmpo", "dppo",
           "distill"]
# clip_cov and kl_cov select tokens by a statistic over each micro-batch (stated in their docstring),
# so their micro-batch split changes the update; their exactness across ranks is tests/test_math_covariance_clips.py


def one_step(name, catalog, **settings):
    # lengths 2..20 under max_tokens 16 (the bundles' samplers are overridden to 16 below), so
    # rows differ in length, some are truncated and the reduces' normalisers all matter
    bandit = Bandit.random(6, 5, right=2, min_len=2, max_len=20, seed=7, optimizer="sgd", lr=0.5, critic_lr=0.5)
    # start away from uniform so the KL terms and the critic are not trivially 0
    with torch.no_grad():
        bandit.theta.copy_(torch.randn(6, 5, generator=torch.Generator().manual_seed(1)))
        bandit.critic.copy_(0.1 * torch.randn(bandit.critic.shape, generator=torch.Generator().manual_seed(2)))
    run = bandit_run({"base": name, "sample": {"max_tokens": 16}}, catalog)
    g = run.sample.params.n
    theta0, critic0 = bandit.theta.detach().clone(), bandit.critic.detach().clone()
    m = train_step(run, bandit, lambda: bandit.prompts(24 // g), seed=3, settings=step_settings(run, **settings))
    return bandit.theta.detach() - theta0, bandit.critic.detach() - critic0, m, run


@pytest.mark.parametrize("name", BUNDLES)
@pytest.mark.parametrize("updates", [1, 2])
def test_micro_batches_give_the_same_update(name, updates, catalog):
    d1, c1, m1, _ = one_step(name, catalog, micro_batches=1, updates_per_batch=updates)
    d3, c3, m3, _ = one_step(name, catalog, micro_batches=3, updates_per_batch=updates)
    assert m1["rows"] == m3["rows"] == 24
    assert float(d1.abs().max()) > 1e-3  # the step did move the logits
    # the same update up to float32 summation order
    assert torch.allclose(d1, d3, rtol=1e-5, atol=1e-6)
    assert torch.allclose(c1, c3, rtol=1e-5, atol=1e-6)
    # the reported loss is the full-batch loss (sum of micro-batch losses, mean over updates)
    assert m1["loss"] == pytest.approx(m3["loss"], rel=1e-5, abs=1e-7)
    assert ("value_loss" in m1) == (name == "ppo")
    if name == "ppo":
        assert float(c1.abs().max()) > 1e-3
        assert m1["value_loss"] == pytest.approx(m3["value_loss"], rel=1e-5, abs=1e-7)
    for key in ("ratio_mean", "clip_frac_low", "clip_frac_high", "entropy"):
        assert m1[key] == pytest.approx(m3[key], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("name", BUNDLES)
def test_first_update_has_ratio_one_and_no_clipping(name, catalog):
    _, _, m, run = one_step(name, catalog)
    # on-policy: old_logprobs are the live log-probs detached, so r = exp(0) = 1 on every token
    # (GSPO: exp(mean of zeros) = 1), the mean of 1s is exactly 1.0 and nothing is clipped
    assert m["ratio_mean"] == 1.0
    assert m["clip_frac_low"] == 0.0 and m["clip_frac_high"] == 0.0


@pytest.mark.parametrize("name", ["ppo", "grpo", "gspo", "cispo"])
def test_first_of_several_updates_has_ratio_one(name, catalog):
    # updates_per_batch 2: old_logprobs come from a separate no-grad forward at sampling time.
    # The first update's ratio is still exactly 1 on every masked token; the second is not.
    ratios = []
    b = Bandit.random(6, 5, right=2, seed=7, optimizer="sgd", lr=0.5)
    run = bandit_run(name, catalog)

    def after(outcome, hook_name, hook_impls, kwargs):
        if hook_name == "ratio":
            ratios.append((outcome.get_result().detach(), kwargs["response_mask"]))

    run.pm.add_hookcall_monitoring(lambda *a: None, after)
    g = run.sample.params.n
    train_step(run, b, lambda: b.prompts(24 // g), seed=3, settings=step_settings(run, updates_per_batch=2))
    assert len(ratios) == 2
    (r1, mask1), (r2, mask2) = ratios
    assert torch.equal(r1[mask1], torch.ones(int(mask1.sum())))
    assert not torch.equal(r2[mask2], torch.ones(int(mask2.sum())))


def test_sampler_is_synced_after_the_step(catalog):
    bandit = Bandit.random(4, 3, right=1, seed=0, optimizer="sgd", lr=0.5)
    run = bandit_run("grpo", catalog)
    m = train_step(run, bandit, lambda: bandit.prompts(4), seed=0, settings=step_settings(run))
    assert torch.equal(bandit.sampler_theta, bandit.theta.detach())
    assert m["sync_max_change"] == pytest.approx(float(bandit.theta.detach().abs().max()))
