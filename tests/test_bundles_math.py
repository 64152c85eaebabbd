"""Each bundle, assembled by name and run through ``prepare`` + ``micro_loss``, against its paper's
objective written out independently here with plain loops (python floats for the advantages,
``statistics`` for means and standard deviations, torch scalars only for autograd)."""

import math
import statistics

import pytest
import torch

import policyzoo
from policyzoo.contract import Rollout, StepBatch
from policyzoo.step import micro_loss, prepare, step_totals

BUNDLES = ["ppo", "grpo", "rloo", "reinforce_pp", "dapo", "dr_grpo", "gspo", "cispo"]
LENGTHS = [5, 3, 1, 4, 2, 5]
GROUPS = [7, 3, 7, 3, 7, 3]          # interleaved on purpose: grouping by position would be wrong
REWARDS = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0]
B, T = 6, 6                           # one padding column beyond the longest response


def toy(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T).expand(B, T) < torch.tensor(LENGTHS).unsqueeze(-1)
    lp = -torch.rand(B, T, generator=g) * 2 - 0.1
    old = lp + (torch.rand(B, T, generator=g) - 0.5) * 0.7   # ratios in about [0.70, 1.42]
    ref = lp + (torch.rand(B, T, generator=g) - 0.5)
    values = torch.randn(B, T, generator=g) * 0.5
    for x in (lp, old, ref, values):
        x[~mask] = 77.0                                       # garbage on padding
    rollout = Rollout(prompt_ids=[[1]] * B, response_ids=torch.zeros(B, T, dtype=torch.long), response_mask=mask,
                      rollout_logprobs=old.clone(), group_ids=torch.tensor(GROUPS),
                      truncated=torch.zeros(B, dtype=torch.bool))
    return rollout, lp, old, ref, values


def run_bundle(name, lp, old, ref, values, on_policy=False):
    """Loss gradient (and the run) through the hooks."""
    run = policyzoo.assemble(name)
    rollout, *_ = toy()
    batch = StepBatch(rollout, torch.tensor(REWARDS), old_logprobs=None if on_policy else old.clone(),
                      ref_logprobs=ref.clone() if run.kl is not None else None,
                      values=values.clone() if getattr(run.baseline, "needs_values", False) else None)
    scored = lp.detach().clone() if on_policy else old.clone()   # trainer log-probs at sampling time
    batch, _ = prepare(run, batch, scored)
    theta = lp.clone().requires_grad_(True)
    loss, sums = micro_loss(run, batch, theta, step_totals(batch))
    loss.backward()
    return theta.grad, run, batch, sums


# ----------------------------------------------------------------------------- independent objectives
def groups():
    out = {}
    for i, g in enumerate(GROUPS):
        out.setdefault(g, []).append(i)
    return out


def group_norm_adv(scores, eps=1e-6):
    adv = [0.0] * B
    for rows in groups().values():
        vals = [scores[i] for i in rows]
        mean, std = statistics.mean(vals), statistics.stdev(vals)   # sample std (G - 1)
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + eps)
    return adv


def ppo_term(r, a, lo, hi):
    return torch.minimum(r * a, torch.clamp(r, lo, hi) * a)


def token_ppo_objective(theta, old, adv_tok, lo, hi, per_sequence):
    """sum_i [1/|y_i|] sum_t min(r A, clip(r) A); adv_tok(i, t) -> float."""
    total = 0
    for i in range(B):
        inner = 0
        for t in range(LENGTHS[i]):
            r = torch.exp(theta[i, t] - old[i, t])
            inner = inner + ppo_term(r, adv_tok(i, t), lo, hi)
        total = total + (inner / LENGTHS[i] if per_sequence else inner)
    return total


def grad_of(objective, lp):
    theta = lp.clone().requires_grad_(True)
    (-objective(theta)).backward()
    return theta.grad


def check(name, expected_grad, **kw):
    rollout, lp, old, ref, values = toy()
    got, *_ = run_bundle(name, lp, kw.get("old", old), ref, values, kw.get("on_policy", False))
    assert expected_grad.abs().sum() > 1e-3
    assert torch.allclose(got, expected_grad, atol=2e-6), (got - expected_grad).abs().max()


def test_grpo_objective():
    # DeepSeekMath eq. 3-4: J = 1/N sum_i 1/|o_i| sum_t [min(r A, clip(r, 0.8, 1.2) A) - beta D_KL],
    # D_KL = pi_ref/pi - log(pi_ref/pi) - 1, beta 0.04, A = (R - mean) / std (sample std)
    _, lp, old, ref, _ = toy()
    adv = group_norm_adv(REWARDS)

    def objective(theta):
        total = 0
        for i in range(B):
            inner = 0
            for t in range(LENGTHS[i]):
                r = torch.exp(theta[i, t] - old[i, t])
                d = ref[i, t] - theta[i, t]
                inner = inner + ppo_term(r, adv[i], 0.8, 1.2) - 0.04 * (torch.exp(d) - d - 1)
            total = total + inner / LENGTHS[i]
        return total / B
    check("grpo", grad_of(objective, lp))


def test_dapo_objective():
    # DAPO eq. 12: J = 1/sum|o_i| sum_i sum_t min(r A, clip(r, 1 - 0.2, 1 + 0.28) A), no KL
    _, lp, old, _, _ = toy()
    adv = group_norm_adv(REWARDS)
    check("dapo", grad_of(lambda th: token_ppo_objective(th, old, lambda i, t: adv[i], 0.8, 1.28, False)
                          / sum(LENGTHS), lp))


def test_dr_grpo_objective():
    # Dr. GRPO: A = R - mean (no std), J = 1/N sum_i sum_t min(...) / L_max, L_max = 256 (max_tokens)
    _, lp, old, _, _ = toy()
    adv = [0.0] * B
    for rows in groups().values():
        mean = statistics.mean(REWARDS[i] for i in rows)
        for i in rows:
            adv[i] = REWARDS[i] - mean
    check("dr_grpo", grad_of(lambda th: token_ppo_objective(th, old, lambda i, t: adv[i], 0.8, 1.2, False)
                             / (256 * B), lp))


def test_gspo_objective():
    # GSPO eq. 5-7: s_i = exp(1/|y_i| sum_t log(pi/pi_old)); J = 1/N sum_i min(s A, clip(s, 1-3e-4, 1+4e-4) A).
    # Per-row mean log-ratios c chosen around the tiny clip range: inside (1e-4, -2e-4), above
    # (1e-3, 6e-4), below (-1e-3, -6e-4).
    _, lp, _, _, _ = toy()
    c = [1e-4, 1e-3, -1e-3, -2e-4, 6e-4, -6e-4]
    old = lp - torch.tensor(c).unsqueeze(-1)
    adv = group_norm_adv(REWARDS)

    def objective(theta):
        total = 0
        for i in range(B):
            s = torch.exp(sum(theta[i, t] - old[i, t] for t in range(LENGTHS[i])) / LENGTHS[i])
            total = total + ppo_term(s, adv[i], 1 - 3e-4, 1 + 4e-4)
        return total / B
    check("gspo", grad_of(objective, lp), old=old)


def test_cispo_objective():
    # MiniMax-M1 eq. 4: J = 1/sum|o_i| sum_i sum_t sg(min(r, 5)) A log pi; two tokens get r = e^2 > 5
    _, lp, old, _, _ = toy()
    old = old.clone()
    old[0, :2] = lp[0, :2] - 2.0
    adv = group_norm_adv(REWARDS)

    def objective(theta):
        total = 0
        for i in range(B):
            for t in range(LENGTHS[i]):
                w = min(math.exp(float(theta[i, t].detach() - old[i, t])), 5.0)
                total = total + w * adv[i] * theta[i, t]
        return total / sum(LENGTHS)
    check("cispo", grad_of(objective, lp), old=old)


def test_rloo_objective():
    # RLOO eq. 6 (on-policy): s_i = R_i - beta sum_t (log pi - log ref), beta 0.05 (KL in the reward);
    # A_i = s_i - mean_{j != i} s_j within the prompt; grad J = 1/N sum_i A_i grad sum_t log pi
    _, lp, _, ref, _ = toy()
    s = [REWARDS[i] - 0.05 * sum(float(lp[i, t] - ref[i, t]) for t in range(LENGTHS[i])) for i in range(B)]
    adv = [0.0] * B
    for rows in groups().values():
        for i in rows:
            others = [s[j] for j in rows if j != i]
            adv[i] = s[i] - sum(others) / len(others)

    def objective(theta):
        return sum(adv[i] * sum(theta[i, t] for t in range(LENGTHS[i])) for i in range(B)) / B
    check("rloo", grad_of(objective, lp), on_policy=True)


def reward_per_token(old, ref, beta):
    """r_it = -beta (log pi_old - log ref) + R_i on the last token (KL in reward, k1)."""
    return [[-beta * float(old[i, t] - ref[i, t]) + (REWARDS[i] if t == LENGTHS[i] - 1 else 0.0)
             for t in range(LENGTHS[i])] for i in range(B)]


def whiten(adv):
    flat = [a for row in adv for a in row]
    mean, std = statistics.mean(flat), statistics.pstdev(flat)
    return [[(a - mean) / (std + 1e-6) for a in row] for row in adv]


def test_reinforce_pp_objective():
    # REINFORCE++ Sec. 3: r_t = -beta k1_t (+ R at the end), beta 0.01; G_t = sum_{t' >= t} r_t';
    # A = whiten(G) over all tokens of the batch; J = 1/sum|o| sum min(r A, clip(r, 0.8, 1.2) A)
    _, lp, old, ref, _ = toy()
    rew = reward_per_token(old, ref, 0.01)
    adv = whiten([[sum(row[t:]) for t in range(len(row))] for row in rew])
    check("reinforce_pp", grad_of(lambda th: token_ppo_objective(th, old, lambda i, t: adv[i][t], 0.8, 1.2, False)
                                  / sum(LENGTHS), lp))


def gae_by_hand(old, ref, values, gamma=1.0, lam=0.95):
    rew = reward_per_token(old, ref, 0.01)
    adv, ret = [], []
    for i in range(B):
        v = [float(values[i, t]) for t in range(LENGTHS[i])] + [0.0]
        a, row = 0.0, []
        for t in reversed(range(LENGTHS[i])):
            a = rew[i][t] + gamma * v[t + 1] - v[t] + gamma * lam * a
            row.insert(0, a)
        adv.append(row)
        ret.append([row[t] + v[t] for t in range(LENGTHS[i])])
    return whiten(adv), ret


def test_ppo_objective_and_value_loss():
    # PPO eq. 7 with GAE (gamma 1, lam 0.95; Schulman 2016 eq. 16), k1 KL (beta 0.01) in the
    # per-token reward, advantages whitened over the batch, token mean over the step
    _, lp, old, ref, values = toy()
    adv, ret = gae_by_hand(old, ref, values)
    check("ppo", grad_of(lambda th: token_ppo_objective(th, old, lambda i, t: adv[i][t], 0.8, 1.2, False)
                         / sum(LENGTHS), lp))
    # value loss: 0.5 max((V - R)^2, (V_old + clip(V - V_old, +-0.2) - R)^2), token mean
    _, run, batch, _ = run_bundle("ppo", lp, old, ref, values)
    new_v = values + torch.linspace(-0.5, 0.5, T)
    v1 = new_v.clone().requires_grad_(True)
    run.baseline.value_loss(values=v1, old_values=batch.values, returns=batch.returns,
                            response_mask=batch.response_mask, totals=step_totals(batch)).backward()
    v2 = new_v.clone().requires_grad_(True)
    total = 0
    for i in range(B):
        for t in range(LENGTHS[i]):
            clipped = values[i, t] + torch.clamp(v2[i, t] - values[i, t], -0.2, 0.2)
            total = total + 0.5 * torch.maximum((v2[i, t] - ret[i][t]) ** 2, (clipped - ret[i][t]) ** 2)
    (total / sum(LENGTHS)).backward()
    assert v2.grad.abs().sum() > 1e-3 and torch.allclose(v1.grad, v2.grad, atol=1e-6)


# ----------------------------------------------------------------------------- first update
@pytest.mark.parametrize("name", BUNDLES)
@pytest.mark.parametrize("old_given", [False, True])
def test_first_update_ratio_exactly_one_and_no_clipping(name, old_given):
    # on the first update after sampling old = current: every ratio is exp(0) = 1 exactly (token) or
    # exp(mean of zeros) = 1 (sequence), so nothing is clipped. old_given=False is the on-policy path
    # (old_logprobs None -> logprobs.detach()); True passes an equal copy explicitly.
    _, lp, _, ref, values = toy()
    _, run, batch, sums = run_bundle(name, lp, lp.detach().clone(), ref, values, on_policy=not old_given)
    n = float(batch.response_mask.sum())
    assert sums["ratio_mean"] == (n, n)
    assert sums["clip_frac_low"] == (0.0, n) and sums["clip_frac_high"] == (0.0, n)
    ratio = run.hook.ratio(logprobs=lp.clone().requires_grad_(True), old_logprobs=lp.clone(),
                           rollout_logprobs=lp.clone(), response_mask=batch.response_mask)
    assert torch.equal(ratio.detach(), torch.ones(B, T))


@pytest.mark.parametrize("name", BUNDLES)
def test_bundles_assemble_without_warnings_and_give_finite_grads(name):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policyzoo.assemble(name)
    _, lp, old, ref, values = toy()
    grad, *_ = run_bundle(name, lp, old, ref, values)
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[:, -1], torch.zeros(B))  # the padding column gets no gradient


def test_every_component_documents_its_parameters_and_source():
    from policyzoo.plugins import MODULES

    for module in MODULES:
        for cls in module.COMPONENTS:
            doc = cls.__doc__ or ""
            assert "Source" in doc or "Sources" in doc, cls.__qualname__
            for key, field in cls.Params.model_fields.items():
                assert field.description, f"{cls.name}.{key} has no description"
