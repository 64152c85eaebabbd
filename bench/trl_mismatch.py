"""Numeric agreement with TRL 1.16's rollout/trainer mismatch corrections: loss and gradient.

TRL's vLLM importance sampling (``vllm_importance_sampling_mode``: ``token_truncate``,
``token_mask``, ``sequence_truncate``, ``sequence_mask``) and off-policy sequence masking
(``off_policy_mask_threshold``) against ours (``ratio: tis``, ``mis``, ``icepop``, ``opsm``, all
with the weight on the loss), on identical float64 tensors with a sampler that differs from the
trainer.

TRL computes the IS ratio inline in ``GRPOTrainer._generate_and_score_completions`` (which also
generates), so :func:`trl_is_ratio` runs that very block of TRL's source -- the lines from
"# Compute the importance sampling ratio when using vLLM" up to "# Compute the per-token log
probabilities for the reference model", dedented -- on a stand-in ``self`` and our tensors. The
loss is TRL's own ``_compute_loss`` (the stand-in of ``bench/trl_agreement.py``) with
``inputs["importance_sampling_ratio"]`` and ``inputs["sampling_per_token_logps"]`` set as TRL sets them.
Run: ``python bench/trl_mismatch.py`` (prints a markdown table).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import textwrap
from pathlib import Path

import torch

import policyzoo
from policyzoo.contract import Rollout, StepBatch
from policyzoo.step import micro_loss, prepare, step_totals

_spec = importlib.util.spec_from_file_location("trl_agreement", Path(__file__).with_name("trl_agreement.py"))
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)

START = "# Compute the importance sampling ratio when using vLLM"
END = "# Compute the per-token log probabilities for the reference model"
#: our GRPO with TRL's std eps; TRL's KL-times-ratio off (compared in bench/trl_agreement.py)
GRPO = {"base": "grpo", "baseline": {"eps": 1e-4, "zero_std_tol": 0.0}}
TRL_GRPO = dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False)

#: (label, our ratio, TRL GRPOConfig kwargs, mismatch scale of the case)
CASES = [
    ("tis sequence, cap 1.5", {"use": "tis", "level": "sequence", "cap": 1.5},
     dict(use_vllm=True, vllm_importance_sampling_mode="sequence_truncate", vllm_importance_sampling_clip_max=1.5),
     0.3),
    ("tis token, cap 1.2, floor 0.9", {"use": "tis", "level": "token", "cap": 1.2, "floor": 0.9},
     dict(use_vllm=True, vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.2,
          vllm_importance_sampling_clip_min=0.9), 0.15),
    ("mis sequence, high 1.5 (TRL's default mode, sequence_mask)", {"use": "mis", "high": 1.5},
     dict(use_vllm=True, vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_max=1.5), 0.3),
    ("mis token, band [0.8, 1.2]", {"use": "mis", "level": "token", "low": 0.8, "high": 1.2},
     dict(use_vllm=True, vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.8,
          vllm_importance_sampling_clip_max=1.2), 0.15),
    ("icepop (token band [0.5, 5])", {"use": "icepop"},
     dict(use_vllm=True, vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.5,
          vllm_importance_sampling_clip_max=5.0), 1.0),
    ("opsm, threshold 0.05", {"use": "opsm", "threshold": 0.05}, dict(off_policy_mask_threshold=0.05), 0.15),
]


def make_case(mismatch: float, seed: int = 1) -> tuple[ta.Case, torch.Tensor]:
    """bench/trl_agreement.py's ragged batch plus sampler log-probs ``rollout [B, T]`` = old +
    ``mismatch`` x N(0, 1) on valid tokens, 0 on padding (as our engine gives them)."""
    case = ta.make_case()
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(case.old.shape, generator=g, dtype=torch.float64)
    return case, torch.where(case.mask, case.old + mismatch * noise, torch.zeros_like(case.old))


def ours(ratio: dict, case: ta.Case, rollout: torch.Tensor):
    """(loss, d loss / d logprobs, advantages [B], the ratio's Importance) through the hooks."""
    run = policyzoo.assemble({**GRPO, "ratio": ratio})
    b = len(case.rewards)
    r = Rollout(prompt_ids=[[1]] * b, response_ids=torch.ones(b, ta.T, dtype=torch.long),
                response_mask=case.mask.clone(), rollout_logprobs=rollout.clone(), group_ids=case.group_ids.clone(),
                truncated=torch.zeros(b, dtype=torch.bool))
    batch, _ = prepare(run, StepBatch(r, case.rewards.clone(), old_logprobs=case.old.clone(),
                                      ref_logprobs=case.ref.clone()))
    lp = case.logprobs.clone().requires_grad_(True)
    loss, _ = micro_loss(run, batch, lp, step_totals(batch))
    loss.backward()
    imp = run.ratio.ratio(logprobs=lp.detach(), old_logprobs=case.old, rollout_logprobs=rollout,
                          response_mask=case.mask, advantages=batch.advantages)
    adv = (batch.advantages * case.mask).sum(-1) / case.mask.sum(-1).clamp(min=1)
    return float(loss.detach()), lp.grad.detach(), adv.detach(), imp


def trl_is_ratio(args, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's ``vllm_importance_sampling_ratio`` (``[B, T]`` token modes, ``[B, 1]`` sequence modes):
    the block of ``_generate_and_score_completions`` that computes it, run as TRL wrote it."""
    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = src.rindex("\n", 0, src.index(START)) + 1
    end = src.rindex("\n", 0, src.index(END)) + 1
    stand_in = type("StandIn", (), {})()
    for k in ("use_vllm", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
              "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"):
        setattr(stand_in, k, getattr(args, k))
    scope = {"self": stand_in, "torch": torch, "math": math, "completion_mask": mask.to(old.dtype), "tool_mask": None,
             "old_per_token_logps": old, "sampling_per_token_logps": sampling}
    exec(compile(textwrap.dedent(src[start:end]), "trl/trainer/grpo_trainer.py (IS block)", "exec"), scope)
    return scope["vllm_importance_sampling_ratio"]


def trl(config_kw: dict, case: ta.Case, rollout: torch.Tensor, advantages: torch.Tensor):
    """(loss, d loss / d logprobs, TRL's IS ratio or None) from TRL's ``_compute_loss`` with our advantages."""
    from trl import GRPOTrainer

    args = ta.trl_config(**TRL_GRPO, **config_kw)
    lp = case.logprobs.clone().requires_grad_(True)
    b = len(case.rewards)
    inputs = {
        "prompt_ids": torch.ones(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.ones(b, ta.T, dtype=torch.long), "completion_mask": case.mask.to(torch.long),
        "advantages": advantages, "old_per_token_logps": case.old.clone(), "ref_per_token_logps": case.ref.clone(),
        "num_items_in_batch": case.mask.sum().to(torch.float64), "sampling_per_token_logps": rollout.clone(),
    }
    is_ratio = None
    if args.use_vllm and args.vllm_importance_sampling_correction:
        is_ratio = inputs["importance_sampling_ratio"] = trl_is_ratio(args, case.old, rollout, case.mask)
    loss = GRPOTrainer._compute_loss(ta.TRLStandIn(args, lp), None, inputs)
    loss.backward()
    return float(loss.detach()), lp.grad.detach(), is_ratio


def compare(label: str) -> dict:
    """Both sides on the case of ``label`` (TRL gets our advantages: only the correction differs)."""
    _, ratio, kw, scale = {c[0]: c for c in CASES}[label]
    case, rollout = make_case(scale)
    lo, go, adv, imp = ours(ratio, case, rollout)
    lt, gt, is_ratio = trl(kw, case, rollout, adv)
    return dict(loss_ours=lo, loss_trl=lt, grad_ours=go, grad_trl=gt, importance=imp, is_ratio=is_ratio, case=case)


def main() -> None:
    import trl as trl_pkg

    torch.set_num_threads(1)
    print(f"TRL {trl_pkg.__version__}, policyzoo {policyzoo.__version__}; B=8, T={ta.T}, float64, "
          "TRL given our advantages\n")
    print("| case | loss ours | loss TRL | max abs grad diff (max abs grad) | tokens truncated / masked |")
    print("|---|---|---|---|---|")
    for label, *_ in CASES:
        r = compare(label)
        imp, m = r["importance"], r["case"].mask
        hits = [int((x & m).sum()) if x is not None else 0 for x in (imp.truncated, imp.masked)]
        print(f"| {label} | {r['loss_ours']:.10f} | {r['loss_trl']:.10f} | "
              f"{float((r['grad_ours'] - r['grad_trl']).abs().max()):.1e} ({float(r['grad_trl'].abs().max()):.3f}) | "
              f"{hits[0]} / {hits[1]} of {int(m.sum())} |")


if __name__ == "__main__":
    main()
