"""Every bundle trains 2 steps end to end on the tiny Llama through the real path: vLLM rollout
in the training process, DeepSpeed (ZeRO 0-3 across the bundles), a weight sync with the sync
check after every step, checkpoint, export."""

from __future__ import annotations

import math

import pytest
import torch
from _engine_helpers import metrics, run_train, tiny_model
from safetensors.torch import load_file

# bundle -> (ZeRO stage, has kl, needs a critic). Stages spread so that each runs somewhere;
# ZeRO 0 and 3 both carry the sync check (as every run here does).
BUNDLES = {
    "grpo": (3, True, False), "ppo": (2, True, True), "dapo": (1, False, False), "rloo": (0, True, False),
    "reinforce_pp": (0, True, False), "dr_grpo": (0, False, False), "gspo": (3, False, False),
    "cispo": (0, False, False), "luspo": (0, False, False), "gmpo": (2, True, False), "dppo": (0, False, False),
    "clip_cov": (1, False, False), "kl_cov": (0, False, False), "reinforce_pp_baseline": (1, True, False),
    "remax": (0, True, False), "gpg": (2, False, False), "gdpo": (0, True, False), "opo": (1, False, False),
}


@pytest.mark.parametrize("algo", list(BUNDLES))
def test_bundle_trains_end_to_end(tmp_path, algo):
    stage, has_kl, has_critic = BUNDLES[algo]
    out = tmp_path / "run"
    extra = ["train.steps=2", f"engine.zero_stage={stage}", "train.save_every=1"]
    if algo not in ("ppo", "reinforce_pp"):
        extra.append("algorithm.sample.n=4")
    proc = run_train(out, *extra, algo=algo)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr

    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert math.isfinite(r["loss"]) and r["skipped"] == 0
        assert math.isfinite(r["reward_mean"]) and r["rows"] > 0
        assert r["sync_max_diff"] <= 1e-4  # the sync check ran and passed after this step
        for key in ("reward_std", "response_length_mean", "response_length_max", "truncated_frac",
                    "clip_frac_low", "clip_frac_high", "entropy", "zero_std_frac", "kept_frac",
                    "rollout_tokens_per_s", "time_rollout", "time_reward", "time_train", "time_sync"):
            assert key in r and r[key] is not None and math.isfinite(r[key]), key
        assert ("kl_ref" in r) == has_kl
        assert ("value_loss" in r) == has_critic
    assert [r["step"] for r in metrics(out, "eval")] == [0, 2]

    # complete run directory
    for name in ("config.yaml", "resolved.yaml", "metrics.jsonl", "summary.json", "checkpoints/latest.json",
                 "checkpoints/step-000002/state.json", "final/model.safetensors", "final/tokenizer.json"):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "step-000002" / "critic").is_dir() == has_critic
    import json
    summary = json.loads((out / "summary.json").read_text())
    expected = ["policy"] + (["reference"] if has_kl else []) + (["critic"] if has_critic else [])
    assert summary["models_loaded"] == expected

    # weights changed, and the export loads in transformers
    before = load_file(str(tiny_model() / "model.safetensors"))
    after = load_file(str(out / "final" / "model.safetensors"))
    changed = max((after[k] - before[k]).abs().max().item() for k in before if k in after)
    assert changed > 0
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(out / "final"))
    assert torch.isfinite(m(torch.tensor([[1, 2, 3]])).logits).all()


def test_transformers_fallback_rollout_trains_with_the_sync_check(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "engine.rollout=transformers", algo="grpo")
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["sync_max_diff"] <= 1e-4 for r in train)
    assert all(0 <= r["sync_mean_diff"] <= r["sync_max_diff"] for r in train)  # the mean is logged with the max
    import json
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout"] == "transformers"
    # shared-prompt scoring passed its start-up check (fp32 tolerance 1e-3) and stayed on
    assert summary["share_prompt"] is True and summary["share_prompt_check"]["tolerance"] == 1e-3
    assert 0 <= summary["share_prompt_check"]["mean_diff"] <= summary["share_prompt_check"]["max_diff"] <= 1e-3
