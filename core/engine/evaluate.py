"""Held-out evaluation: greedy answers to fixed problems, scored by the task's own rewards."""

from __future__ import annotations

import torch


def evaluate(rollout_engine, task_rewards: list, rows: list[dict], max_tokens: int) -> dict:
    """Greedy (temperature 0) response to each of ``rows``, scored by ``task_rewards`` (the
    task's reward components, weighted and summed, without algorithm extras such as DAPO's
    overlong penalty). ``eval_accuracy`` is the mean score: the fraction answered correctly for
    0/1 rewards such as ``answer_match`` and ``math_verify``. NaN scores are left out of the mean."""
    if not rows:
        return {}
    r = rollout_engine.greedy(rows, max_tokens)
    total = torch.zeros(len(r))
    for comp in task_rewards:
        total = total + comp.params.weight * torch.as_tensor(comp.reward(rollout=r), dtype=torch.float32)
    valid = ~torch.isnan(total)
    lengths = r.response_mask.sum(-1).float()
    return {"eval_accuracy": float(total[valid].mean()) if valid.any() else float("nan"),
            "eval_rows": len(r), "eval_response_length_mean": float(lengths.mean()),
            "eval_truncated_frac": float(r.truncated.float().mean()),
            "eval_example": r.completions[0][:200]}
