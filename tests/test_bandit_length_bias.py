"""Length bias of the reduce: GRPO's per-sequence token mean vs Dr. GRPO's constant.

Each question has a right answer (10 tokens) and two WRONG answers of 4 and 18 tokens, all three
at probability 1/3. In the bandit only the first token carries the choice, so the gradient of a
sampled response i on the logits is (its per-token weight) x A_i x grad log pi(k_i), and

* ``seq_mean_token_mean`` (GRPO eq. 3, 1/G sum_i 1/|o_i| sum_t): weight 1/|o_i|. A wrong answer
  has A_i < 0 and is pushed down by |A_i| / 4 (short) or |A_i| / 18 (long): per sample the short
  wrong answer is pushed 18 / 4 = 4.5 times harder, so theta_long - theta_short grows and the long
  wrong answer GAINS probability relative to the short one.
* ``token_sum_norm`` (Dr. GRPO Sec. 3.2, sum / C): weight 1/C for every response. The two wrong
  answers are pushed down equally per sample; with equal probabilities they are sampled equally
  often, so E[change of theta_long - theta_short] = 0: no length preference, only noise.

With SGD (no per-coordinate rescaling) the change of theta_long - theta_short in one step is
lr x sum_i w_i A_i (1[k_i = long] - 1[k_i = short]) / N, exactly the sum above.
The measure is log(p_long / p_short) = theta_long - theta_short, averaged over 8 identical
questions after 40 steps (each question's noise has sd ~0.15 here, so the mean has sd ~0.05).
"""

import pytest
import torch

from policyzoo.testing.bandit import Bandit, bandit_run, train

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


RIGHT, SHORT, LONG = 0, 1, 2


def log_ratio_after(spec, lr, catalog, seed=0):
    bandit = Bandit([[10, 4, 18]] * 8, [[True, False, False]] * 8, optimizer="sgd", lr=lr, seed=seed)
    assert torch.allclose(bandit.probs(), torch.full((8, 3), 1 / 3))  # equal start
    run = bandit_run(spec, catalog)
    history = train(run, bandit, 40, prompts_per_step=8, seed=seed)
    p = bandit.probs()
    return float((p[:, LONG] / p[:, SHORT]).log().mean()), float(p[:, RIGHT].mean()), history


# GRPO without its KL term (the KL pulls both wrong answers back to 1/3 and would hide the drift)
GRPO = {"base": "grpo", "kl": None}
# the same with only the reduce swapped: C = 18, the longest answer
GRPO_TSN = {"base": "grpo", "kl": None, "reduce": {"use": "token_sum_norm", "constant": 18}}
# the Dr. GRPO bundle itself (group mean baseline, C = sample.max_tokens = 18)
DR_GRPO = {"base": "dr_grpo", "sample": {"max_tokens": 18}}


@pytest.mark.parametrize("seed", [0, 1])
def test_seq_mean_token_mean_favours_the_long_wrong_answer(catalog, seed):
    drift, right, _ = log_ratio_after(GRPO, 10.0, catalog, seed)
    # the right answer is learned (from 1/3) and the long wrong answer overtook the short one:
    # mean log(p_long / p_short) > 0.5, ten standard errors above 0
    assert right > 0.8
    assert drift > 0.5


@pytest.mark.parametrize("spec, lr", [(GRPO_TSN, 18.0), (DR_GRPO, 40.0)], ids=["grpo+token_sum_norm", "dr_grpo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_constant_normaliser_has_no_length_preference(catalog, spec, lr, seed):
    drift, right, _ = log_ratio_after(spec, lr, catalog, seed)
    # as much learning of the right answer as above ...
    assert right > 0.8
    # ... but no length preference: the mean log-ratio stays within ~3 standard errors of 0,
    # a tenth of the drift under the per-sequence token mean
    assert abs(drift) < 0.15


def test_first_step_weights_are_4_5_to_1(catalog):
    # One question, one group; SGD lr 1 so the update IS minus the gradient.
    # Under seq_mean_token_mean: d theta_j = (1/N) sum_i (A_i / |o_i|) (1[k_i = j] - p_j).
    # Under token_sum_norm(C): d theta_j = (1/N) sum_i (A_i / C) (1[k_i = j] - p_j).
    # The p_j terms are the same for SHORT and LONG (p = 1/3 each), so
    #   seq mean:  d(theta_L - theta_S) = (1/N) (sum_{i: L} A_i / 18 - sum_{i: S} A_i / 4)
    #   constant:  d(theta_L - theta_S) = (1/(N C)) (sum_{i: L} A_i - sum_{i: S} A_i)
    # checked against the sampled rows and the advantages the group baseline gives them.
    for spec, weight in ((GRPO, lambda n: 1 / n), (GRPO_TSN, lambda n: 1 / 18)):
        bandit = Bandit([[10, 4, 18]], [[True, False, False]], optimizer="sgd", lr=1.0)
        seen = {}
        generate = bandit.generate

        def record(*args, **kwargs):
            seen["rollout"] = generate(*args, **kwargs)
            return seen["rollout"]

        bandit.generate = record
        train(bandit_run(spec, catalog), bandit, 1, prompts_per_step=1, seed=5)
        r = seen["rollout"]
        k = r.response_ids[:, 0]
        rewards = (k == RIGHT).double()
        # group_norm, sample std (GRPO's default): A = (r - mean) / (std + 1e-6)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        n_tok = r.response_mask.sum(-1).double()
        w = torch.tensor([weight(float(n)) for n in n_tok], dtype=torch.float64)
        hand = float(((w * adv) * ((k == LONG).double() - (k == SHORT).double())).sum() / len(k))
        got = float(bandit.theta.detach()[0, LONG] - bandit.theta.detach()[0, SHORT])
        assert 0 < (k == SHORT).sum() and 0 < (k == LONG).sum() and 0 < (k == RIGHT).sum()
        assert got == pytest.approx(hand, rel=1e-5, abs=1e-7)
