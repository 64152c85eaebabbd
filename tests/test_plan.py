"""``policyzoo plan``: parameter, FLOP and memory formulas checked against hand arithmetic."""

from __future__ import annotations

import json

import pytest
import yaml

from policyzoo.cli import main
from policyzoo.plan import DEFAULT_CONFIG, Options, PlanError, Shape, Sizes, flops, load_shape, measured_split, memory

# h=4, i=8, 2 layers, 2 heads of 2 (dq=4), 1 kv head (dkv=2), vocab 10, tied, gated
TINY = {"model_type": "llama", "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, "vocab_size": 10,
        "tie_word_embeddings": True}
SIZES = Sizes(prompts=1, samples=2, response=3, prompt=3)


def test_parameters_by_hand():
    m = Shape.from_config(TINY)
    # layer: q 4*4 + o 4*4 + k,v 2*4*2 + MLP 3*4*8 = 32 + 16 + 96 = 144
    assert m.layer_matmul == 144
    # 2 * (144 + 2 norms * 4) + embedding 10*4 (tied) + final norm 4 = 304 + 40 + 4
    assert m.params == 348
    # SmolLM2-135M: layer 2*576*576 + 2*576*192 + 3*576*1536 = 3538944, + 1152 norms, x 30 layers
    # = 106202880, + 49152*576 = 28311552 (tied), + 576 = 134515008 (its published count)
    assert Shape.from_config(DEFAULT_CONFIG).params == 134_515_008
    # GPT-2 keys, ungated MLP (2 matrices), untied head: layer 2*4*4 + 2*4*4 + 2*4*16 = 192
    g = Shape.from_config({"model_type": "gpt2", "n_embd": 4, "n_layer": 1, "n_head": 2, "vocab_size": 10,
                           "tie_word_embeddings": False})
    assert (g.intermediate, g.layer_matmul, g.params) == (16, 192, 192 + 8 + 80 + 4)


def test_flops_by_hand():
    m = Shape.from_config(TINY)
    # prefill of 3 tokens, logits at 1: body 2*2*144*3 = 1728, attention 4*2*4*(1+2+3) = 192, head 2*4*10 = 80
    assert m.forward(3, 0, logits=1) == 2000
    f = flops(m, SIZES, Options())
    # decode per sample: 2 tokens after 3: body 2*2*144*2 = 1152, attention 32*(4+5) = 288, head 80*2 = 160
    assert f == {"rollout prefill": 2000, "rollout decode": 2 * 1600, "policy forward": 5200,
                 "policy backward": 10400, "reference forward": 5200}
    # no reference, gradient checkpointing, two updates, old log-probs. Checkpointing turns prompt sharing off (as the
    # engine does): per row 4448 (below); the recompute of a row skips each layer's down projection (early stop) and
    # the head: 2 * 2 * (144 - 4*8) * 6 = 2688 + attention 672 = 3360. Backward per update 2 * 2 * 4448 + 2 * 3360
    f = flops(m, SIZES, Options(need_ref=False, gradient_checkpointing=True, updates=2, old_logprobs=True))
    assert m.recompute(6) == 3360
    assert f["policy forward"] == 2 * 8896 and f["policy backward"] == 2 * (2 * 8896 + 2 * 3360) == 49024
    assert f["policy old log-probs"] == 8896 and "reference forward" not in f
    # per row without prompt sharing: 2 rows x (6 tokens: body 2*2*144*6 = 3456, attention 32*21 = 672,
    # logits at 4: 320) = 2 * 4448
    assert flops(m, SIZES, Options(share_prompt=False))["policy forward"] == 8896
    # critic (PPO): per row 3456 + 672 + value head 2*4*6 = 4176; forward once without grad + once per update
    f = flops(m, SIZES, Options(need_critic=True))
    assert f["critic forward"] == 2 * 2 * 4176 and f["critic backward"] == 2 * 2 * 4176


def test_lora_parameters_by_hand():
    m = Shape.from_config(TINY)
    # r 2 x (in + out): q 4+4, k 4+2, v 4+2, o 4+4, gate 4+8, up 4+8, down 8+4 = 64 per layer -> 2 x 2 x 64
    assert m.lora_params(2) == 256
    assert m.lora_params(2, ["q_proj", "v_proj"]) == 2 * 2 * (8 + 6)


def test_sliding_window_caps_the_context():
    m = Shape.from_config({**TINY, "sliding_window": 4})
    # positions 4 and 5 attend to min(4, 4) + min(5, 4) = 8 positions instead of 9
    assert m.context_sum(3, 2) == 8 and m.context_sum(0, 3) == 6


def test_memory_by_hand():
    m = Shape.from_config(TINY)
    mem = memory(m, SIZES, Options(micro_batches=2))
    pol = mem["policy (trained)"]
    # weights 348 * 4 B; fp32 grads + AdamW m, v: 348 * 12
    assert (pol["weights"], pol["grads+optimizer"]) == (1392, 4176)
    # Bytes kept per token per layer (4 B weights, rows of 6 tokens): two norms of 4h + 2*4h + 4 = 52 each, attention
    # 4*4*dq + 4*heads + 4*6 (mask row) = 64 + 8 + 24 = 96, MLP 4*4*i = 128 -> 104 + 96 + 128 = 328
    assert m.act_bytes(4, 6) == 328 and m.norm_bytes(4) == 52
    # shared prompt: 7 tokens with grad (3 prompt + 2 rows x 2), 5 scored (1 + 2 x 2); 2 micro-batches of 1 row:
    # ceil(7 / 2) = 4 tokens, ceil(5 / 2) = 3 scored. 2 layers * 328 * 4 = 2624, + the larger of the head's backward:
    # final norm 52 * 4 = 208, logits 4 B * 10 * 3 = 120 and the larger of them (120) and the LM head's weight gradient
    # 4 * 10 * 4 = 160: 488; and a layer's backward gradients 2 * 4 B * (i 8 + h 4) * 4 = 384 -> 3112
    assert pol["activations"] == 3112
    # KV: 2 (k, v) * 2 layers * dkv 2 * 4 B * (3 prompt + 2 * 3 response tokens) = 288
    assert mem["rollout (vLLM copy)"]["kv cache"] == 288
    # a 9-token budget holds one 6-token row (rows are not split): 2 micro-batches, as above
    assert memory(m, SIZES, Options(max_tokens_per_micro_batch=9))["policy (trained)"]["activations"] == 3112
    assert set(mem) == {"policy (trained)", "rollout (vLLM copy)", "reference"}
    # checkpointing (prompt sharing off: 2 rows x 6 = 12 tokens, 2 x 4 = 8 scored): inputs 2 layers * 4 B * 4 * 12 =
    # 384, + the larger of the head's backward (final norm 52 * 12 = 624 + logits 4 * 10 * 8 = 320 twice: 1264) and one
    # layer rebuilt with its backward's gradients ((328 + 2 * 4 * (8 + 4)) * 12 = 5088) -> 5472
    assert memory(m, SIZES, Options(gradient_checkpointing=True))["policy (trained)"]["activations"] == 5472
    # bf16: weights 2 B, fp32 master copy added: 348 * 16
    b = memory(m, SIZES, Options(dtype="bfloat16"))["policy (trained)"]
    assert (b["weights"], b["grads+optimizer"]) == (696, 5568)
    # LoRA: 20 trainable parameters carry state (20 * 12), the weights stay
    lo = memory(m, SIZES, Options(lora_params=20))["policy (trained)"]
    assert (lo["weights"], lo["grads+optimizer"]) == (1392, 240)
    assert memory(m, SIZES, Options(lora_params=20))["reference (adapter off)"]["weights"] == 0
    # PPO's four models: the critic has no LM head (tied: same count) plus the 4 + 1 value head
    assert memory(m, SIZES, Options(need_critic=True))["critic (trained)"]["weights"] == (348 + 5) * 4


def test_bad_configs_are_user_errors(tmp_path):
    with pytest.raises(PlanError, match="num_hidden_layers"):
        Shape.from_config({k: v for k, v in TINY.items() if k != "num_hidden_layers"})
    with pytest.raises(PlanError, match="no config.json"):
        load_shape(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PlanError, match="JSON"):
        load_shape(str(tmp_path))


def test_cli_table(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert main(["plan", "--algo", "grpo", "1", "2", "3", f"model={tmp_path}", "prompt=3"]) == 0
    out = capsys.readouterr().out
    # shares of 26000: prefill 2000 -> 7.7%, decode 3200 -> 12.3%, backward 10400 -> 40.0%
    assert "7.7%" in out and "12.3%" in out and "40.0%" in out and "reference forward" in out
    assert main(["plan", "--algo", "ppo", "1", "2", "3", f"model={tmp_path}", "prompt=3"]) == 0
    assert "critic (trained)" in capsys.readouterr().out
    assert main(["plan", "1", "2", "3", f"model={tmp_path}", "prompt=3", "model.lora={r: 2}"]) == 0
    # with LoRA the reference is the base model inside the policy: no weights of its own
    assert "reference (adapter off)" in capsys.readouterr().out
    assert main(["plan", "1", "2"]) == 2
    assert "P G L together" in capsys.readouterr().err
    assert main(["plan", "-2", "4", "64"]) == 2
    assert "each >= 1" in capsys.readouterr().err
    for bad in ("prompt=abc", "prompt=-5", "prompt=0"):
        assert main(["plan", "1", "2", "3", bad]) == 2
        assert "prompt= takes" in capsys.readouterr().err
    # the config's model.path is planned (was: the embedded default unless model=PATH)
    assert main(["plan", "1", "2", "3", f"model.path={tmp_path}", "prompt=3"]) == 0
    assert f"{tmp_path}: " in capsys.readouterr().out


def test_from_run(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY))
    run = tmp_path / "run"
    run.mkdir()
    config = {"algorithm": {"base": "grpo", "sample": {"use": "group", "n": 2}},
              "model": {"path": str(tmp_path / "model")}, "train": {"prompts_per_step": 1}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    recs = [{"kind": "train", "step": 1, "time_rollout": 9.0, "time_train": 9.0, "time_sync": 9.0,
             "response_length_mean": 9.0},
            {"kind": "train", "step": 2, "time_rollout": 1.0, "time_train": 3.0, "time_sync": 0.5,
             "response_length_mean": 3.0},
            {"kind": "eval", "step": 2, "time_eval": 1.0},
            {"kind": "train", "step": 3, "time_rollout": 1.0, "time_train": 3.0, "time_sync": 0.5,
             "response_length_mean": 3.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    # step 1 (warm-up) is left out: medians of steps 2-3
    assert measured_split(recs) == {"rollout": 1.0, "train": 3.0, "sync": 0.5, "response_length_mean": 3.1,
                                    "prompt_length_mean": None}
    assert main(["plan", "--from-run", str(run), "prompt=3"]) == 0
    out = capsys.readouterr().out
    # L = round(3.1) = 3: the hand example; rollout 5200 of 26000 FLOPs = 20.0%, 1 s of 4 s = 25.0%
    assert "20.0%" in out and "25.0%" in out and "measured split" in out
    assert main(["plan", "--from-run", str(run), "1", "2", "3"]) == 2  # sizes other than the run's
    assert "drop P G L" in capsys.readouterr().err
    # prompt tokens per row from the run when logged: (12 / 4 + 15 / 5) / 2 -> 3 (the hand example's)
    recs[1].update(prompt_tokens=12, sampled_rows=4)
    recs[3].update(prompt_tokens=15, sampled_rows=5)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert measured_split(recs)["prompt_length_mean"] == 3.0
    assert main(["plan", "--from-run", str(run)]) == 0
    assert "3 prompt + 3 response tokens" in capsys.readouterr().out
    # with engine.overlap the rollout's time is a wait, not its cost: no rate for it
    config["engine"] = {"overlap": "one_step"}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["plan", "--from-run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "(wait)" in out and "background" in out


def test_the_settings_that_fit_a_memory_budget_by_hand(tmp_path, capsys):
    from policyzoo.plan import fitting_settings

    m = Shape.from_config(TINY)
    # state, bytes: policy 1392 + 4176, rollout 1392 + 288 kv, reference 1392 = 8640. Activations (test above, all in
    # one micro-batch): 2 * 328 * 7 + 52 * 7 + 4 * 10 * 5 * 2 = 5356 (the head's backward outweighs a layer's
    # gradients, 96 * 7) -> 13996. Checkpointing alone turns prompt sharing
    # off: 5472 -> 14112, no help here; an 8-token budget holds one row: 3112 -> 11752 (16 tokens: both rows, no).
    assert fitting_settings(m, SIZES, Options(), 12000) == [("train.max_tokens_per_micro_batch=8", 11752)]
    # 11500 fits only with both: one row of 6 tokens, 4 scored: inputs 2 * 4 * 4 * 6 = 192 + the larger of 52 * 6 +
    # 2 * 160 = 632 and (328 + 96) * 6 = 2544 -> 2736, total 11376
    assert fitting_settings(m, SIZES, Options(), 11500) == [
        ("train.gradient_checkpointing=true train.max_tokens_per_micro_batch=8", 11376)]
    # below the 8640 bytes of weights and optimizer state nothing activation-side fits
    assert fitting_settings(m, SIZES, Options(), 8000) == []
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    gib = 12000 / 2 ** 30
    assert main(["plan", "--algo", "grpo", "1", "2", "3", f"model={tmp_path}", "prompt=3", f"memory={gib!r}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "does not fit in memory=" in out and "train.max_tokens_per_micro_batch=8" in out
    assert main(["plan", "--algo", "grpo", "1", "2", "3", f"model={tmp_path}", "prompt=3", "memory=1"]) == 0
    assert "fits in memory=1 GiB" in capsys.readouterr().out
    assert main(["plan", "1", "2", "3", "memory=lots"]) == 2
