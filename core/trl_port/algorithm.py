"""The algorithm slots of a TRL ``GRPOConfig`` (TRL 1.16 ``GRPOTrainer._compute_loss`` and its advantages).

* ``loss_type`` -> clip and reduce: grpo / sapo -> ``seq_mean_token_mean``; dapo / cispo / vespo
  (and bnpo with one micro-batch on one rank) -> ``token_mean``; dr_grpo -> ``token_sum_norm``
  with ``constant = max_completion_length``; luspo -> ``seq_mean_token_sum``. The clip is
  ``ppo_clip`` (``epsilon``, ``epsilon_high``, ``delta``), ``cispo`` (cap ``epsilon_high``),
  ``sapo`` (the policyzoo-sapo plugin) or ``vespo``.
* ``importance_sampling_level`` / the vLLM IS correction / ``off_policy_mask_threshold`` -> the one
  ratio component (``token``, ``sequence``, ``tis``, ``mis``, ``opsm``); two at once are refused.
* ``beta`` -> ``kl: k3`` (none at 0, TRL's default) with ``times_ratio = use_bias_correction_kl``.
* ``scale_rewards`` / ``multi_objective_aggregation`` -> ``group_norm`` (``scale`` group or batch),
  ``group_mean`` (none) or ``gdpo`` (normalize_then_sum), ``zero_std_tol: 0`` (TRL has no tolerance).
* ``entropy_coef`` / ``use_adaptive_entropy`` -> ``term: entropy`` / ``entropy_adaptive``.
* ``conventions: trl`` sets the rest (std eps 1e-4, sample std, empty rows counted, NaN rewards nansum).
"""

from __future__ import annotations

from typing import Any

from ..catalog import get_catalog

REDUCE = {"grpo": "seq_mean_token_mean", "sapo": "seq_mean_token_mean", "dapo": "token_mean", "cispo": "token_mean",
          "vespo": "token_mean", "bnpo": "token_mean", "dr_grpo": "token_sum_norm", "luspo": "seq_mean_token_sum"}
PPO_FAMILY = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def algorithm(r, world: int) -> dict[str, Any]:
    """The ``algorithm:`` mapping of the TRL keys read by ``r`` (a :class:`~policyzoo.trl_port.port._Reader`)."""
    lt = r("loss_type")
    if lt not in REDUCE:
        r.refuse("loss_type", f"TRL 1.16's loss types are {', '.join(REDUCE)}")
    if lt == "bnpo" and (r("gradient_accumulation_steps") != 1 or world != 1):
        r.refuse("loss_type", "TRL's bnpo averages each micro-batch's token mean, which equals policyzoo's "
                 "token_mean only with one micro-batch on one rank (gradient_accumulation_steps=1)",
                 "use loss_type: dapo (the step's token mean), or gradient_accumulation_steps: 1 on one rank")
    out: dict[str, Any] = {"base": "grpo", "conventions": "trl"}
    out["sample"] = {"use": "group", "n": r("num_generations"), "max_tokens": r("max_completion_length"),
                     "temperature": r("temperature"), "top_p": r("top_p"), "top_k": r("top_k"),
                     "min_p": r("min_p") or 0.0, "repetition_penalty": r("repetition_penalty")}
    r.origins["algorithm.sample"] = r.src("num_generations", "max_completion_length", "temperature", "top_p", "top_k",
                                          "min_p", "repetition_penalty")
    beta = r("beta")
    out["kl"] = None if beta == 0 else {"use": "k3", "beta": beta, "times_ratio": bool(r("use_bias_correction_kl")),
                                        "placement": "loss"}
    r.origins["algorithm.kl"] = r.src("beta", "use_bias_correction_kl") if beta else r.src("beta")
    out["baseline"] = _baseline(r)
    out["ratio"] = _ratio(r, lt)
    out["clip"] = _clip(r, lt)
    out["reduce"] = {"use": REDUCE[lt]}
    r.origins["algorithm.reduce"] = r.src("loss_type")
    if lt == "dr_grpo":
        out["reduce"]["constant"] = float(r("max_completion_length"))
        r.origins["algorithm.reduce"] = r.src("loss_type", "max_completion_length")
    out["term"] = _term(r, lt, world)
    return out


def _baseline(r) -> dict:
    scale = {True: "group", False: "none"}.get(r("scale_rewards"), r("scale_rewards"))
    if scale not in ("group", "batch", "none"):
        r.refuse("scale_rewards", "TRL's values are group, batch and none")
    agg = r("multi_objective_aggregation")
    if agg == "normalize_then_sum":
        r.origins["algorithm.baseline"] = r.src("multi_objective_aggregation")
        return {"use": "gdpo", "zero_std_tol": 0.0}
    if agg != "sum_then_normalize":
        r.refuse("multi_objective_aggregation", "TRL's values are sum_then_normalize and normalize_then_sum")
    r.origins["algorithm.baseline"] = r.src("scale_rewards", "multi_objective_aggregation")
    if scale == "none":
        return {"use": "group_mean"}
    return {"use": "group_norm", "scale": scale, "zero_std_tol": 0.0}


def _ratio(r, lt: str) -> dict:
    level = r("importance_sampling_level")
    if level not in ("token", "sequence"):
        r.refuse("importance_sampling_level", "TRL's levels are token and sequence")
    correction = bool(r("use_vllm") and r("vllm_importance_sampling_correction"))
    opsm = r("off_policy_mask_threshold") is not None
    keys = [k for k, on in (("importance_sampling_level", level == "sequence"),
                            ("vllm_importance_sampling_correction", correction),
                            ("off_policy_mask_threshold", opsm)) if on]
    if correction and lt == "vespo":
        r.refuse("vllm_importance_sampling_correction", "TRL's vespo feeds the vLLM IS ratio into its Gamma weight; "
                 "policyzoo's vespo clip has no such input", "set vllm_importance_sampling_correction: false")
    if len(keys) > 1:
        r.refuse(keys[1], f"policyzoo's ratio slot holds one component, and {keys[0]} already chose it "
                 f"({' and '.join(keys)} together have no single policyzoo ratio)")
    if correction:
        return _correction(r)
    if opsm:
        r.origins["algorithm.ratio"] = r.src("off_policy_mask_threshold")
        return {"use": "opsm", "threshold": r("off_policy_mask_threshold")}
    r.origins["algorithm.ratio"] = r.src("importance_sampling_level")
    return {"use": level}


def _correction(r) -> dict:
    mode = r("vllm_importance_sampling_mode")
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        r.refuse("vllm_importance_sampling_mode", "TRL's modes are token/sequence _truncate/_mask")
    cap = r("vllm_importance_sampling_cap")
    hi = cap if cap is not None else r("vllm_importance_sampling_clip_max")
    lo = r("vllm_importance_sampling_clip_min")
    if hi is None:
        r.refuse("vllm_importance_sampling_clip_max", "policyzoo's tis and mis need an upper bound")
    level, kind = mode.split("_")
    r.origins["algorithm.ratio"] = r.src("use_vllm", "vllm_importance_sampling_correction",
                                         "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                                         "vllm_importance_sampling_clip_min", "importance_sampling_level")
    if kind == "truncate":
        return {"use": "tis", "level": level, "cap": hi, "floor": lo}
    return {"use": "mis", "level": level, "high": hi, "low": lo}


def _clip(r, lt: str) -> dict:
    eps, high = r("epsilon"), r("epsilon_high")
    high = eps if high is None else high
    if lt in PPO_FAMILY:
        r.origins["algorithm.clip"] = r.src("loss_type", "epsilon", "epsilon_high", "delta")
        out = {"use": "ppo_clip", "eps_low": eps, "eps_high": high}
        if r("delta") is not None:
            out["dual_clip"] = r("delta")
        return out
    if lt == "cispo":
        r.origins["algorithm.clip"] = r.src("loss_type", "epsilon_high", "epsilon")
        return {"use": "cispo", "eps_high": high}
    if lt == "sapo":
        if "sapo" not in get_catalog().components["clip"]:
            r.refuse("loss_type", "the sapo clip comes from the plugin distribution policyzoo-sapo, which is not "
                     "installed", "pip install contrib/policyzoo-sapo")
        r.origins["algorithm.clip"] = r.src("loss_type", "sapo_temperature_pos", "sapo_temperature_neg")
        return {"use": "sapo", "tau_pos": r("sapo_temperature_pos"), "tau_neg": r("sapo_temperature_neg")}
    r.origins["algorithm.clip"] = r.src("loss_type", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
                                        "vespo_lambda_neg")
    return {"use": "vespo", "k_pos": r("vespo_k_pos"), "lambda_pos": r("vespo_lambda_pos"),
            "k_neg": r("vespo_k_neg"), "lambda_neg": r("vespo_lambda_neg")}


def _term(r, lt: str, world: int) -> list:
    adaptive, coef = r("use_adaptive_entropy"), r("entropy_coef")
    if not adaptive and coef == 0:
        r.origins["algorithm.term"] = r.src("entropy_coef", "use_adaptive_entropy")
        return []
    key = "use_adaptive_entropy" if adaptive else "entropy_coef"
    if REDUCE[lt] != "token_mean" or r("gradient_accumulation_steps") != 1 or world != 1:
        r.refuse(key, "TRL's entropy bonus is the token mean of each micro-batch, whatever the loss type; "
                 "policyzoo adds the entropy per token before the run's reduce, which agrees only for a "
                 "token-mean loss (dapo, cispo, vespo) with one micro-batch on one rank",
                 "use loss_type: dapo with gradient_accumulation_steps: 1, or drop the entropy bonus")
    if adaptive:
        r.origins["algorithm.term"] = r.src("use_adaptive_entropy", "entropy_coef", "entropy_target",
                                            "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
        return [{"use": "entropy_adaptive", "coef": coef, "target": r("entropy_target"),
                 "delta": r("entropy_coef_delta"), "coef_min": r("entropy_coef_min"),
                 "coef_max": r("entropy_coef_max")}]
    r.origins["algorithm.term"] = r.src("entropy_coef")
    return [{"use": "entropy", "coef": coef}]
