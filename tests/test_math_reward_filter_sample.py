"""Rewards, filters and the group sampler."""

import math
import textwrap

import pytest
import torch

import policyzoo
from policyzoo import use
from policyzoo.contract import Rollout
from policyzoo.errors import ConfigError, DataError, UserError
from policyzoo.plugins.filter import DropTruncated, NonconstantGroups
from policyzoo.plugins.reward import AnswerMatch, Function, OverlongPenalty, extract_number
from policyzoo.plugins.sample import Group


def make_rollout(lengths=(1, 1), completions=None, rows=None, group_ids=None, truncated=None, max_tokens=0):
    b = len(lengths)
    width = max(max(lengths), 1)
    mask = torch.arange(width).expand(b, width) < torch.tensor(lengths).unsqueeze(-1)
    return Rollout(prompt_ids=[[1]] * b, response_ids=torch.zeros(b, width, dtype=torch.long), response_mask=mask,
                   rollout_logprobs=torch.zeros(b, width),
                   group_ids=torch.tensor(group_ids if group_ids is not None else list(range(b))),
                   truncated=torch.tensor(truncated if truncated is not None else [False] * b),
                   prompts=[f"q{i}" for i in range(b)], completions=completions or [""] * b,
                   rows=rows or [{} for _ in range(b)], max_tokens=max_tokens)


# ----------------------------------------------------------------------------- overlong penalty
def test_overlong_penalty_dapo_eq13():
    # L_max 20, L_cache 5: ramp starts at 15. |y| = 10 -> 0; 15 -> 0; 17 -> (15 - 17)/5 = -0.4;
    # 20 -> (15 - 20)/5 = -1.0; 21 (> L_max) -> -1
    r = OverlongPenalty(max_tokens=20, cache=5).reward(rollout=make_rollout([10, 15, 17, 20, 21]))
    assert torch.allclose(r, torch.tensor([0.0, 0.0, -0.4, -1.0, -1.0]))
    # cache 50 > L_max 20 is clipped to 20: ramp from 0, |y| = 10 -> -10/20 = -0.5
    r = OverlongPenalty(max_tokens=20, cache=50).reward(rollout=make_rollout([10, 0]))
    assert torch.allclose(r, torch.tensor([-0.5, 0.0]))


def test_overlong_penalty_resolves_max_tokens_from_the_run():
    run = policyzoo.assemble({"base": "dapo", "sample": {"max_tokens": 600}})
    pen = run.reward[0]
    assert pen.max_tokens == 600
    # L_max 600, L_cache default 20% of 600 = 120: ramp from 480; |y| = 540 -> (480 - 540)/120 = -0.5
    assert pen.reward(rollout=make_rollout([540, 480, 601])).tolist() == [-0.5, 0.0, -1.0]
    # unchecked component: falls back to the rollout's max_tokens, else a ConfigError
    assert OverlongPenalty(cache=4).reward(rollout=make_rollout([10], max_tokens=12)).item() == pytest.approx(-0.5)
    with pytest.raises(ConfigError):
        OverlongPenalty().reward(rollout=make_rollout([10]))
    with pytest.raises(ConfigError):
        OverlongPenalty(cache=0)


# ----------------------------------------------------------------------------- answer match
@pytest.mark.parametrize("text, gold, expect", [
    ("The answer is 42.", "42", 1.0),
    ("first 41, then 42", "42", 1.0),              # last number
    ("Answer: 41. Check: 6 x 7 = 42", "42", 0.0),  # the marked number wins
    ("#### 1,234", "1234", 1.0),                   # thousands separator
    ("so 72.0", "Natalia sold ... #### 72", 1.0),  # GSM8K-style gold, numeric equality
    ("it is -3", "-3", 1.0),
    ("3.5", "3", 0.0),
    ("no idea", "3", 0.0),
    ("answer: $18", "18", 1.0),
    ("the pair is 3,4", "4", 1.0),                 # "3,4" is two numbers, not 34
    ("total 12,500 apples", "12500", 1.0),
    # an answer span (marker to the end of its sentence or line) must hold exactly one number
    ("Answer: 42 or 43", "42", 0.0),               # a hedge is not paid
    ("Answer: 42 or 43", "43", 0.0),
    ("The answer is 42, maybe 43.", "42", 0.0),
    ("#### 42\n43 was my first guess", "42", 1.0),  # the span ends at the line break
    ("Answer: 42. Check: 6 x 7 = 42", "42", 1.0),  # ... and at the full stop
    ("Answer: 3.5.", "3.5", 1.0),                  # a decimal point does not end it
    ("Answer: I am not sure, 7?", "7", 1.0),
    ("12 apples. Answer: none", "12", 0.0),        # a marker without a number: no answer
    ("The answer is \\boxed{72}.", "72", 1.0),
])
def test_answer_match(text, gold, expect):
    r = AnswerMatch().reward(rollout=make_rollout([1], completions=[text], rows=[{"answer": gold}]))
    assert r.tolist() == [expect]


def test_answer_match_bad_data_names_the_row():
    with pytest.raises(DataError) as e:
        AnswerMatch().reward(rollout=make_rollout([1, 1], completions=["1", "2"], rows=[{"answer": "1"}, {"q": 1}]))
    assert "row 1" in str(e.value) and "answer" in str(e.value)
    with pytest.raises(DataError):
        AnswerMatch().reward(rollout=make_rollout([1], completions=["1"], rows=[{"answer": "seven"}]))
    assert extract_number("1,000,000.") == 1000000


# ----------------------------------------------------------------------------- user function
@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_pz.py").write_text(textwrap.dedent("""
        def by_length(prompts, completions, answer, **kwargs):
            return [len(c) if a != "skip" else None for c, a in zip(completions, answer)]
        def picky(prompts, completions, **kwargs):
            for c in completions:
                if c == "bad":
                    raise ValueError("cannot score 'bad'")
            return [1.0] * len(completions)
        def short(prompts, completions, **kwargs):
            return [1.0]
        def words(prompts, completions, **kwargs):
            return ["high"] * len(completions)
        NOT_CALLABLE = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_pz"


def test_function_reward_trl_style(reward_module):
    fn = Function(function=f"{reward_module}:by_length", weight=0.5)
    r = fn.reward(rollout=make_rollout([1, 1, 1], completions=["ab", "abcd", "x"],
                                      rows=[{"answer": "1", "prompt": "p"}, {"answer": "2"}, {"answer": "skip"}]))
    assert r[:2].tolist() == [2.0, 4.0] and math.isnan(r[2].item())  # None -> NaN
    assert fn.params.weight == 0.5 and fn.label == "by_length"  # metric key reward/by_length


@pytest.mark.parametrize("target, phrase", [("no_such_module_pz:f", "cannot import"),
                                            ("my_rewards_pz:missing", "no attribute"),
                                            ("my_rewards_pz:NOT_CALLABLE", "not a function")])
def test_function_bad_path_is_a_user_error(reward_module, target, phrase):
    with pytest.raises(UserError) as e:
        policyzoo.assemble("grpo", rewards=(use("function", function=target),))
    assert phrase in str(e.value) and target.split(":")[0] in str(e.value)
    with pytest.raises(ConfigError):
        Function(function="no colon here")


def test_function_raising_names_function_and_row(reward_module):
    fn = Function(function=f"{reward_module}:picky")
    with pytest.raises(UserError) as e:
        fn.reward(rollout=make_rollout([1, 1, 1], completions=["ok", "ok", "bad"]))
    msg = str(e.value)
    assert "picky" in msg and "row 2" in msg and "cannot score" in msg


@pytest.mark.parametrize("name, phrase", [("short", "returned 1 values for 2"), ("words", "not a number")])
def test_function_wrong_result_is_a_user_error(reward_module, name, phrase):
    with pytest.raises(UserError) as e:
        Function(function=f"{reward_module}:{name}").reward(rollout=make_rollout([1, 1], completions=["a", "b"]))
    assert phrase in str(e.value)


def test_every_reward_has_a_weight():
    for cls in (OverlongPenalty, AnswerMatch, Function):
        assert cls.Params.model_fields["weight"].default == 1.0


# ----------------------------------------------------------------------------- filters
def test_nonconstant_groups():
    # group 0: [1, 0] varies -> kept; group 1: [1, 1] constant -> dropped; group 2: valid [0.5, 0.5]
    # (NaN ignored) -> dropped; group 3: [1, 0] but the 0 row has no token -> one valid row -> dropped
    rewards = torch.tensor([1, 0, 1, 1, 0.5, float("nan"), 0.5, 1, 0])
    ro = make_rollout([2, 2, 2, 2, 2, 2, 2, 2, 0], group_ids=[0, 0, 1, 1, 2, 2, 2, 3, 3])
    out = NonconstantGroups().filter(rollout=ro, rewards=rewards)
    assert out.keep.tolist() == [True, True] + [False] * 7
    assert out.reasons == {"zero_std_group": 7}
    # tolerance: [0.30, 0.35] differ by 0.05 <= 0.1 -> dropped
    out = NonconstantGroups(tolerance=0.1).filter(rollout=make_rollout([1, 1], group_ids=[4, 4]),
                                                  rewards=torch.tensor([0.30, 0.35]))
    assert out.keep.tolist() == [False, False]
    assert NonconstantGroups().params.resample is True


def test_drop_truncated():
    out = DropTruncated().filter(rollout=make_rollout([1, 1, 1], truncated=[False, True, False]))
    assert out.keep.tolist() == [True, False, True] and out.reasons == {"truncated": 1}
    assert DropTruncated().params.resample is False


# ----------------------------------------------------------------------------- sample
class FakePolicy:
    def __init__(self, rows_per_prompt=None):
        self.calls = []
        self.rows_per_prompt = rows_per_prompt

    def generate(self, prompts, n, max_tokens, temperature, seed):
        self.calls.append((len(prompts), n, max_tokens, temperature, seed))
        g = self.rows_per_prompt or n
        return make_rollout([1] * (len(prompts) * g), group_ids=[i // g for i in range(len(prompts) * g)])


class NucleusPolicy(FakePolicy):
    sampling_options = frozenset({"top_p"})  # the engine declares the options its generate honours

    def generate(self, prompts, n, max_tokens, temperature, seed, top_p=1.0):
        self.top_p = top_p
        return super().generate(prompts, n, max_tokens, temperature, seed)


def test_group_sampler_calls_generate_and_stamps_rollout():
    pol = FakePolicy()
    two = [{"prompt": "a"}, {"prompt": "b"}]
    ro = Group(n=3, max_tokens=64, temperature=0.7).sample(policy=pol, prompts=two, seed=5, env=None)
    assert pol.calls == [(2, 3, 64, 0.7, 5)]
    assert len(ro) == 6 and ro.temperature == 0.7 and ro.max_tokens == 64
    assert ro.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    # the fake engine numbers each call's groups from 0 again; the sampler keeps them unique, so two
    # rounds of dynamic sampling concatenated never merge different prompts into one group
    again = Group(n=3).sample  # a fresh component starts at 0
    sampler = Group(n=2)
    first = sampler.sample(policy=FakePolicy(), prompts=[{"prompt": "a"}, {"prompt": "b"}], seed=0, env=None)
    second = sampler.sample(policy=FakePolicy(), prompts=[{"prompt": "c"}, {"prompt": "d"}], seed=1, env=None)
    assert first.group_ids.tolist() == [0, 0, 1, 1] and second.group_ids.tolist() == [2, 2, 3, 3]
    assert again(policy=FakePolicy(), prompts=[{"prompt": "a"}], seed=0, env=None).group_ids.tolist() == [0, 0, 0]
    nuc = NucleusPolicy()
    Group(n=2, top_p=0.9).sample(policy=nuc, prompts=[{"prompt": "a"}], seed=0, env=None)
    assert nuc.top_p == 0.9
    with pytest.raises(ConfigError):
        Group(top_p=0.9).sample(policy=FakePolicy(), prompts=[{"prompt": "a"}], seed=0, env=None)
    with pytest.raises(UserError):
        Group(n=3).sample(policy=FakePolicy(rows_per_prompt=2), prompts=[{"prompt": "a"}], seed=0, env=None)


@pytest.mark.parametrize("bad", [{"n": 0}, {"temperature": 0.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_tokens": 0}])
def test_group_sampler_params_validated(bad):
    with pytest.raises(ConfigError) as e:
        Group(**bad)
    assert "fix:" in str(e.value)
