"""Gradient checkpointing, bf16 autocast, the DeepSpeed config passthrough and LoRA (merged weights,
export) on the tiny Llama, without DeepSpeed: each checked against the plain computation."""

from __future__ import annotations

import json

import pytest
import torch
from _engine_helpers import make_rollout, tiny_model

from policyzoo.engine.trainer import lora
from policyzoo.engine.trainer.dsconfig import ds_config, merge, read_user_config, zero_stage
from policyzoo.engine.trainer.modeling import autocast, enable_gradient_checkpointing, pack
from policyzoo.engine.trainer.prefix import token_logprobs
from policyzoo.errors import ConfigError
from policyzoo.run_config import load_config

PAD = 2
ROLL = make_rollout([[1, 40, 41, 42, 43], [1, 50, 51], [1, 40, 41, 42, 43]],
                    [[60, 61, 62, 63], [70, 71], [64, 65, 66]], 0.7, PAD)


def _load():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32).eval()


def _logprobs(model, roll=ROLL):
    ids, attn, pos, t = pack(roll, PAD, "cpu")
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits[:, :-1]
    return token_logprobs(logits, roll.response_ids, roll.temperature, False)[0] * roll.response_mask


def _grads(model, w):
    model.zero_grad()
    (_logprobs(model) * w).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


W = torch.randn(ROLL.response_ids.shape, generator=torch.Generator().manual_seed(1))


def test_gradient_checkpointing_recomputes_and_gives_the_same_gradients():
    plain, ckpt = _load(), _load()
    assert enable_gradient_checkpointing(ckpt) == 2  # the tiny model's two decoder layers
    calls, mlp = [], ckpt.model.layers[0].mlp
    inner = mlp.forward
    mlp.forward = lambda *a, **k: (calls.append(1), inner(*a, **k))[1]  # (module hooks are off in a recompute)
    want, got = _grads(plain, W), _grads(ckpt, W)
    assert len(calls) == 2  # forward, then again in backward: the layer was checkpointed
    assert not ckpt.model.layers[0].self_attn.training  # submodules (dropout) stay in eval
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-6), n


def test_autocast_computes_in_bf16_over_fp32_weights():
    model = _load()
    with torch.no_grad():
        fp32 = _logprobs(model)
        with autocast(torch.device("cpu"), True):
            bf16 = _logprobs(model)
    diff = float((fp32 - bf16).abs().max())
    assert 0 < diff < 0.1  # bf16 rounding of the logits: moved, but slightly
    with autocast(torch.device("cpu"), True):
        (_logprobs(model) * W).sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())  # fp32 master gradients
    with autocast(torch.device("cpu"), False):
        assert torch.equal(_logprobs(model).detach(), fp32)


def test_user_deepspeed_config_merges_over_ours(tmp_path):
    base = ds_config(1, 1e-5, 0.0, 1.0, "float32")
    user = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}, "gradient_accumulation_steps": "auto",
            "optimizer": {"params": {"eps": 1e-6}}}
    cfg = merge(base, user)
    assert cfg["zero_optimization"] == {"stage": 1, "offload_optimizer": {"device": "cpu"}}
    assert cfg["optimizer"]["params"]["eps"] == 1e-6 and cfg["optimizer"]["params"]["lr"] == 1e-5
    assert cfg["gradient_accumulation_steps"] == 1  # "auto": ours
    assert zero_stage(merge(base, {"zero_optimization": {"stage": 2}})) == 2
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        merge(base, {"gradient_accumulation_steps": 4})
    with pytest.raises(ConfigError, match="fp16"):
        merge(base, {"fp16": {"enabled": True}})
    f = tmp_path / "ds.json"
    f.write_text(json.dumps(user))
    assert read_user_config(str(f)) == user
    f.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        read_user_config(str(f))
    with pytest.raises(ConfigError, match="no such file"):
        read_user_config(str(tmp_path / "missing.json"))


def test_config_keys():
    c = load_config(None, "grpo", ["model.lora={r: 4, target_modules: [q_proj, v_proj]}",
                                   "train.gradient_checkpointing=true", "train.autocast=true",
                                   "engine.deepspeed={zero_optimization: {stage: 1}}"])
    assert c.model.lora.r == 4 and c.model.lora.alpha == 8.0 and c.model.lora.target_modules == ["q_proj", "v_proj"]
    assert c.train.gradient_checkpointing and c.train.autocast and c.engine.deepspeed["zero_optimization"]
    with pytest.raises(ConfigError, match="autocast"):
        load_config(None, "grpo", ["train.autocast=true", "model.dtype=bfloat16", "engine.zero_stage=1"])
    with pytest.raises(ConfigError, match="lora"):
        load_config(None, "grpo", ["model.lora={rank: 4}"])


def _lora_model(**kw):
    settings = load_config(None, "grpo", [f"model.lora={json.dumps(kw)}"]).model.lora
    m = lora.wrap(_load(), settings).eval()
    with torch.no_grad():  # PEFT starts B at 0 (no change): give the adapter a real update
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    return m


def test_lora_merged_weights_give_the_adapted_model(tmp_path):
    from transformers import AutoModelForCausalLM

    m = _lora_model(r=4, alpha=8)
    plain = _load()
    trainable = lora.trainable_count(m)
    # r x (in + out) per adapted linear layer, every linear but the head (all-linear). Tiny Llama:
    # hidden 128, MLP 256, 2 kv heads of 32 (64): q 128+128, k 128+64, v 128+64, o 128+128, gate 128+256,
    # up 128+256, down 256+128 = 2048 per layer, x r 4 x 2 layers = 16384
    assert trainable == 16384
    merged = dict(lora.merged_weights(m))
    assert sorted(merged) == sorted(n for n, _ in plain.named_parameters())
    plain.load_state_dict(merged, strict=False)
    with torch.no_grad():
        want, got = _logprobs(m), _logprobs(plain)
        with m.disable_adapter():  # the reference: the base model
            base = _logprobs(m)
    assert torch.allclose(got, want, atol=1e-5)
    assert float((base - want).abs().max()) > 1e-3 and torch.allclose(base, _logprobs(_load()).detach(), atol=1e-6)

    from transformers import AutoTokenizer

    lora.export(m, str(tmp_path / "final"), AutoTokenizer.from_pretrained(str(tiny_model())))
    assert (tmp_path / "final" / "adapter" / "adapter_model.safetensors").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final")).eval()
    with torch.no_grad():
        assert torch.allclose(_logprobs(reloaded), want, atol=1e-5)
    from peft import PeftModel

    again = PeftModel.from_pretrained(_load(), str(tmp_path / "final" / "adapter")).eval()
    with torch.no_grad():
        assert torch.allclose(_logprobs(again), want, atol=1e-5)


def test_lora_init_is_seeded():
    settings = load_config(None, "grpo", ["model.lora={r: 4}"]).model.lora
    a, b, c = (dict(lora.wrap(_load(), settings, seed).named_parameters()) for seed in (0, 0, 1))
    key = next(k for k in a if "lora_A" in k)
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])


def test_lora_dropout_only_inside_gradient_forwards():
    m = _lora_model(r=4, dropout=0.5)
    with torch.no_grad():
        a, b = _logprobs(m), _logprobs(m)
        assert torch.equal(a, b)  # no dropout outside
        with lora.adapter_dropout(m, True):
            c = _logprobs(m)
        assert not torch.equal(a, c)
        assert torch.equal(_logprobs(m), a)  # back in eval mode


def test_unknown_lora_target_is_a_config_error():
    settings = load_config(None, "grpo", ["model.lora={target_modules: [no_such_proj]}"]).model.lora
    with pytest.raises(ConfigError, match="target_modules"):
        lora.wrap(_load(), settings)
    tied = load_config(None, "grpo", ["model.lora={target_modules: [q_proj, lm_head]}"]).model.lora
    with pytest.raises(ConfigError, match="tied"):  # the tiny Llama ties its head to the embeddings
        lora.wrap(_load(), tied)


def _engine_config(*overrides):
    return load_config(None, "grpo", list(overrides))


def test_check_engine_before_any_model_loads():
    from policyzoo.engine.trainer.dsconfig import check_engine

    assert check_engine(_engine_config()) == 0
    assert check_engine(_engine_config("engine.zero_stage=2")) == 2
    # the user's stage wins; "auto" means engine.zero_stage
    assert check_engine(_engine_config("engine.zero_stage=2", "engine.deepspeed={zero_optimization: {stage: 1}}")) == 1
    assert check_engine(_engine_config("engine.zero_stage=2",
                                       "engine.deepspeed={zero_optimization: {stage: auto}}")) == 2
    for bad in ("7", "abc", "true", "-1"):
        with pytest.raises(ConfigError) as e:
            check_engine(_engine_config(f"engine.deepspeed={{zero_optimization: {{stage: {bad}}}}}"))
        assert e.value.where == "engine.deepspeed.zero_optimization.stage"
    with pytest.raises(ConfigError) as e:  # offload at stage 0: DeepSpeed would ignore it
        check_engine(_engine_config("engine.deepspeed={zero_optimization: {offload_optimizer: {device: cpu}}}"))
    assert e.value.where == "engine.deepspeed.zero_optimization.offload_optimizer" and "stage: 1" in e.value.fix
    assert check_engine(_engine_config("engine.zero_stage=1",
                                       "engine.deepspeed={zero_optimization: {offload_optimizer: {device: cpu}}}")) == 1
    with pytest.raises(ConfigError, match="stage 3"):  # parameter offload is ZeRO-3's
        check_engine(_engine_config("engine.zero_stage=2",
                                    "engine.deepspeed={zero_optimization: {offload_param: {device: cpu}}}"))
    with pytest.raises(ConfigError) as e:
        check_engine(_engine_config("engine.zero_stage=1",
                                    "engine.deepspeed={zero_optimization: {offload_optimizer: {device: gpu}}}"))
    assert e.value.where.endswith("offload_optimizer.device")
    with pytest.raises(ConfigError) as e:  # LoRA at a ZeRO 3 the user's config set: the fix names that key
        check_engine(_engine_config("model.lora={r: 4}", "engine.deepspeed={zero_optimization: {stage: 3}}"))
    assert "engine.deepspeed.zero_optimization.stage <= 2" in e.value.fix
    with pytest.raises(ConfigError) as e:  # fp16: the fix is one the config accepts
        check_engine(_engine_config("engine.deepspeed={fp16: {enabled: true}}"))
    assert "train.autocast: true" in e.value.fix and "train.autocast: bfloat16" not in e.value.fix
    with pytest.raises(ConfigError, match="gradient_clipping"):  # a key policyzoo sets, caught before loading
        check_engine(_engine_config("engine.deepspeed={gradient_clipping: 5.0}"))


def test_an_optimizer_of_another_type_replaces_ours():
    base = ds_config(0, 1e-5, 0.0, 1.0, "float32")
    cfg = merge(base, {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    assert cfg["optimizer"] == {"type": "SGD", "params": {"lr": 0.1}}  # no AdamW betas/eps mixed in
    cfg = merge(base, {"optimizer": {"params": {"eps": 1e-6}}})  # same type (none given): merged
    assert cfg["optimizer"]["type"] == "AdamW" and cfg["optimizer"]["params"]["eps"] == 1e-6
