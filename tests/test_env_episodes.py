"""Multi-turn episodes without a model: the calculator's safe arithmetic, and the episode loop's
token layout, mask, budgets, seeds and batching with a scripted token policy on the tiny model's
byte tokenizer (every byte one token, so every layout is counted by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from policyzoo import ConfigError, Observation, assemble, hookimpl, use
from policyzoo.contract import Generated, StepBatch
from policyzoo.plugins.env import CALC_EXAMPLE, CALC_SYSTEM, CalcError, Calculator, calc, find_call
from policyzoo.step import micro_loss, prepare, step_totals
from policyzoo.step.episodes import DrivesEpisodes, env_turn_ids, run_episodes
from policyzoo.testing.tiny import build_tokenizer

IM_START, IM_END = 1, 2  # the tiny tokenizer's specials: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (= EOS)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the printable bytes ! to ~, 0xA1 to 0xAC and 0xAE to 0xFF stand
    for themselves; the other bytes, in order, for chr(256), chr(257), ... (" " -> chr(288))."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    rest = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + k) for k, b in enumerate(rest)}}


def byte_ids(tok, text: str) -> list[int]:
    """Ids of ``text`` byte by byte: the tokenizer's vocabulary is the 3 specials, then the 256
    byte characters in sorted order (policyzoo.testing.tiny)."""
    chars = byte_chars()
    alphabet = sorted(chars.values())
    return [3 + alphabet.index(chars[b]) for b in text.encode()]


class ScriptedPolicy(DrivesEpisodes):  # a TokenPolicy: the step's episode loop on scripted turns
    """``generate_tokens`` answers context k of call c with ``script[c][k]`` (text, EOS or not),
    cut to the requested max_tokens; records every call."""

    def __init__(self, tok, script):
        self.tokenizer, self.pad_token_id, self.script, self.calls = tok, IM_END, script, []

    def generate_tokens(self, contexts, max_tokens, temperature, seeds, top_p=1.0):
        self.calls.append({"contexts": [list(c) for c in contexts], "max_tokens": list(max_tokens),
                           "seeds": list(seeds), "temperature": temperature})
        out = []
        for k, m in enumerate(max_tokens):
            text, eos = self.script[len(self.calls) - 1][k]
            ids = (byte_ids(self.tokenizer, text) + ([IM_END] if eos else []))[:m]
            out.append(Generated(ids, [-0.5] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True),
                                 ids[-1:] == [IM_END]))
        return out


ROW = {"prompt": [{"role": "system", "content": "task prompt"}, {"role": "user", "content": "What is 2 + 2?"}],
       "answer": "4"}


# ----------------------------------------------------------------------------- the calculator tool
def test_calc_is_exact_arithmetic_and_refuses_anything_else():
    assert calc("1 + 2 * 3") == "7" and calc("(1 + 2) * 3") == "9"  # precedence, parentheses
    assert calc("-4 / 8") == "-0.5" and calc("10 / 3") == "3.333333"  # 10/3 rounded to 6 places
    assert calc("1,234 + 1") == "1235" and calc("0.1 + 0.2") == "0.3"  # exact fractions: no 0.30000000000000004
    for bad in ("2 ** 3", "__import__('os')", "1 / 0", "2 * (3", "", "x + 1", "1" * 121, "(" * 13 + "1" + ")" * 13):
        with pytest.raises(CalcError):
            calc(bad)
    assert find_call("Let me see: calc((2 + 3) * 4) then") == "(2 + 3) * 4"
    assert find_call("Answer: 4") is None


def test_calculator_episode_answers_calls_and_scores_the_final_answer():
    env = Calculator(call_reward=0.25)
    ep = env.env(ROW)
    # the prompt: tool instructions, the worked example, then the row's question (last user message)
    assert ep.prompt == [{"role": "system", "content": CALC_SYSTEM}, *CALC_EXAMPLE,
                         {"role": "user", "content": "What is 2 + 2?"}]
    # task_examples: the task's own few-shot turns (which answer without the tool) come first
    shot = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "Answer: 2"}]
    row = dict(ROW, prompt=[ROW["prompt"][0], *shot, ROW["prompt"][1]])
    assert Calculator(task_examples=True).env(row).prompt == [{"role": "system", "content": CALC_SYSTEM}, *shot,
                                                              *CALC_EXAMPLE, ROW["prompt"][1]]
    assert Calculator(example=False).env(row).prompt == [{"role": "system", "content": CALC_SYSTEM}, ROW["prompt"][1]]
    assert ep.step("calc(2+2)", []) == Observation([{"role": "tool", "content": "4"}], tool_call=True, reward=0.25)
    err = ep.step("calc(1/0)", [])
    assert err.tool_error and err.reward is None and err.messages[0]["content"] == "error: division by zero"
    assert ep.reward() == 0.0  # no final answer yet
    assert ep.step("Answer: 4", []).done and ep.reward() == 1.0
    wrong = env.env(ROW)
    wrong.step("Answer: 5", [])
    assert wrong.reward() == 0.0


# ----------------------------------------------------------------------------- token layout by hand
def test_env_turn_ids_are_the_chat_template_after_the_model_turn(tok):
    msg = [{"role": "tool", "content": "4"}]
    # ChatML: the model's turn ends "<|im_end|>" then the template adds "\n"; the tool message
    # "<|im_start|>tool\n4<|im_end|>\n" and the next turn's "<|im_start|>assistant\n" follow.
    after_eos = byte_ids(tok, "\n") + [IM_START] + byte_ids(tok, "tool\n4") + [IM_END] + byte_ids(tok, "\n") + \
        [IM_START] + byte_ids(tok, "assistant\n")
    assert env_turn_ids(tok, msg, eos_generated=True) == after_eos
    assert len(after_eos) == 1 + 1 + 6 + 1 + 1 + 1 + 10  # = 21
    assert env_turn_ids(tok, msg, eos_generated=False) == [IM_END] + after_eos  # a cut turn gets its end-of-turn


def test_two_turn_episode_layout_mask_logprobs_and_rewards(tok):
    # 1 prompt x n = 2: sample 0 calls calc then answers right; sample 1 answers wrong at once.
    pol = ScriptedPolicy(tok, [[("calc(2+2)", True), ("Answer: 5", True)], [("Answer: 4", True)]])
    env = Calculator(call_reward=0.25)
    r = run_episodes(pol, env, [ROW], n=2, max_tokens=16, temperature=1.0, seed=5)
    turn1 = byte_ids(tok, "calc(2+2)") + [IM_END]  # 9 bytes + EOS = 10
    answer = env_turn_ids(tok, [{"role": "tool", "content": "4"}], eos_generated=True)  # 21 (above)
    turn2 = byte_ids(tok, "Answer: 4") + [IM_END]  # 10
    assert r.response_ids[0].tolist() == turn1 + answer + turn2  # 41 tokens, the widest row
    assert r.response_ids.shape == (2, 41)
    assert r.response_mask[0].tolist() == [True] * 10 + [False] * 21 + [True] * 10
    assert r.response_ids[1, :10].tolist() == byte_ids(tok, "Answer: 5") + [IM_END]
    assert r.response_mask[1].tolist() == [True] * 10 + [False] * 31  # then padding
    assert (r.rollout_logprobs[0, 10:31] == 0).all() and (r.rollout_logprobs[0, :10] == -0.5).all()
    # turn 2 is sampled from prompt + turn 1 + the tool answer, exactly those ids (no re-tokenising)
    messages = [{"role": "system", "content": CALC_SYSTEM}, *CALC_EXAMPLE, ROW["prompt"][-1]]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert r.prompt_ids[0] == prompt and pol.calls[1]["contexts"] == [prompt + turn1 + answer]
    # batching: turn 1 of both episodes in one call, turn 2 only for the live one
    assert [len(c["contexts"]) for c in pol.calls] == [2, 1]
    # seeds: ((seed x 1000003 + prompt) x n + sample) x 1009 + turn = (10000030 + j) x 1009 + turn
    assert pol.calls[0]["seeds"] == [10090030270, 10090031279] and pol.calls[1]["seeds"] == [10090030271]
    assert r.env_rewards.tolist() == [1.0, 0.0] and r.turns.tolist() == [2, 1]
    assert r.tool_calls.tolist() == [1, 0] and r.tool_errors.tolist() == [0, 0]
    assert r.stop_reasons == ["env", "env"] and r.truncated.tolist() == [False, False]
    assert r.turn_rewards[0, 9] == 0.25 and r.turn_rewards.sum() == 0.25  # on turn 1's last token (index 9)
    assert r.group_ids.tolist() == [0, 0]


def test_budgets_end_episodes_as_truncated(tok):
    script = [[("calc(2+2)", True)], [("Answer: 4", True)]]
    # token budget 30: turn 1 (10) + the answer (21) = 31 >= 30 leaves no model token -> "tokens"
    r = run_episodes(ScriptedPolicy(tok, script), Calculator(max_total_tokens=30), [ROW], 1, 16, 1.0, 0)
    assert r.stop_reasons == ["tokens"] and r.truncated.tolist() == [True] and r.response_ids.shape == (1, 10)
    # budget 41: 10 + 21 = 31 fits; turn 2 may use min(16, 41 - 31) = 10 tokens, exactly its length
    pol = ScriptedPolicy(tok, script)
    r = run_episodes(pol, Calculator(max_total_tokens=41), [ROW], 1, 16, 1.0, 0)
    assert pol.calls[1]["max_tokens"] == [10] and r.stop_reasons == ["env"] and r.env_rewards.tolist() == [1.0]
    # turn budget 1: the env still answers after turn 1 -> "turns", the answer is not appended
    r = run_episodes(ScriptedPolicy(tok, script), Calculator(max_turns=1), [ROW], 1, 16, 1.0, 0)
    assert r.stop_reasons == ["turns"] and r.truncated.tolist() == [True] and r.tool_calls.tolist() == [1]
    assert r.response_ids.shape == (1, 10)
    # a final turn cut at max_tokens without EOS is truncated too ("Answer: 4" cut to 5 tokens)
    r = run_episodes(ScriptedPolicy(tok, [[("Answer: 4", True)]]), Calculator(), [ROW], 1, 5, 1.0, 0)
    assert r.truncated.tolist() == [True] and r.stop_reasons == ["env"] and r.env_rewards.tolist() == [0.0]


def test_env_tokens_carry_no_gradient_and_turn_rewards_reach_gae(tok):
    pol = ScriptedPolicy(tok, [[("calc(2+2)", True)], [("Answer: 4", True)]])
    r = run_episodes(pol, Calculator(call_reward=0.25), [ROW], 1, 16, 1.0, 0)
    # GAE with gamma = lambda = 1 and zero values: A_t = sum of rewards from t on. Turn 1's last
    # token (9) carries 0.25, the sequence reward 1.0 sits on the last model token (40):
    # tokens 0..9 get 1.25, tokens 31..40 get 1.0, env tokens 10..30 get 0.
    run = assemble({"base": "ppo", "kl": None, "env": {"use": "calculator"},
                    "baseline": {"gamma": 1.0, "lam": 1.0, "whiten": False}}, rewards=(use("env_reward"),))
    batch = StepBatch(r, r.env_rewards.clone(), values=torch.zeros(r.response_ids.shape))
    batch, _ = prepare(run, batch)
    assert batch.token_rewards[0, 9] == 0.25 and batch.token_rewards.sum() == 0.25
    adv = batch.advantages[0]
    assert torch.allclose(adv[:10], torch.full((10,), 1.25)) and torch.allclose(adv[31:], torch.ones(10))
    assert (adv[10:31] == 0).all()
    logprobs = torch.full(r.response_ids.shape, -0.5, requires_grad=True)
    loss, _ = micro_loss(run, batch, logprobs, step_totals(batch))
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert (grad[0, 10:31] == 0).all() and (grad[0, :10] != 0).all() and math.isfinite(float(loss.detach()))


def test_plot_adds_the_episode_panels_for_a_run_with_an_env(tmp_path):
    import struct

    from policyzoo.engine.report.plot import ENV_PANELS
    from policyzoo.engine.report.plot import main as plot
    from policyzoo.engine.rundir import RunDir

    rd = RunDir(tmp_path)
    rd.create({}, {})
    rd.log({"step": 0, "kind": "eval", "eval_accuracy": 0.2, "eval_env_tool_call_frac": 0.1})
    for s in (1, 2):
        rd.log({"step": s, "kind": "train", "reward_mean": 0.1 * s, "env_turns_mean": 1.5, "env_tool_call_frac": 0.3,
                "env_tool_errors_mean": 0.0, "env_truncated_turns_frac": 0.0, "env_truncated_tokens_frac": 0.1})
    png = plot(str(tmp_path)).read_bytes()
    width, height = struct.unpack(">II", png[16:24])  # the PNG header's IHDR size
    assert (width, height) == (1300, 1050)  # 13 x (3 rows x 3.5) inches at 100 dpi
    assert [t for t, _ in ENV_PANELS] == ["episodes calling a tool", "per episode", "truncated episodes"]


# ----------------------------------------------------------------------------- assembly
def test_env_is_optional_and_its_reward_defaults_to_env_reward():
    import types

    from policyzoo import Sample
    from policyzoo.assembly import reward_uses
    from policyzoo.catalog import load_catalog
    from policyzoo.run_config import load_config

    assert assemble("grpo").env is None  # no zoo bundle sets an env: single-turn as before
    config = load_config(None, "grpo", ["algorithm.env.use=calculator", "algorithm.env.max_turns=5"])
    run = assemble(config.algorithm, rewards=reward_uses(config, [use("answer_match")], has_env=True))
    assert run.env.params.max_turns == 5 and [c.name for c in run.reward] == ["env_reward"]
    assert run.max_response_tokens == 192  # L_max of the run: the env's token budget, not sample.max_tokens
    assert reward_uses(load_config(None, "grpo", []), [use("answer_match")]) == (use("answer_match"),)
    with pytest.raises(ConfigError, match="no environment"):
        assemble("grpo", rewards=(use("env_reward"),))

    class OneTurn(Sample):  # a third-party sampler that predates environments
        """Samples without an env. Source: a test fixture."""
        name = "one_turn"

        def sample(self, policy, prompts, seed):
            raise AssertionError("never called")

    plugin = types.SimpleNamespace(__name__="one_turn_plugin",
                                   register_components=hookimpl(lambda register: register(OneTurn)))
    catalog = load_catalog(autoload=False, extra=[plugin])
    assemble({"base": "grpo", "sample": {"use": "one_turn"}}, catalog=catalog)  # fine without an env
    with pytest.raises(ConfigError, match="takes no `env`"):
        assemble({"base": "grpo", "sample": {"use": "one_turn"}, "env": {"use": "calculator"}}, catalog=catalog)


def test_gsm8k_calculator_scores_the_last_boxed_answer():
    from policyzoo.plugins.env import GSM8K_CALC_SYSTEM, GSM8KCalculator

    row = {"prompt": [{"role": "system", "content": "task"}, {"role": "user", "content": "Q?"}], "answer": "72"}
    env = GSM8KCalculator()
    assert (env.params.max_turns, env.params.max_total_tokens) == (6, 768)
    ep = env.env(row)
    assert ep.prompt == [{"role": "system", "content": GSM8K_CALC_SYSTEM}, {"role": "user", "content": "Q?"}]
    assert ep.step("calc(48 + 24)", []).messages == [{"role": "tool", "content": "72"}]
    assert ep.step("So \\boxed{70} no, \\boxed{72}", []).done and ep.reward() == 1.0  # the last box counts
    unboxed = env.env(row)
    unboxed.step("The answer is 72", [])
    assert unboxed.reward() == 0.0  # no \boxed{}: no answer


def test_episode_fields_survive_select_and_concat(tok):
    from policyzoo.contract import Rollout

    a = run_episodes(ScriptedPolicy(tok, [[("calc(2+2)", True)], [("Answer: 4", True)]]), Calculator(), [ROW], 1,
                     16, 1.0, 0)  # 41 tokens (10 + 21 + 10)
    b = run_episodes(ScriptedPolicy(tok, [[("Answer: 4", True), ("Answer: 5", True)]]), Calculator(), [ROW], 2,
                     16, 1.0, 0)  # 2 rows of 10 tokens
    both = Rollout.concat([a, b])
    assert both.response_ids.shape == (3, 41) and both.turn_rewards.shape == (3, 41)
    assert both.stop_reasons == ["env"] * 3 and both.turns.tolist() == [2, 1, 1]
    assert both.env_rewards.tolist() == [1.0, 1.0, 0.0] and not both.response_mask[1:, 10:].any()
    kept = both.select(torch.tensor([False, True, True]))
    assert kept.turns.tolist() == [1, 1] and kept.tool_calls.tolist() == [0, 0] and len(kept.stop_reasons) == 2
    plain = Rollout.concat([a, Rollout(**{**a.__dict__, "turns": None})])
    assert plain.turns is None  # a field absent from one part is absent from the whole


def test_group_sampler_drives_episodes_and_adds_greedy_ones(tok):
    from policyzoo.plugins.sample import Group

    # 1 prompt x n = 2 sampled episodes (one call), then ReMax's greedy episode (a call at temperature 0)
    pol = ScriptedPolicy(tok, [[("Answer: 4", True), ("Answer: 5", True)], [("Answer: 4", True)]])
    r = Group(n=2, max_tokens=16, temperature=0.7, greedy=True).sample(policy=pol, prompts=[ROW], seed=0,
                                                                       env=Calculator())
    assert [c["temperature"] for c in pol.calls] == [0.7, 0.0]
    assert r.greedy.tolist() == [False, False, True] and r.group_ids.tolist() == [0, 0, 0]
    assert r.env_rewards.tolist() == [1.0, 0.0, 1.0] and r.temperature == 0.7 and r.max_tokens == 16
    with pytest.raises(ConfigError, match="generate_tokens"):  # the bandit has no tokens
        Group(n=2).sample(policy=object(), prompts=[ROW], seed=0, env=Calculator())


def test_an_episode_without_step_or_reward_names_the_env(tok):
    from policyzoo import Episode
    from policyzoo.errors import ComponentError

    class Half(Episode):  # reward() missing: the abstract Episode cannot be made
        def step(self, turn_text, turn_ids):
            return Observation(done=True)

    class HalfEnv(Calculator):
        def env(self, row):
            return Half(row)

    with pytest.raises(ComponentError, match=r"(?s)env component .*reward"):
        run_episodes(ScriptedPolicy(tok, [[("Answer: 4", True)]]), HalfEnv(), [ROW], n=1, max_tokens=16,
                     temperature=1.0, seed=0)
