"""``policyzoo plan`` held to the real transformers model code: one training step executed under
``FakeTensorMode`` (no weights, no GPU) with torch's ``MemTracker`` and ``FlopCounterMode``
(:mod:`policyzoo.testing.fake_step`), against the planner's numbers at the same settings.

The README recipe: 8 GPUs, ZeRO 3, bf16, 64 prompts x 8 samples x 1024 response tokens (103 prompt tokens, the
planner's default), so each rank trains 64 / 8 = 8 prompts x 8 = 64 rows of 1127 tokens. A token budget of 2048
per micro-batch holds one row (rows are not split), so the rank runs 64 micro-batches of one row; activations are
those of one micro-batch, which is what runs under fake tensors (one row; memory would be linear in rows but for
the mask's ``c x c`` per row). ZeRO 3 on N = 8 ranks: parameters, fp32 gradients and the optimizer state
(moments, fp32 master weights) are measured whole and divided by 8; activations are one rank's, not divided.
Not counted on either side: the parameters ZeRO 3 gathers while a layer runs (the plan's per-GPU docstring says
so: at most one layer's or the LM head's weights, 0.47 / 1.09 GB in bf16 for Qwen2.5-7B).

The full depth would take minutes to trace: the step runs at 2 and 4 layers of the full width and each quantity
is extrapolated linearly (per layer: the difference over the two counts; the embedding, LM head, logits and
final norm: what remains), which is exact for a stack of identical layers.
"""

from __future__ import annotations

import functools

import pytest

from policyzoo.plan import GiB, Options, Shape, Sizes, flops, memory
from policyzoo.plan.gpu import GPUS, fits, per_gpu
from policyzoo.plan.placement import Placement
from policyzoo.plan.shapes import SHAPES
from policyzoo.testing.fake_step import Measured, fake_step

README = Sizes(prompts=64, samples=8, response=1024, prompt=103)
RANKS = Placement(gpus=8, zero_stage=3, weight_bytes=2, rollout_bytes=2)
ONE_ROW = Options(dtype="bfloat16", max_tokens_per_micro_batch=2048)  # 2048 // 1127 = 1 row per micro-batch
H100 = GPUS["h100-80gb"][0]

# h 8, i 16, 2 heads of 4 (dq 8), 1 KV head (dkv 4), vocabulary 16, untied, 2 layers, no biases
TINY = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16,
        "tie_word_embeddings": False}


@functools.cache
def measured(name: str, checkpointing: bool = False):
    """The fake step of ``name`` at its full depth, extrapolated from 2 and 4 layers (one row of 103 + 1024)."""
    cfg = SHAPES[name][0]
    two, four = (fake_step(cfg, k, rows=1, prompt=103, response=1024, gradient_checkpointing=checkpointing)
                 for k in (2, 4))
    return two.at(four, cfg["num_hidden_layers"])


def test_tiny_model_flops_and_memory_by_hand():
    m = Shape.from_config(TINY)
    got = fake_step(TINY, 2, rows=1, prompt=3, response=2, dtype="float32")
    # one row of T = 5 tokens, logits at the L + 1 = 3 last. Matmul parameters per layer: q 8*8 + o 8*8 + k, v
    # 2*8*4 + MLP 3*8*16 = 576 -> 2 * 576 * 5 = 5760 FLOPs per layer; head 2 * 8 * 16 * 3 = 768.
    # The plan: causal attention 4 * dq * (1+2+3+4+5) = 4 * 8 * 15 = 480 per layer; forward 2 * (5760 + 480) + 768
    # = 13248, backward 2x: 39744.
    f = flops(m, Sizes(1, 1, 2, 3), Options(share_prompt=False, need_ref=False))
    assert f["policy forward"] + f["policy backward"] == 3 * 13248 == 39744
    # torch's counter: the matmuls and head 3 * (2 * 5760 + 768) = 36864, and per layer sdpa's full square 4 * 1 row *
    # 2 heads * 5 * 5 * 4 = 800 forward, 2.5x that backward (flash backward recomputes the scores): 2800 -> 42464
    assert got.flops == 36864 + 2 * 2800 == 42464
    # parameters: 2 layers x (576 + 2 norms x 8) + embedding and head 2 * 16 * 8 + final norm 8 = 1448, 4 bytes each
    assert got.params == 1448 * 4 == 5792 and got.grads == 5792
    # AdamW: two fp32 moments (8 bytes per parameter) + a 4-byte step count for each of the 21 tensors; no master
    assert got.optimizer == 8 * 1448 + 4 * 21
    # activations, fp32 (module docstring of policyzoo.plan): per token per layer 2 norms x (4*8 + 2*4*8 + 4) = 200,
    # attention 4*4*8 + 4*2 + 4*5 = 156, MLP 4*4*16 = 256 -> 612; 2 layers x 612 x 5 = 6120, final norm 100 x 5 =
    # 500, logits 4 * 16 * 3 = 192 and the LM head's gradient 4 * 16 * 8 = 512 (larger than the logits') -> 7324
    assert memory(m, Sizes(1, 1, 2, 3), Options(share_prompt=False))["policy (trained)"]["activations"] == 7324
    # measured: the same and a few small tensors (rotary cos/sin of 5 x 4 fp32 each, position ids, the loss)
    assert 7324 < got.activations < 7324 * 1.05


def test_extrapolation_through_two_layer_counts():
    # 10 + 3 per layer at 2 layers = 16, at 4 layers = 22 -> at 28 layers 10 + 84 = 94
    two, four = Measured(2, 16, 16, 16, 16, 16), Measured(4, 22, 22, 22, 22, 22)
    assert two.at(four, 28) == Measured(28, 94, 94, 94, 94, 94)
    with pytest.raises(ValueError, match="two different layer counts"):
        two.at(two, 28)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.1-8b"])
def test_memory_of_one_rank_agrees_with_the_plan_within_10_percent(name):
    m = Shape.from_config(SHAPES[name][0])
    # the token budget is what makes the recipe fit an H100 (a rank's 64 rows at once do not)
    assert fits(m, README, ONE_ROW, RANKS, H100) and not fits(m, README, Options(dtype="bfloat16"), RANKS, H100)
    got = measured(name)
    plan = per_gpu(m, README, ONE_ROW, RANKS, H100)["trainer GPU"]
    # ZeRO 3 over 8: weights b/8, fp32 gradients 4/8, moments + fp32 master 12/8 per parameter, activations whole
    mine = (got.params + got.grads + got.optimizer) / 8 + got.activations
    theirs = plan["policy weights"] + plan["gradients"] + plan["optimizer"] + plan["activations"]
    assert theirs == pytest.approx(mine, rel=0.10)
    # and part by part (measured on this machine: state within 0.01%, activations within 0.2%)
    assert plan["activations"] == pytest.approx(got.activations, rel=0.10)
    assert (got.params + got.grads + got.optimizer) / 8 == pytest.approx(
        plan["policy weights"] + plan["gradients"] + plan["optimizer"], rel=0.01)
    assert got.activations > 8 * GiB  # a 1127-token row at full depth: not a trivial agreement near zero


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.1-8b"])
def test_flops_of_one_row_agree_with_the_plan_within_5_percent(name):
    m = Shape.from_config(SHAPES[name][0])
    got = measured(name)
    # the rank's 64 rows are scored per row at ZeRO 3 on 8 ranks (prompt sharing off): the plan's forward +
    # backward of 8 prompts x 8 samples, per row
    f = flops(m, Sizes(8, 8, 1024, 103), Options(dtype="bfloat16", share_prompt=False))
    plan = (f["policy forward"] + f["policy backward"]) // 64
    assert plan == pytest.approx(got.flops, rel=0.05)
    # the whole difference is attention: torch counts the full 1127 x 1127 square and flash backward's recomputed
    # scores (14 dq T^2 per layer), the plan the causal half 3 x 4 dq x T(T+1)/2
    t = 1127
    assert got.flops - plan == m.layers * (14 * m.dq * t * t - 12 * m.dq * m.context_sum(0, t))


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.1-8b"])
def test_with_gradient_checkpointing_memory_and_flops_agree_too(name):
    m = Shape.from_config(SHAPES[name][0])
    got = measured(name, checkpointing=True)
    o = Options(dtype="bfloat16", max_tokens_per_micro_batch=2048, gradient_checkpointing=True)
    plan = per_gpu(m, README, o, RANKS, H100)["trainer GPU"]
    # measured on this machine: activations within 0.7% (the layer inputs and the head's backward: the peak);
    # without the layers' sets the activations are ~5x smaller than without checkpointing
    assert plan["activations"] == pytest.approx(got.activations, rel=0.10)
    assert got.activations < measured(name).activations / 4
    # FLOPs: the recompute re-runs every layer but its down projection (torch's early stop), not the LM head
    f = flops(m, Sizes(8, 8, 1024, 103), o)
    assert (f["policy forward"] + f["policy backward"]) // 64 == pytest.approx(got.flops, rel=0.05)


def test_a_layer_rebuilt_under_checkpointing_with_its_gradients():
    # a small vocabulary (1000) and 4 rows of 200 tokens: the peak is a layer's backward, not the head's
    cfg = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False, "use_sliding_window": False,
           "num_hidden_layers": 8}
    m = Shape.from_config(cfg)
    got = fake_step(cfg, 8, rows=4, prompt=100, response=100, gradient_checkpointing=True)
    # bf16, 800 tokens: inputs 8 x 2 x 256 x 800 = 3_276_800; one layer's set 2 x (4*256 + 2*2*256 + 4) + (4*2*256 +
    # 4*4 + 2*200) + 4*2*1024 = 14_760 per token -> 11_808_000; its backward's gradients 2 x 2 x (1024 + 256) x 800 =
    # 4_096_000: 19_180_800 (the head's backward: 2052 x 800 + 2 x 2 x 1000 x 404 = 3_257_600, smaller)
    o = Options(dtype="bfloat16", share_prompt=False, gradient_checkpointing=True)
    assert memory(m, Sizes(1, 4, 100, 100), o)["policy (trained)"]["activations"] == 19_180_800
    assert got.activations == pytest.approx(19_180_800, rel=0.05)  # measured 19_156_824
