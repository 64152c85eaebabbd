"""Numeric agreement with verl's own advantage estimators, read from a verl checkout.

verl is not a dependency (it pulls in Ray and its own engine), so this script loads the estimator
functions straight from a checkout's ``verl/trainer/ppo/core_algos.py`` (and ``masked_whiten`` from
``verl/utils/torch_functional.py``): each function's definition is compiled on its own, without
its registry decorator, in a namespace holding torch, numpy and ``defaultdict``. Nothing of verl is
copied here. Both sides get the same float64 batch: P = 3 prompts x G = 4, ragged lengths,
rewards in {0, 0.5, 1} with ties, verl's outcome reward on each row's last token.

Run: ``python bench/verl_agreement.py /path/to/verl`` (a clone of volcengine/verl); prints one row
per estimator: ours (with the setting that matches verl), verl's function, max |difference|.
"""

from __future__ import annotations

import ast
import sys
import types
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from policyzoo.plugins.baseline import (
    GPG,
    OPO,
    BatchWhiten,
    GRPOPassK,
    OptimalTokenBaseline,
    ReinforcePPBaseline,
    ReMax,
    TIROptimalTokenBaseline,
)
from policyzoo.testing.ranks import advantages


def load(root: Path, file: str, names: set[str], env: dict) -> dict:
    """The top-level functions ``names`` of ``root/file``, compiled without decorators into ``env``."""
    tree = ast.parse((root / file).read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            exec(compile(ast.Module([node], []), file, "exec"), env)  # noqa: S102 - the user's verl checkout
    return env


#: our component -> verl's adv_estimator name where they differ
ESTIMATOR = {"reinforce_pp_baseline": "reinforce_plus_plus_baseline", "batch_whiten": "reinforce_plus_plus"}


class _Config(dict):
    __getattr__ = dict.__getitem__


def main(root: Path) -> None:
    tf = load(root, "verl/utils/torch_functional.py", {"masked_sum", "masked_mean", "masked_var", "masked_whiten"},
              {"torch": torch})
    env = {"torch": torch, "np": np, "defaultdict": defaultdict, "Optional": __import__("typing").Optional,
           "AlgoConfig": dict, "verl_F": types.SimpleNamespace(**tf)}
    verl = load(root, "verl/trainer/ppo/core_algos.py", {
        "compute_grpo_passk_outcome_advantage", "compute_opo_outcome_advantage", "compute_gpg_outcome_advantage",
        "compute_remax_outcome_advantage", "compute_reinforce_plus_plus_baseline_outcome_advantage",
        "compute_reinforce_plus_plus_outcome_advantage", "compute_optimal_token_baseline_advantage",
        "compute_multi_turn_optimal_token_baseline_advantage"}, env)

    g = torch.Generator().manual_seed(0)
    b, t = 12, 7
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    r = torch.randint(0, 3, (b,), generator=g).double() / 2
    r[5] = r[4]
    index, gid = np.arange(b) // 4, torch.arange(b) // 4
    greedy = torch.rand(b, generator=g, dtype=torch.float64)
    old = torch.log(torch.rand(b, t, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    pi2 = torch.rand(b, t, generator=g, dtype=torch.float64) * 0.5 + 0.1
    holes = mask.clone()
    holes[0, 0] = holes[3, 1] = False  # multi-turn: tool tokens inside the response

    def last_token(m):
        tok = torch.zeros(b, t, dtype=torch.float64)
        tok[torch.arange(b), torch.where(m, torch.arange(t)[None], -1).max(-1).values] = r
        return tok

    tok, m = last_token(mask), mask.double()
    rows = [  # (ours with the setting that matches verl, component, extra hook arguments, verl's result)
        ("grpo_passk", GRPOPassK(), {}, lambda: verl["compute_grpo_passk_outcome_advantage"](
            tok.clone(), m, index, config=_Config(norm_adv_by_std_in_grpo=True))),
        ("opo", OPO(), {}, lambda: verl["compute_opo_outcome_advantage"](tok.clone(), m, index)),
        ("gpg alpha=nonzero_rewards", GPG(alpha="nonzero_rewards"), {},
         lambda: verl["compute_gpg_outcome_advantage"](tok.clone(), m, index)),
        ("remax", ReMax(), {"greedy_rewards": greedy},
         lambda: verl["compute_remax_outcome_advantage"](tok.clone(), greedy, m)),
        ("reinforce_pp_baseline whiten_std=sample whiten_eps=0",
         ReinforcePPBaseline(whiten_std="sample", whiten_eps=0.0), {},
         lambda: verl["compute_reinforce_plus_plus_baseline_outcome_advantage"](tok.clone(), m, index)),
        ("batch_whiten whiten_std=sample whiten_eps=0", BatchWhiten(whiten_std="sample", whiten_eps=0.0), {},
         lambda: verl["compute_reinforce_plus_plus_outcome_advantage"](tok.clone(), m, config=_Config(gamma=1.0))),
        ("optimal_token_baseline", OptimalTokenBaseline(), {"old_logprobs": old, "sum_pi_squared": pi2},
         lambda: verl["compute_optimal_token_baseline_advantage"](tok.clone(), m, index, old, pi2)),
        ("optimal_token_baseline zero_tail=true", OptimalTokenBaseline(zero_tail=True),
         {"old_logprobs": old, "sum_pi_squared": pi2}, lambda: verl["compute_optimal_token_baseline_advantage"](
             tok.clone(), m, index, old, pi2, handle_zero_tail=True)),
    ]
    print("| ours | verl adv_estimator | max abs diff (max abs) |")
    print("|---|---|---|")
    for label, comp, kw, theirs in rows:
        a = advantages(comp, r.clone(), gid, mask, **kw).advantages
        v = theirs()[0]
        name = ESTIMATOR.get(comp.name, comp.name)
        print(f"| {label} | {name} | {float((a - v).abs().max()):.1e} ({float(v.abs().max()):.3f}) |")
    a = advantages(TIROptimalTokenBaseline(), r.clone(), gid, holes, old_logprobs=old, sum_pi_squared=pi2).advantages
    tir = verl["compute_multi_turn_optimal_token_baseline_advantage"]
    v = tir(last_token(holes), holes.double(), index, old, pi2)[0]
    print(f"| tir_optimal_token_baseline (holes in the mask) | tir_optimal_token_baseline | "
          f"{float((a - v).abs().max()):.1e} ({float(v.abs().max()):.3f}) |")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "verl/trainer/ppo/core_algos.py").is_file():
        sys.exit("usage: python bench/verl_agreement.py PATH_TO_A_VERL_CLONE")
    main(Path(sys.argv[1]))
