"""Multi-turn episodes on the tiny model with vLLM (and the transformers fallback), in their own
process: a scripted environment (turn 1 -> tool "4", turn 2 -> user "ok", turn 3 -> done) whose
token layout and mask are worked out by hand; the trajectory equals the conversation tokenised
turn by turn; environment tokens have mask 0, log-prob 0 and no gradient; the sampler's log-probs
equal the trainer's on the concatenated sequence; a training step on episodes updates and syncs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _engine_helpers import ROOT, engine_env, tiny_model
from test_env_episodes import IM_END, IM_START, byte_ids


@pytest.fixture(scope="module")
def probe():
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "_episode_probe.py"), str(tiny_model())],
                         env=engine_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model()))


def env_tokens(tok, role: str, content: str, eos_generated: bool) -> list[int]:
    """By hand, ChatML: the model turn's "<|im_end|>" (unless generated), "\\n", then
    "<|im_start|>ROLE\\nCONTENT<|im_end|>\\n" and the next turn's "<|im_start|>assistant\\n"."""
    end = [] if eos_generated else [IM_END]
    return end + byte_ids(tok, "\n") + [IM_START] + byte_ids(tok, f"{role}\n{content}") + [IM_END] \
        + byte_ids(tok, "\n") + [IM_START] + byte_ids(tok, "assistant\n")


def check_layout(tok, res):
    prompts = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "What is 12 plus 30?"}]]
    for b, (ids, mask, seen) in enumerate(zip(res["ids"], res["mask"], res["seen"])):
        assert len(seen) == 3  # three model turns: the env answered twice, then said done
        t1, t2, t3 = seen
        assert all(1 <= len(t) <= 6 for t in seen)  # max_tokens = 6 per turn
        e1 = env_tokens(tok, "tool", "4", t1[-1] == IM_END)  # 21 tokens after an EOS, 22 after a cut turn
        e2 = env_tokens(tok, "user", "ok", t2[-1] == IM_END)  # 22 or 23
        assert len(e1) == 21 + (t1[-1] != IM_END) and len(e2) == 22 + (t2[-1] != IM_END)
        expected = t1 + e1 + t2 + e2 + t3
        assert ids[:len(expected)] == expected and all(i == IM_END for i in ids[len(expected):])  # then padding
        assert mask == [True] * len(t1) + [False] * len(e1) + [True] * len(t2) + [False] * len(e2) + \
            [True] * len(t3) + [False] * (len(ids) - len(expected))
        # turn by turn: the prompt through the chat template, then each turn's ids as they were generated
        assert res["prompt_ids"][b] == tok.apply_chat_template(prompts[b // 2], add_generation_prompt=True)["input_ids"]
        # the per-turn reward 0.5 sits on turn 1's last token
        assert res["turn_rewards"][b][len(t1) - 1] == 0.5 and sum(res["turn_rewards"][b]) == 0.5
        assert res["env_rewards"][b] == sum(t1) % 5  # the scripted reward
    assert res["turns"] == [3, 3, 3, 3] and res["stop"] == ["env"] * 4
    # turns of all 4 episodes batched: 3 engine calls of 4 contexts; turn 2 continues the exact ids
    assert [len(c["contexts"]) for c in res["calls"]] == [4, 4, 4]
    first = res["seen"][0][0]
    e1 = env_tokens(tok, "tool", "4", first[-1] == IM_END)
    assert res["calls"][1]["contexts"][0] == res["prompt_ids"][0] + first + e1
    assert res["env_lp_zero"] and res["same_seed_same"]


def test_vllm_episode_layout_and_mask_are_the_hand_computed_ones(probe, tok):
    check_layout(tok, probe)


def test_sampler_logprobs_equal_the_trainers_on_the_whole_trajectory(probe):
    # no re-tokenising: the trainer scores exactly the ids vLLM continued from (temperature 0.7)
    assert probe["lp_diff"] < 1e-4
    assert probe["hf"]["lp_diff"] < 1e-4


def test_env_tokens_carry_no_gradient(probe):
    assert probe["grad_env_max"] == 0.0
    assert probe["grad_model_nonzero"] > probe["model_tokens"] // 2  # model tokens do get gradient


def test_a_training_step_on_episodes_updates_and_syncs(probe):
    # rloo on 2 prompts x 2 scripted episodes of 3 turns: DeepSpeed update, weight sync, sync check
    step = probe["step"]
    assert step["skipped"] == 0 and step["rows"] == 4 and step["sync_max_diff"] <= 1e-4
    assert step["env_turns_mean"] == 3 and step["env_tool_calls_mean"] == 1  # turn 1 is the scripted tool call
    assert step["env_truncated_turns_frac"] == 0 and step["env_truncated_tokens_frac"] == 0
    assert step["grad_norm"] > 0


def test_transformers_fallback_gives_the_same_layout(probe, tok):
    check_layout(tok, probe["hf"])
