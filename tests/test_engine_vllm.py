"""vLLM rollout on the tiny model, in its own process: groups, masks, truncation flags, sampler
log-probs equal to the trainer's at the sampling temperature, reproducible seeds, and a weight
sync that makes vLLM score exactly like the trainer again (tied embeddings included)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _engine_helpers import ROOT, engine_env, tiny_model


@pytest.fixture(scope="module")
def probe():
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "_vllm_probe.py"), str(tiny_model())],
                         env=engine_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    cache = [x for x in out.stdout.splitlines() if x.startswith("CACHE ")]
    eos = [x for x in out.stdout.splitlines() if x.startswith("EOS ")]
    assert out.returncode == 0 and lines and cache and eos, out.stderr[-3000:]
    return {**json.loads(lines[-1][len("RESULT "):]), "cache": json.loads(cache[-1][len("CACHE "):]),
            "eos_stop": json.loads(eos[-1][len("EOS "):])}


def test_groups_masks_and_truncation(probe):
    # 2 prompts x n = 3 -> 6 rows; rows 0-2 answer prompt 0 (group 0), rows 3-5 prompt 1.
    assert probe["rows"] == 6 and probe["group_ids"] == [0, 0, 0, 1, 1, 1]
    assert probe["pad"] in probe["eos"]  # the tiny model has eos == pad, as SmolLM2
    for n, last, trunc in zip(probe["lengths"], probe["last"], probe["truncated"]):
        assert 1 <= n <= 10
        # truncated <=> the limit was hit without an end-of-sequence token; a stopped response
        # keeps its EOS (the last masked token) even though EOS is also the pad id.
        assert trunc == (last not in probe["eos"])
        assert trunc or last in probe["eos"]
        assert not trunc or n == 10
    assert probe["temperature"] == 0.7 and probe["max_tokens"] == 10


def test_sampler_logprobs_match_the_trainer_at_the_temperature(probe):
    # vLLM's processed log-probs (logits / 0.7) vs the trainer's packed forward, fp32.
    assert probe["lp_diff"] < 1e-4
    assert probe["after_diff"] < 1e-4  # and again after a weight sync


def test_the_first_sampled_step_compiles_nothing(probe):
    # vLLM 0.32 ranked the sampled tokens with a torch.compile'd function: the first sampling with
    # log-probs traced it (10 s of the first step). policyzoo counts the ranks eagerly on CPU.
    assert probe["compiled_frames"] == 0


def test_the_eager_rank_count_is_vllms_arithmetic():
    import torch

    from policyzoo.engine.rollout.vllm_options import count_at_least

    x = torch.tensor([[0.1, 0.5, 0.3, -1.0], [1.0, 1.0, 0.0, 2.0]])
    # row 0: entries >= 0.3 are 0.5 and 0.3 -> 2 (the sampled 0.3 is ranked 2nd);
    # row 1: entries >= 1.0 are 1.0, 1.0, 2.0 -> 3 (ties count, as vLLM's x >= values)
    assert count_at_least(x, torch.tensor([[0.3], [1.0]])).tolist() == [2, 3]


def test_seeds_reproduce_and_samples_differ(probe):
    assert probe["same_seed_same"] and probe["other_seed_differs"]
    samples = probe["samples"]
    assert len({tuple(s) for s in samples}) > 1  # samples of one call do not share a random stream


def test_weight_sync_restores_equal_logprobs(probe):
    # Perturbed trainer weights: before the sync vLLM scores differently (the check would fire),
    # after it equal within fp32 noise, the tied lm_head included.
    assert probe["tied"]
    assert probe["stale"] > 1e-2
    assert probe["synced"] < 1e-4
    assert probe["greedy_rows"] == 2


def test_a_step_larger_than_the_token_budget_samples_on_cpu(probe):
    # 8 prompts x 32 samples of ~101 tokens = 256 requests, ~25,900 prompt tokens against vLLM's
    # 4096-token step budget: prefills must wait for a later step, never be split (a split prefill
    # rewinds the seeded CPU generator, which vLLM-CPU cannot do, and the rollout crashed).
    assert probe["big_rows"] == 256 and probe["big_prompt_tokens"] > 4096


def test_the_sync_check_reads_through_the_prefix_cache(probe):
    c = probe["cache"]
    assert c["seq_len"] < 128 < 250  # the check sequence alone fills no 128-token block; repeated to 250 it does
    assert c["first_check"] < 1e-4 and c["reset_check"] < 1e-4  # in sync; a push with the cache reset passes
    # the weight push without the prefix-cache reset: the block cached by the previous check holds
    # keys/values of the old weights and the next-token log-probs read through it differ
    assert "weight sync check" in c["no_reset_error"] and "tolerance 0.0001" in c["no_reset_error"]
    # the prompt log-probs alone (the whole check before) never read the cache and saw nothing
    assert c["prompt_path_only"] < 1e-4


def test_vllm_stops_on_every_end_of_sequence_id_of_the_model(probe):
    e = probe["eos_stop"]
    assert e["first"] not in e["eos"] and e["before"] > 1  # greedy went on past its first token
    # with that token added as a second end-of-sequence id: one token, stopped (not truncated)
    assert e["after"] == 1 and e["truncated"] is False
