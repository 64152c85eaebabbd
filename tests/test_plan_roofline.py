"""``policyzoo plan --gpu NAME``: the roofline lower bound of a step (``policyzoo.plan.roofline``) by hand."""

from __future__ import annotations

import pytest

from policyzoo.cli import main
from policyzoo.plan import Options, Shape, Sizes, flops
from policyzoo.plan.gpu import GPUS
from policyzoo.plan.roofline import SPEEDS, roofline
from policyzoo.plan.shapes import SHAPES

# h 4, i 8, 2 layers, 2 heads of 2 (dq 4), 1 KV head (dkv 2), vocabulary 10, tied: 348 parameters (tests/test_plan.py)
TINY = {"model_type": "llama", "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, "vocab_size": 10,
        "tie_word_embeddings": True}


def test_every_gpu_has_its_speeds():
    assert set(SPEEDS) == set(GPUS)
    assert SPEEDS["h100-80gb"][:2] == (989e12, 3.35e12)  # the H100 SXM datasheet: bf16 dense, HBM3


def test_roofline_by_hand():
    m, s, o = Shape.from_config(TINY), Sizes(prompts=1, samples=2, response=3, prompt=3), Options()
    f = flops(m, s, o)  # prefill 2000, decode 3200, policy 5200 + 10400, reference 5200 (tests/test_plan.py)
    got = roofline(m, s, o, f, "h100-80gb")
    peak, bw = 989e12, 3.35e12
    # fp32: weights 348 x 4 = 1392 bytes; KV 2 x 2 layers x dkv 2 x 4 = 32 bytes per token
    # prefill: 2000 FLOPs; weights once + 3 prompt tokens' KV: 1392 + 96 = 1488 bytes
    assert got["rollout prefill"] == pytest.approx((2000, 1488, 1488 / bw))
    # decode: L - 1 = 2 steps, each reading the weights (2 x 1392) and each of the 2 rows' KV so far (3 + 1, then
    # 3 + 2 tokens: 9 x 32 bytes per row): 2784 + 576 = 3360 bytes, bandwidth-bound
    assert got["rollout decode"] == pytest.approx((3200, 3360, 3360 / bw))
    # training: 5200 + 10400 + 5200 = 20800 FLOPs; weights read by forward, 2 x backward and the reference: 4 x 1392
    assert got["training"] == pytest.approx((20800, 5568, 5568 / bw))
    # optimizer (fp32: no master copy): read + write 2 moments 16, read the gradient 4, write the weight 4: 24 x 348
    assert got["optimizer step"] == pytest.approx((0, 8352, 8352 / bw))
    assert 20800 / peak < 5568 / bw  # so small a model is bandwidth-bound even in training


def test_at_the_readme_recipe_decode_is_bandwidth_bound_and_training_compute_bound():
    m = Shape.from_config(SHAPES["qwen2.5-7b"][0])
    s = Sizes(prompts=64, samples=8, response=1024, prompt=103)
    o = Options(dtype="bfloat16", share_prompt=False, max_tokens_per_micro_batch=2048)
    got = roofline(m, s, o, flops(m, s, o), "h100-80gb", gpus=8, zero_stage=3)
    peak, bw = 989e12, 3.35e12
    fl, by, sec = got["rollout decode"]
    # 1023 decode steps each read the 7.6e9 bf16 weights: >= 1023 x 15.23e9 bytes / 3.35e12 = 4.65 s
    assert by >= 1023 * m.params * 2 and sec == by / bw > fl / peak
    fl, by, sec = got["training"]
    assert sec == fl / peak > by / bw
    # ZeRO 3 over 8: the optimizer touches n / 8 parameters, 2 x 12 + 4 + 2 = 30 bytes each
    assert got["optimizer step"][1] == pytest.approx(30 * m.params / 8)


def test_a_float32_plan_is_bounded_by_the_tf32_peak():
    # fp32 matmuls run on TF32 tensor cores (the GPU profile's train.tf32): half the bf16 dense peak, 494.5 of 989
    # TFLOP/s on an H100 SXM; the same FLOPs take twice the compute seconds of a bf16 plan's
    m = Shape.from_config(SHAPES["qwen2.5-7b"][0])
    s = Sizes(prompts=64, samples=8, response=1024, prompt=103)
    o32 = Options(dtype="float32", share_prompt=False, max_tokens_per_micro_batch=2048)
    fl, by, sec = roofline(m, s, o32, flops(m, s, o32), "h100-80gb", gpus=8, zero_stage=3)["training"]
    assert sec == pytest.approx(fl / 494.5e12) and sec > by / 3.35e12


def test_the_cli_prints_it_as_a_lower_bound(capsys):
    assert main(["plan", "--shape", "qwen2.5-7b", "--gpu", "h200-141gb"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "roofline lower bound of one step per GPU (1 x h200-141gb)" in out
    assert "NVIDIA H200 datasheet" in out and "A lower bound" in out and "total (lower bound)" in out
    assert main(["plan", "--shape", "qwen2.5-7b"]) == 0  # no GPU named: no roofline
    assert "roofline" not in capsys.readouterr().out
