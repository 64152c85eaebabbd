"""Held-out evaluation: ``eval.n`` responses to fixed problems (greedy by default), scored by the
task's own rewards, with pass@k, maj@k and mean@k.

Conventions (stated here, pinned by ``tests/test_eval_passk.py``):

* A response is *correct* when its weighted task reward is ``>= eval.pass_threshold`` (1.0: full
  marks of a 0/1 reward); an unscorable (NaN) response is not correct.
* ``pass@k``: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
  Trained on Code", arXiv:2107.03374, eq. 1) from all n responses of a problem with c correct,
  ``1 - C(n-c, k) / C(n, k)``, averaged over problems.
* ``maj@k``: the answer most of the first k responses give (the number ``extract_number`` reads,
  else the stripped text; ties: the answer seen first) is correct -- the majority vote of
  self-consistency (Wang et al. 2022, arXiv:2203.11171), counted as correct when that answer's
  first response is correct.
* ``mean@k``: the mean reward over the k responses of a problem, averaged over problems (reported
  for k = n; it equals ``eval_accuracy``, the mean over every response with NaN left out).
* ``eval_accuracy/<task>``: for rows that name their task in ``_task`` (a mixture of
  reasoning-gym tasks), ``eval_accuracy`` over that task's rows alone (NaN left out).
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from policyzoo.data.answers import extract_number
from policyzoo.step.episodes import episode_sums, run_episodes


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` responses, ``c`` correct (Chen et al. 2021, eq. 1),
    ``1 - C(n-c, k) / C(n, k)`` computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (no large
    binomials). Raises ValueError unless ``0 <= c <= n`` and ``1 <= k <= n``."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_correct(answers: list[str], correct: list[bool]) -> bool:
    """Whether the majority answer of ``answers`` (ties: the one seen first) is correct, judged by
    the first response that gave it."""
    counts = Counter(answers)
    best = max(counts.values())
    winner = next(a for a in answers if counts[a] == best)
    return correct[answers.index(winner)]


def vote_key(text: str) -> str:
    number = extract_number(text)
    return str(number.normalize()) if number is not None else text.strip()


def sample_metrics(scores: torch.Tensor, texts: list[str], ks: list[int], threshold: float) -> dict:
    """pass@k, maj@k (each k of ``ks``) and mean@n from ``scores [P, n]`` and the P x n response
    texts (prompt-major), see the module docstring."""
    p, n = scores.shape
    correct = (scores >= threshold) & ~torch.isnan(scores)  # NaN >= x is False already; explicit
    out = {}
    for k in ks:
        out[f"eval_pass@{k}"] = sum(pass_at_k(n, int(correct[i].sum()), k) for i in range(p)) / p
        out[f"eval_maj@{k}"] = sum(majority_correct([vote_key(t) for t in texts[i * n:i * n + k]],
                                                    correct[i, :k].tolist()) for i in range(p)) / p
    means = [float(row[~torch.isnan(row)].mean()) for row in scores if (~torch.isnan(row)).any()]
    out[f"eval_mean@{n}"] = sum(means) / len(means) if means else math.nan
    return out


def per_task_accuracy(total: torch.Tensor, tasks: list, n: int) -> dict:
    """``{"eval_accuracy/<task>": mean}`` from ``total [P * n]`` (prompt-major: row i's responses are
    ``i * n .. i * n + n - 1``) and each row's task name (None: no task; ``{}`` when none has one);
    NaN scores left out, NaN for a task with none scorable."""
    out = {}
    for task in dict.fromkeys(t for t in tasks if t is not None):
        idx = [i * n + j for i, t in enumerate(tasks) if t == task for j in range(n)]
        scores = total[idx]
        scores = scores[~torch.isnan(scores)]
        out[f"eval_accuracy/{task}"] = float(scores.mean()) if len(scores) else math.nan
    return out


def evaluate(rollout_engine, task_rewards: list, rows: list[dict], max_tokens: int, env=None, policy=None,
             n: int = 1, temperature: float = 0.0, ks: list[int] = (1,), pass_threshold: float = 1.0,
             seed: int = 0) -> dict:
    """``n`` responses (greedy at temperature 0) to each of ``rows``, scored by ``task_rewards``
    (the task's reward components, weighted and summed, without algorithm extras such as DAPO's
    overlong penalty). ``eval_accuracy`` is the mean score over every response: the fraction
    answered correctly for 0/1 rewards such as ``answer_match``, ``math_verify`` and the
    calculator's ``env_reward``; NaN scores are left out. ``eval_pass@k``, ``eval_maj@k`` (each k of
    ``ks``) and ``eval_mean@n`` follow the module docstring. With an ``env`` each response is an
    episode driven through ``policy`` (``max_tokens`` per model turn) and the episode metrics are
    reported with an ``eval_`` prefix (``eval_env_tool_call_frac``: the fraction of episodes that
    called a tool). ``seed`` seeds sampled (temperature > 0) responses."""
    if not rows:
        return {}
    extra: dict = {}
    if env is not None:
        r = run_episodes(policy, env, rows, n, max_tokens, temperature, seed=seed)
        extra = {f"eval_{k}": v / len(r) for k, v in episode_sums(r).items()}
    elif n == 1 and temperature == 0:
        r = rollout_engine.greedy(rows, max_tokens)
    else:
        r = rollout_engine.generate(rows, n, max_tokens, temperature, seed)
    total = torch.zeros(len(r))
    for comp in task_rewards:
        total = total + comp.params.weight * torch.as_tensor(comp.reward(rollout=r), dtype=torch.float32)
    valid = ~torch.isnan(total)
    lengths = r.response_mask.sum(-1).float()
    extra.update(per_task_accuracy(total, [row.get("_task") for row in rows], n))
    return {"eval_accuracy": float(total[valid].mean()) if valid.any() else float("nan"),
            "eval_rows": len(rows), "eval_n": n, "eval_response_length_mean": float(lengths.mean()),
            "eval_truncated_frac": float(r.truncated.float().mean()),
            **sample_metrics(total.view(len(rows), n), list(r.completions), list(ks), pass_threshold),
            "eval_example": r.completions[0][:200], **extra}
