"""``policyzoo plan --gpus N``: the per-GPU verdict (``policyzoo.plan.gpu``) against hand arithmetic and the
ZeRO paper's memory table, the known shapes (``policyzoo.plan.shapes``) and the named GPUs."""

from __future__ import annotations

import json

import pytest

from policyzoo.cli import main
from policyzoo.plan import GiB, Options, Shape, Sizes
from policyzoo.plan.gpu import Vllm, per_gpu, smallest_fits
from policyzoo.plan.placement import Placement, per_parameter
from policyzoo.plan.shapes import SHAPES


def shape(name: str) -> Shape:
    return Shape.from_config(SHAPES[name][0])


def test_known_shapes_have_the_model_cards_parameter_counts():
    # worked in policyzoo/plan/shapes.py's docstring: layers x (attention + MLP + 2 norms) + embedding(s) + norm
    assert shape("qwen2.5-1.5b").params == 1_543_656_960  # 1.54B
    assert shape("qwen2.5-7b").params == 7_615_487_488  # 7.61B
    assert shape("llama-3.1-8b").params == 8_030_261_248  # 8.03B
    assert shape("llama-3.1-70b").params == 70_553_706_496  # 70.6B


def test_the_zero_papers_table():
    # Rajbhandari et al. 2020 (arXiv:1910.02054), Fig. 1: 7.5B parameters, mixed-precision Adam K = 12, fp16
    # weights and gradients (2 + 2 + 12 = 16 bytes per parameter), N = 64 GPUs, per GPU:
    #   baseline 16 x 7.5e9 = 120 GB; P_os 2 + 2 + 12/64 = 4.1875 -> 31.4 GB; P_os+g 2 + 14/64 = 2.21875 -> 16.6 GB;
    #   P_os+g+p 16/64 = 0.25 -> 1.875 GB (the paper's 1.9 GB)
    psi, want = 7.5e9, {0: 120e9, 1: 31.40625e9, 2: 16.640625e9, 3: 1.875e9}
    for z, total in want.items():
        p = Placement(gpus=64, zero_stage=z, weight_bytes=2, rollout_bytes=2, need_ref=False, mode="server",
                      grad_bytes=2)
        t = per_parameter(p)["trainer GPU"]
        assert t["policy weights"] + t["gradients"] + t["optimizer"] == pytest.approx(total / psi)
    # this project's convention keeps fp32 gradients (4 bytes): 18 per parameter at ZeRO 0 -> 135 GB
    t = per_parameter(Placement(gpus=64, weight_bytes=2, need_ref=False, mode="server"))["trainer GPU"]
    assert sum(t.values()) * psi == 135e9


QWEN7 = dict(gpus=8, zero_stage=3, weight_bytes=2, rollout_bytes=2, need_ref=True)


def test_qwen7b_on_8_gpus_by_hand():
    m, n = shape("qwen2.5-7b"), 7_615_487_488
    budget = 80 * GiB  # 85_899_345_920
    got = per_gpu(m, Sizes(4, 8, 256, 103), Options(dtype="bfloat16"), Placement(**QWEN7), budget)["trainer GPU"]
    # ZeRO 3 over 8: weights 2/8 n, fp32 grads 4/8 n, m + v + fp32 master 12/8 n, reference 2/8 n
    assert got["policy weights"] == got["reference"] == n // 4 == 1_903_871_872
    assert got["gradients"] == n // 2 and got["optimizer"] == 3 * n // 2 == 11_423_231_232
    # one rank's share: ceil(4 / 8) = 1 prompt x 8 samples, scored per row (ZeRO 3 on 8 ranks turns prompt sharing
    # off): 8 x 359 = 2872 tokens, 8 x 257 = 2056 logits. Bytes per token per layer (bf16, rows of 359): two norms of
    # 4 x 3584 + 2 x 2 x 3584 + 4 = 28_676, attention 4 x 2 x 3584 + 4 x 28 + 2 x 359 = 29_502, MLP 4 x 2 x 18_944 =
    # 151_552: 238_406 x 28 layers x 2872 = 19_171_656_896; final norm 28_676 x 2872 = 82_357_472; logits 2 x 152_064
    # x 2056 = 625_287_168 and the larger of them and the LM head's weight gradient 2 x 152_064 x 3584 = 1_089_994_752
    assert m.act_bytes(2, 359) == 238_406
    assert got["activations"] == 19_171_656_896 + 82_357_472 + 625_287_168 + 1_089_994_752 == 20_969_296_288
    # vLLM bf16 copy 2 n; KV 2 x 28 layers x 512 x 2 bytes = 57_344 per token x (103 + 8 x 256) = 123_346_944;
    # the reserve fills vLLM's 0.3 x 80 GiB = 25_769_803_776 share: 25_769_803_776 - 15_230_974_976 - 123_346_944
    assert got["vLLM copy"] == 2 * n and got["KV cache"] == 123_346_944
    assert got["vLLM reserve"] == 10_415_481_856
    assert got["sync buffer"] == 152_064 * 3584 * 2  # the embedding, gathered alone by the streamed push
    # total 19_038_718_720 + 20_969_296_288 + 25_769_803_776 + 1_089_994_752 = 66_867_813_536 bytes = 62.28 GiB
    assert sum(got.values()) == 66_867_813_536


def test_the_cli_verdict_agrees_with_the_table(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(SHAPES["qwen2.5-7b"][0]))  # model.path may be the file
    args = ["plan", f"model.path={tmp_path / 'config.json'}", "model.dtype=bfloat16", "engine.zero_stage=3",
            "memory=80", "--gpus", "8"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    # 66_867_813_536 bytes / 2^30 = 62.28 GiB (test above), in the table and in the verdict
    assert "│ total │ 62.28 │" in out
    assert "8 trainer GPUs colocated with TP 1 (ZeRO 3): 62.28 GiB on the fullest GPU, fits in memory=80 GiB" in out
    assert "memory, GiB (one rank)" not in out and "does not fit" not in out
    # without memory= the default GPU, said: H100 81_559 MiB / 1024 = 79.6 GiB
    assert main(["plan", "--shape", "qwen2.5-7b", "model.dtype=bfloat16", "engine.zero_stage=3", "--gpus", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU memory: h100-80gb = 79.6 GiB" in out and "the default GPU" in out
    assert "fits in h100-80gb (79.6 GiB)" in out


def test_the_smallest_placement_that_fits_by_hand():
    # Llama-3.1-70B, n = 70_553_706_496, bf16, ZeRO 3 with a reference: (2 + 4 + 12 + 2) / N = 20 / N per parameter;
    # sync buffer 128_256 x 8192 x 2 = 2_101_346_304; 64 prompts of 1 token, G = 1, L = 1: activations and KV are
    # ~50 MB; vLLM's share 1% of 80 GiB, below every copy: no reserve
    m, budget = shape("llama-3.1-70b"), 80 * GiB  # 85_899_345_920
    p = Placement(zero_stage=3, weight_bytes=2, rollout_bytes=2)
    got = smallest_fits(m, Sizes(64, 1, 1, 1), Options(dtype="bfloat16"), p, budget, Vllm(0.01))
    # colocated: N = 16, TP 8: 88_192_133_120 + 2/8 n 17_638_426_624 > budget; N = 32: 44_096_066_560 + 2_101_346_304
    #   + copy 2/k n: TP 2 70_553_706_496 (no), TP 4 35_276_853_248 -> 81.47e9 + ~0.05e9 < 85.9e9 (yes)
    # server: trainer N = 16 88.2e9 (no), N = 32 46.2e9 (yes); server GPU 2/k n: TP 1 141e9 (no), TP 2 70.6e9 (yes)
    assert [(q.mode, q.gpus, q.tp, q.zero_stage) for q in got] == [("colocated", 32, 4, 3), ("server", 32, 2, 3)]


def test_none_fits_names_the_gpus_that_would(capsys):
    args = ["plan", "--shape", "llama-3.1-70b", "model.dtype=bfloat16", "engine.zero_stage=3", "--gpus", "8",
            "--rollout-tp", "8", "--gpu", "h100-80gb"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    # ZeRO 3 state 20/8 x 70.55e9 = 176.4e9 bytes = 164 GiB per GPU before activations: over 79.6 GiB
    assert "does not fit in h100-80gb (79.6 GiB)" in out
    # a whole step's share per rank (ceil(64 / N) prompts x 8 rows of 359 tokens, no micro-batches) keeps > 80 GB of
    # activations even at N = 1024 (8 rows x 359 x 80 layers x ~420 KB); one row per micro-batch fits at 32 GPUs
    assert "no placement of 8 GPUs fits: none of up to 1024 GPUs fits with these settings" in out
    assert ("with train.gradient_checkpointing=true train.max_tokens_per_micro_batch=359: >= 32 trainer GPUs colocated "
            "with TP 4 (ZeRO 3)") in out  # 103 + 256


def test_unknown_names_are_user_errors(capsys):
    assert main(["plan", "--shape", "gpt-9", "--gpus", "2"]) == 2
    assert "qwen2.5-7b" in capsys.readouterr().err
    assert main(["plan", "--gpu", "tpu-v5", "--gpus", "2"]) == 2
    assert "h100-80gb" in capsys.readouterr().err
    assert main(["plan", "--gpu", "h100-80gb", "memory=80"]) == 2
    assert main(["plan", "--shape", "qwen2.5-7b", "model=/some/folder"]) == 2
    assert "both name the model" in capsys.readouterr().err


def test_a_named_gpu_without_gpus_judges_one_rank(capsys):
    assert main(["plan", "--gpu", "l4-24gb"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # one rank's table, judged against the L4: 23_034 MiB / 1024 = 22.49 GiB
    assert "memory, GiB (one rank)" in out and "GPU memory: l4-24gb = 22.5 GiB" in out
    assert "fits in l4-24gb (22.5 GiB)" in out


def test_the_70b_plan_never_asks_for_more_than_one_gpu_of_vllm_memory(capsys):
    # fp32 70B: vLLM's copy alone is 70.55e9 x 4 bytes = 263 GiB, 3.3 H100s: no utilization setting holds it
    from policyzoo.cli import main

    assert main(["plan", "--shape", "llama-3.1-70b", "--gpus", "8"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "more than one GPU holds: shard vLLM over more GPUs" in text
    assert "give engine.gpu_memory_utilization >=" not in text
    assert "none of up to 1024 GPUs fits with these settings" in text and "with train.gradient_checkpointing" in text


@pytest.mark.parametrize("argv", [["--gpus", "0"], ["--gpus", "-2"], ["--gpus", "8", "--rollout-tp", "0"]])
def test_a_gpu_count_below_1_is_refused(argv, capsys):
    from policyzoo.cli import main

    assert main(["plan", "--shape", "qwen2.5-7b", *argv]) == 2
    assert "takes a GPU count >= 1" in capsys.readouterr().err


def test_a_placement_that_fits_only_at_a_higher_zero_stage_says_so(capsys):
    # qwen2.5-7b in fp32 (the default dtype), n = 7_615_487_488, 8 H100s (81_559 MiB = 85_520_809_984 bytes), TP 2.
    # Activations of one rank (1 prompt x 8 rows of 359 tokens, scored per row at ZeRO 3 on 8 ranks): bytes per token
    # per layer 2 x 43_012 (norms: 4 x 3584 + 2 x 4 x 3584 + 4) + 58_892 (attention: 4 x 4 x 3584 + 112 + 4 x 359)
    # + 303_104 (MLP 4 x 4 x 18_944) = 448_020, x 28 x 2872 = 36_027_976_320, + final norm 43_012 x 2872 = 123_530_464,
    # + logits 4 x 152_064 x 2056 = 1_250_574_336 + the LM head's gradient 4 x 152_064 x 3584 = 2_179_989_504:
    # 39_582_070_624 bytes. ZeRO 0 (prompts shared) does not fit: 4 + 4 + 8 + 4 + copy 2 = 22 n = 167.5e9 before
    # activations. ZeRO 3 colocated TP 2: weights, grads, reference 4/8 each + optimizer 8/8 = 2.5 n =
    # 19_038_718_720, vLLM's share 0.3 x 85_520_809_984 = 25_656_242_995, streamed sync buffer 152_064 x 3584 x 4 =
    # 2_179_989_504, activations: 86_457_021_843 = 80.52 GiB > 79.6 GiB; a server (no vLLM share on the trainer):
    # 60.8e9, fits. ZeRO 1 and 2 keep 4 n of fp32 weights and more: a server at ZeRO 2, 9.5 n = 72.3e9 + activations
    # with shared prompts (1 x 103 + 8 x 255 tokens) > 79.6 GiB
    args = ["plan", "--gpus", "8", "--rollout-tp", "2", "--gpu", "h100-80gb", "--shape", "qwen2.5-7b"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "8 trainer GPUs colocated with TP 2 (ZeRO 0):" in out and "does not fit" in out
    assert ("no placement of 8 GPUs fits at ZeRO 0; with engine.zero_stage=3 (ZeRO shards the training state over "
            "the 8 GPUs) these fit: 8 trainer GPUs + a rollout server of TP 2 on its own GPUs (ZeRO 3)") in out
    assert "needs >= 8 trainer GPUs" not in out  # the old verdict: 8 GPUs "do not fit" but "need >= 8"
    # and at the stage it names, the server placement is said to fit
    assert main([*args, "engine.zero_stage=3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "8 trainer GPUs colocated with TP 2 (ZeRO 3): 80.52 GiB on the fullest GPU, does not fit in h100-80gb" in out
    assert ("placements of the same GPUs that fit: 8 trainer GPUs + a rollout server of TP 2 on its own GPUs "
            "(ZeRO 3)") in out
