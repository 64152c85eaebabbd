"""Shared-prompt scoring (policyzoo.engine.trainer.prefix) gives the per-row forward's log-probs and
gradients while feeding the model each distinct prompt once."""

from __future__ import annotations

import types

import pytest
import torch
from _engine_helpers import make_rollout, tiny_model

from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.engine.trainer.modeling import pack
from policyzoo.engine.trainer.prefix import (
    CALL_OVERHEAD,
    _cache_layers,
    distinct_prompts,
    length_buckets,
    shared_prompt_logprobs,
    token_logprobs,
)

PAD = 2


def _rollout(prompts, responses, temperature=0.7):
    return make_rollout(prompts, responses, temperature, PAD)


# Two groups of three with prompts of different lengths (5 and 3 tokens: the short one is
# left-padded), interleaved rows (grouping must not rely on order), ragged responses (right padding).
P1, P2 = [1, 40, 41, 42, 43], [1, 50, 51]
ROLL = _rollout([P1, P2, P1, P2, P1, P2],
                [[60, 61, 62, 63], [70, PAD], [64], [71, 72, 73, 74], [65, 66, PAD], [75, 76, 77]])

# One long response among short ones, and one-token rows that make no call (see test_one_token_rows...).
LONG = _rollout([P1, P1, P2, P2, P1, P2], [list(range(60, 80)), [61, 62], [70], [71, PAD], [63], [72, 73]])


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32).eval()


def _per_row(model, roll):
    ids, attn, pos, t = pack(roll, PAD, "cpu")
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits[:, :-1]
    return token_logprobs(logits, roll.response_ids, roll.temperature, False)[0]


def _shared(model, roll):
    return shared_prompt_logprobs(model, roll, PAD, "cpu", False)[0]


def test_distinct_prompts_by_token_ids_in_first_seen_order():
    # rows ask [1,2], [3], [1,2], [3], [1,2] -> distinct [[1,2], [3]], row i -> 0 1 0 1 0
    distinct, index = distinct_prompts([[1, 2], [3], [1, 2], [3], [1, 2]])
    assert distinct == [[1, 2], [3]] and index.tolist() == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("roll", [ROLL, LONG], ids=["one-group", "two-length-groups"])
def test_logprobs_equal_the_unpadded_forward_of_each_row(model, roll):
    # Reference independent of both batching schemes: each row alone, unpadded, prompt + response
    # through the model; token t read at position len(prompt) - 1 + t, logits / temperature.
    with torch.no_grad():
        got = _shared(model, roll)
        for i, (p, r) in enumerate(zip(roll.prompt_ids, roll.response_ids.tolist())):
            n = int(roll.response_mask[i].sum())
            ref = (model(torch.tensor([p + r[:n]])).logits[0] / 0.7).log_softmax(-1)
            want = torch.tensor([ref[len(p) - 1 + k, tok].item() for k, tok in enumerate(r[:n])])
            assert torch.allclose(got[i, :n], want, atol=1e-5), (i, got[i, :n], want)


@pytest.mark.parametrize("roll", [ROLL, LONG], ids=["one-group", "two-length-groups"])
def test_gradients_equal_the_per_row_forward(model, roll):
    # loss = sum over real tokens of w * logprob, with fixed random weights w: the gradient of
    # every parameter must match the per-row forward's (the shared prompt's cache carries the
    # gradients of all rows that use it back into the one prompt forward).
    w = torch.randn(roll.response_ids.shape, generator=torch.Generator().manual_seed(1)) * roll.response_mask
    grads = []
    for fn in (_per_row, _shared):
        model.zero_grad()
        (fn(model, roll) * w).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    scale = max(float(g.abs().max()) for g in grads[0].values())
    assert scale > 0
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-5 * scale), n
    model.zero_grad()


class _Counting(torch.nn.Module):
    """Records how many token positions each call feeds the model."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.fed = inner, []

    def forward(self, **kw):
        self.fed.append(kw["input_ids"].numel())
        return self.inner(**kw)


def test_each_distinct_prompt_runs_once(model):
    # Per row: 6 rows x (prompt width 5 + T 4) = 54 positions. Shared: 2 distinct prompts x width 5
    # = 10, then the response positions: lengths [4, 2, 1, 4, 3, 3]; the one-token row needs no
    # response call (scored from its prompt's last position), the other 5 rows run padded to 4
    # minus the last token (it predicts nothing the loss uses): 5 x 3 = 15 (splitting them further
    # would cost a 16-position call to save at most 2 x 1 positions). 25 positions in 2 calls.
    counting = _Counting(model)
    with torch.no_grad():
        _shared(counting, ROLL)
    assert counting.fed == [10, 15]
    ids, _, _, _ = pack(ROLL, PAD, "cpu")
    assert ids.numel() == 54


def test_length_buckets_minimise_padded_positions_plus_call_overhead():
    # Lengths [32, 5, 6, 5, 7, 6, 5, 5], overhead 128 positions per group (CALL_OVERHEAD); a group costs
    # rows x (longest - 1) + 128:
    #   one group:                 8 x 31 + 128                          = 376
    #   {32} + {7, 6, 5}:          1 x 31 + 128 + 7 x 6 + 128            = 329  <- best
    #   {32} + {7, 6} + {5}:       159 + (3 x 6 + 128) + (4 x 4 + 128)   = 449
    assert CALL_OVERHEAD == 128
    assert length_buckets([32, 5, 6, 5, 7, 6, 5, 5]) == [[0], [1, 2, 3, 4, 5, 6, 7]]
    # bench/length_groups.py's two patterns, as measured fastest there:
    # close [128, 120, 112, 104] x 2: one group 8 x 127 + 128 = 1144; {128, 120} + {112, 104}:
    #   4 x 127 + 4 x 111 + 256 = 1208; four groups 2 x (127 + 119 + 111 + 103) + 512 = 1432
    assert length_buckets([128, 120, 112, 104] * 2) == [list(range(8))]
    # spread [128, 128, 128, 96, 64, 48, 32, 16]: {128..96} + {64..16}: 4 x 127 + 4 x 63 + 256 = 1016;
    #   one group 1016 + 128 = 1144; {128 x 3, 96, 64} + {48, 32, 16}: 5 x 127 + 3 x 47 + 256 = 1032;
    #   three groups {128..96} {64, 48} {32, 16}: 508 + 126 + 62 + 384 = 1080
    assert length_buckets([128, 128, 128, 96, 64, 48, 32, 16]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # At 16 (the value before the measurement) the spread pattern split six ways: 381 + 95 + 63 + 47 + 31 + 15 + 96
    assert len(length_buckets([128, 128, 128, 96, 64, 48, 32, 16], overhead=16)) == 6
    # Without call overhead every distinct length is its own group (no padding at all):
    # {3}: rows 0, 2; {2}: row 3; {1}: row 1.
    assert length_buckets([3, 1, 3, 2], overhead=0) == [[0, 2], [3], [1]]
    # One-token responses make no call, so they cost nothing apart: [3, 1, 1, 1, 1, 1] merged
    # costs 6 x 2 + 128 = 140, split {3} + {1} costs (1 x 2 + 128) + 0 = 130.
    assert length_buckets([3, 1, 1, 1, 1, 1]) == [[0], [1, 2, 3, 4, 5]]
    # Equal lengths: one group.
    assert length_buckets([4, 4, 4]) == [[0, 1, 2]]


def test_one_token_rows_make_no_call_and_short_rows_join_the_long_one(model):
    # LONG: lengths [20, 2, 1, 2, 1, 2] (the PAD of [71, PAD] is a generated EOS, masked in); 128 a call:
    #   one group: 6 x 19 + 128 = 242; {20, 2} + {1}: 4 x 19 + 128 + 0 = 204 (best: one-token rows make no call);
    #   {20} + {2} + {1}: (19 + 128) + (3 x 1 + 128) + 0 = 278; {20} + {2, 1}: 147 + (5 x 1 + 128) = 280.
    # Calls: prompts (2 x width 5 = 10), the four rows of 2 or 20 tokens padded to 20 (4 x 19 = 76).
    counting = _Counting(model)
    with torch.no_grad():
        _shared(counting, LONG)
    assert counting.fed == [10, 76]


def test_masked_columns_are_exactly_zero_on_both_paths(model):
    # A row whose mask has a hole ([T, F, T]) and a row with no token at all: wherever the mask
    # is False the log-prob is exactly 0, shared or per row, whatever group the row landed in.
    roll = _rollout([P1, P1, P2], [[60, 61, 62], [63, 64, 65], [70, 71, 72]])
    roll.response_mask[0, 1] = False
    roll.response_mask[1, :] = False
    tr = _bare_trainer(model)
    for share in (True, False):
        lp, ent = tr._logprobs(model, roll, True, share)
        assert torch.all(lp[~roll.response_mask] == 0) and torch.all(ent[~roll.response_mask] == 0)
        assert torch.all(lp[roll.response_mask] < 0) and torch.all(ent[roll.response_mask] > 0)


def test_a_sliding_window_model_matches_across_length_groups():
    # Sliding-window cache layers keep a token counter besides their tensors: restoring only the
    # tensors between groups built masks for prompt + previous group + this group (a crash on
    # the second group). A tiny random Mistral (window 4096) must match the per-row forward
    # with LONG's three length groups.
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=4096, max_position_embeddings=512)
    m = MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        got, want = _shared(m, LONG), _per_row(m, LONG)
    assert torch.allclose(got[LONG.response_mask], want[LONG.response_mask], atol=1e-5)


def test_cache_layer_kinds_not_known_to_be_restorable_are_refused():
    class Other:
        pass

    with pytest.raises(TypeError, match="unsupported cache layer kind"):
        _cache_layers(types.SimpleNamespace(layers=[Other()]))


def test_one_token_responses_need_only_the_prompt_forward(model):
    # T = 1: token 0 is scored from the prompt's last position; no response forward at all.
    roll = _rollout([P1, P1, P2], [[60], [61], [70]])
    counting = _Counting(model)
    with torch.no_grad():
        got, want = _shared(counting, roll), _per_row(model, roll)
    assert counting.fed == [10]  # 2 distinct prompts x width 5
    assert torch.allclose(got, want, atol=1e-5)


def _bare_trainer(engine) -> Trainer:
    tr = Trainer.__new__(Trainer)  # the scoring paths only, without DeepSpeed
    tr.engine, tr.pad_id, tr.device, tr.share_prompt = engine, PAD, torch.device("cpu"), True
    return tr


def test_startup_check_keeps_sharing_on_a_model_that_agrees(model):
    tr = _bare_trainer(model)
    assert tr.check_share_prompt(list(range(3, 40))) is None and tr.share_prompt


def test_startup_check_turns_sharing_off_when_it_cannot_check(model):
    tr = _bare_trainer(model)
    why = tr.check_share_prompt([5, 6, 7])
    assert not tr.share_prompt and "unchecked" in why


def test_startup_check_falls_back_to_per_row_scoring_on_a_model_without_cache_support(model):
    class NoCache(torch.nn.Module):
        def forward(self, past_key_values=None, use_cache=False, **kw):
            if use_cache:
                raise TypeError("forward() got an unexpected keyword argument 'past_key_values'")
            return model(**kw)

    tr = _bare_trainer(NoCache())
    why = tr.check_share_prompt(list(range(3, 40)))
    assert not tr.share_prompt and "TypeError" in why and "scoring per row" in why
    lp, _ = tr._logprobs(tr.engine, ROLL, False)  # still scores, per row
    with torch.no_grad():
        m = ROLL.response_mask
        assert torch.allclose(lp[m], _per_row(model, ROLL)[m], atol=1e-6) and torch.all(lp[~m] == 0)


def test_startup_check_falls_back_when_the_numbers_differ(model):
    class Wrong(torch.nn.Module):  # a cache path that silently shifts the logits
        def forward(self, **kw):
            out = model(**kw)
            if kw.get("past_key_values") is not None:
                out = types.SimpleNamespace(logits=out.logits + torch.linspace(0, 1, out.logits.shape[-1]))
            return out

    tr = _bare_trainer(Wrong())
    why = tr.check_share_prompt(list(range(3, 40)))
    assert not tr.share_prompt and "differs from the per-row forward" in why


def test_startup_check_tolerance_follows_the_weights_dtype(model):
    class Rounding(torch.nn.Module):  # the cache path off by a logit shift of at most 0.05 (bf16-sized rounding)
        def forward(self, **kw):
            out = model(**kw)
            if kw.get("past_key_values") is not None:
                out = types.SimpleNamespace(logits=out.logits + torch.linspace(0, 0.05, out.logits.shape[-1]))
            return out

    # a shift of the logits by values in [0, s] moves every log-prob by at most s: |diff| <= 0.05
    fp32, bf16 = _bare_trainer(Rounding()), _bare_trainer(Rounding())
    fp32.dtype, bf16.dtype = "float32", "bfloat16"
    assert "tolerance 0.001" in fp32.check_share_prompt(list(range(3, 40))) and not fp32.share_prompt
    assert bf16.check_share_prompt(list(range(3, 40))) is None and bf16.share_prompt  # tolerance 0.1
    check = bf16.share_prompt_check
    assert check["tolerance"] == 0.1 and 1e-3 < check["max_diff"] <= 0.05 and check["mean_diff"] <= check["max_diff"]
