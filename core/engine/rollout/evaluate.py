"""Held-out evaluation: greedy answers to fixed problems, scored by the task's own rewards."""

from __future__ import annotations

import torch

from policyzoo.step.episodes import episode_sums, run_episodes


def evaluate(rollout_engine, task_rewards: list, rows: list[dict], max_tokens: int, env=None, policy=None) -> dict:
    """Greedy (temperature 0) response to each of ``rows``, scored by ``task_rewards`` (the
    task's reward components, weighted and summed, without algorithm extras such as DAPO's
    overlong penalty). ``eval_accuracy`` is the mean score: the fraction answered correctly for
    0/1 rewards such as ``answer_match``, ``math_verify`` and the calculator's ``env_reward``.
    NaN scores are left out of the mean. With an ``env`` each row is one greedy episode driven
    through ``policy`` (``max_tokens`` per model turn) and the episode metrics are reported with
    an ``eval_`` prefix (``eval_env_tool_call_frac``: the fraction of episodes that called a tool)."""
    if not rows:
        return {}
    extra: dict = {}
    if env is not None:
        r = run_episodes(policy, env, rows, 1, max_tokens, 0.0, seed=0)
        extra = {f"eval_{k}": v / len(r) for k, v in episode_sums(r).items()}
    else:
        r = rollout_engine.greedy(rows, max_tokens)
    total = torch.zeros(len(r))
    for comp in task_rewards:
        total = total + comp.params.weight * torch.as_tensor(comp.reward(rollout=r), dtype=torch.float32)
    valid = ~torch.isnan(total)
    lengths = r.response_mask.sum(-1).float()
    return {"eval_accuracy": float(total[valid].mean()) if valid.any() else float("nan"),
            "eval_rows": len(r), "eval_response_length_mean": float(lengths.mean()),
            "eval_truncated_frac": float(r.truncated.float().mean()),
            "eval_example": r.completions[0][:200], **extra}
