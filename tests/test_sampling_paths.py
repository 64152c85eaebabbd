"""Every sampling option (top_p, top_k, min_p, repetition_penalty, stop) is honoured or refused on
every path: single-turn ``generate``, the episode loop's ``generate_tokens`` (an env), the overlap
policy's prefetch, and the pre-load check; and the transformers engine's ``generate_tokens``
applies them on the tiny model."""

from __future__ import annotations

import pytest
import torch
from _engine_helpers import tiny_model
from test_env_episodes import ROW

from policyzoo.contract import LOCAL, Generated
from policyzoo.engine.ahead.overlap import OverlapPolicy
from policyzoo.engine.lm_policy import LMPolicy
from policyzoo.engine.run.checks import check_sampling_options
from policyzoo.errors import ConfigError
from policyzoo.plugins.env import Calculator
from policyzoo.plugins.sample import Group
from policyzoo.step.episodes import DrivesEpisodes
from policyzoo.testing.tiny import build_tokenizer

SETTINGS = {"top_p": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "stop": ["\n"]}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class TokenRecorder(DrivesEpisodes):
    """A TokenPolicy that answers every context with EOS and records the options it was given."""

    collective = LOCAL

    def __init__(self, tok, honoured=frozenset(SETTINGS)):
        self.tokenizer, self.pad_token_id, self.sampling_options, self.seen = tok, 2, honoured, []

    def generate_tokens(self, contexts, max_tokens, temperature, seeds, **options):
        self.seen.append({k: v for k, v in options.items() if (k, v) != ("top_p", 1.0)})  # top_p 1.0: off
        return [Generated([2], [-0.1], "", True) for _ in contexts]

    def unused(self, *args, **kwargs):
        raise AssertionError("only sampling here")

    generate = logprobs = ref_logprobs = sum_pi_squared = values = backward = optimizer_step = sync = unused
    reduce_totals = unused


@pytest.mark.parametrize("key", list(SETTINGS))
def test_the_env_path_passes_each_option_to_generate_tokens(tok, key):
    pol = TokenRecorder(tok)
    Group(n=2, greedy=True, **{key: SETTINGS[key]}).sample(policy=pol, prompts=[ROW], seed=0, env=Calculator())
    assert pol.seen == [{key: SETTINGS[key]}] * 2  # the sampled episodes and the greedy baseline's
    with pytest.raises(ConfigError) as e:  # an engine that does not honour it: refused, never dropped
        Group(n=2, **{key: SETTINGS[key]}).sample(policy=TokenRecorder(tok, frozenset()), prompts=[ROW], seed=0,
                                                  env=Calculator())
    assert key in e.value.where and f"takes no {key}" in e.value.why


class Inner:
    """An engine behind the overlap policy: records each generate call's options."""

    sampling_options = frozenset(SETTINGS)

    def __init__(self):
        self.calls, self.stats = [], {}

    def generate(self, prompts, n, max_tokens, temperature, seed, **options):
        from test_trl_rewards import rollout

        self.calls.append(options)
        return rollout(["x"] * (len(prompts) * n), [{}] * (len(prompts) * n))

    def sync(self):
        return {}


@pytest.mark.parametrize("key", list(SETTINGS))
def test_the_overlap_policy_passes_each_option_and_matches_the_prefetch_by_it(key):
    pol = OverlapPolicy(Inner())
    assert pol.sampling_options == frozenset(SETTINGS)
    opts = {key: SETTINGS[key]}
    pol.prefetch(lambda rec: rec.generate([ROW], 2, 8, 1.0, 3, **opts))
    pol.sync()
    out = pol.generate([ROW], 2, 8, 1.0, 3, **opts)  # the same request: the prefetched batch, 1 step behind
    assert pol.inner.calls == [opts] and out.policy_lag.tolist() == [1, 1] and pol.stale_dropped == 0
    pol.prefetch(lambda rec: rec.generate([ROW], 2, 8, 1.0, 3))
    pol.generate([ROW], 2, 8, 1.0, 3, **opts)  # asked with the option, prefetched without: sampled again
    assert pol.inner.calls == [opts, {}, opts] and pol.stale_dropped == 1


@pytest.mark.parametrize("key", list(SETTINGS))
def test_each_option_is_checked_against_the_engine_before_any_model_loads(key):
    group = Group(**{key: SETTINGS[key]})
    check_sampling_options(group, LMPolicy.sampling_options, "vllm")  # both engines honour every option
    with pytest.raises(ConfigError, match=f"takes no {key}") as e:
        check_sampling_options(group, LMPolicy.sampling_options - {key}, "vllm")
    assert e.value.where == f"algorithm.sample.{key}"
    check_sampling_options(Group(), frozenset(), "vllm")  # options left off: nothing to honour


def test_the_transformers_engine_applies_the_options_in_generate_tokens():
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout.hf import HFRollout

    engine = HFRollout(resolve_model(str(tiny_model())), "float32")
    ctx = [list(engine.tokenizer("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").input_ids)]
    greedy = engine.generate_tokens(ctx, [8], 0.0, [0])[0]
    # top_k = 1 keeps only the most likely token: sampling at temperature 1 gives the greedy answer
    assert engine.generate_tokens(ctx, [8], 1.0, [7], top_k=1)[0].ids == greedy.ids
    # min_p = 1.0 keeps only tokens as likely as the most likely one: greedy again
    assert engine.generate_tokens(ctx, [8], 1.0, [7], min_p=1.0)[0].ids == greedy.ids
    # a stop string made of the greedy answer's second token's text ends the turn right after it
    second = engine.tokenizer.decode(greedy.ids[1:2])
    stopped = engine.generate_tokens(ctx, [8], 0.0, [0], stop=[second])[0]
    assert stopped.stopped and second in engine.tokenizer.decode(stopped.ids) and len(stopped.ids) <= 2
    # a huge repetition penalty forbids every token already in the context: none of them comes back
    penalised = engine.generate_tokens(ctx, [4], 0.0, [0], repetition_penalty=1e9)[0]
    assert not set(penalised.ids[:1]) & set(ctx[0])
    assert torch.isfinite(torch.tensor(penalised.logprobs)).all()


def test_chosen_logprobs_gathers_the_sampled_token_of_each_step():
    from policyzoo.engine.rollout.hf import chosen_logprobs

    # two rows, vocabulary of 2, two steps. Step 0 scores [0, 0] on both rows: log_softmax = -ln 2 each.
    # Step 1, row 0 scores [ln 3, 0]: p = [3/4, 1/4]; row 1 scores [0, -inf] (filtered by top-k): p = [1, 0].
    scores = (torch.zeros(2, 2), torch.tensor([[torch.log(torch.tensor(3.0)), 0.0], [0.0, float("-inf")]]))
    tokens = torch.tensor([[1, 0], [0, 0]])
    got = chosen_logprobs(scores, tokens)
    # row 0: ln(1/2), ln(3/4) = -0.693147, -0.287682; row 1: ln(1/2), ln(1) = -0.693147, 0
    assert got.shape == (2, 2)
    assert torch.allclose(got, torch.tensor([[-0.693147, -0.287682], [-0.693147, 0.0]]), atol=1e-6)
    assert chosen_logprobs((), torch.zeros(3, 0, dtype=torch.long)).shape == (3, 0)


def test_left_pad_puts_every_prompt_flush_right():
    from policyzoo.engine.rollout.hf import left_pad

    x, mask = left_pad([[5, 6, 7], [8]], pad_id=0, dev="cpu")
    assert x.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_the_transformers_engine_batches_prompts_and_its_logprobs_match_unpadded_scoring():
    """One left-padded ``generate`` for prompts of different lengths: each row's sampled log-probs
    (temperature 1, no filter) equal the model's own log-probs of that response scored alone, without
    padding (what the trainer computes), to fp32 tolerance; rows are prompt-major, n per prompt."""
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout.hf import HFRollout

    engine = HFRollout(resolve_model(str(tiny_model())), "float32")
    rows = [{"prompt": "hi"}, {"prompt": "a much longer question about numbers, to pad the other one"}]
    roll = engine.generate(rows, n=2, max_tokens=6, temperature=1.0, seed=3)
    assert roll.response_ids.shape[0] == 4 and roll.group_ids.tolist() == [0, 0, 1, 1]
    assert len(roll.prompt_ids[0]) < len(roll.prompt_ids[2])  # the first prompt was left-padded
    for j in range(4):
        resp = roll.response_ids[j][roll.response_mask[j]].tolist()
        alone = engine.score(list(roll.prompt_ids[j]) + resp)[-len(resp):]
        assert torch.allclose(roll.rollout_logprobs[j, :len(resp)], alone, atol=1e-4), j
    # the same step seed gives the same samples
    again = engine.generate(rows, n=2, max_tokens=6, temperature=1.0, seed=3)
    assert torch.equal(again.response_ids, roll.response_ids)


def test_a_prompts_samples_do_not_depend_on_the_other_prompts_in_the_batch():
    """Data-parallel ranks split a step's prompts: prompt 1 sampled with prompt 0 beside it (first_index 0)
    must equal prompt 1 sampled alone as the first prompt of a second rank (first_index 1), ids and
    log-probs, because each prompt draws from its own generator seeded by request_seed(seed, index, n)."""
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout.hf import HFRollout

    engine = HFRollout(resolve_model(str(tiny_model())), "float32")
    rows = [{"prompt": "a much longer question about numbers, to pad the other one"}, {"prompt": "hi"}]
    both = engine.generate(rows, n=3, max_tokens=8, temperature=0.9, seed=5, top_p=0.95)
    alone = engine.generate(rows[1:], n=3, max_tokens=8, temperature=0.9, seed=5, top_p=0.95, first_index=1)
    for j in range(3):
        ids = both.response_ids[3 + j][both.response_mask[3 + j]].tolist()
        assert ids == alone.response_ids[j][alone.response_mask[j]].tolist(), j
        assert torch.allclose(both.rollout_logprobs[3 + j, :len(ids)], alone.rollout_logprobs[j, :len(ids)],
                              atol=1e-5)
    # another seed draws other samples (3 rows x 8 tokens of a 259-id vocabulary: equal by chance ~never)
    other = engine.generate(rows[1:], n=3, max_tokens=8, temperature=0.9, seed=6, top_p=0.95, first_index=1)
    assert not torch.equal(other.response_ids, alone.response_ids)
