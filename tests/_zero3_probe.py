"""Run by tests/test_sync_streamed.py under torchrun (2 CPU ranks): a ZeRO-3 trainer with a reference
(models loaded under deepspeed.zero.Init, the reference as a stage-3 engine) scores a rollout; a whole
transformers copy (the replica the other stages keep) scores it too. Rank 0 prints one JSON line."""

import json
import sys

from policyzoo.engine.process import setup_process

setup_process(threads=1)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.integrations import is_deepspeed_zero3_enabled  # noqa: E402

from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings  # noqa: E402
from policyzoo.contract import Rollout  # noqa: E402
from policyzoo.engine import dist  # noqa: E402
from policyzoo.engine.models import resolve_model  # noqa: E402
from policyzoo.engine.trainer.deepspeed_trainer import Trainer  # noqa: E402
from policyzoo.engine.trainer.modeling import pack  # noqa: E402
from policyzoo.engine.trainer.prefix import token_logprobs  # noqa: E402

path = sys.argv[1]
dist.init()
trainer = Trainer(resolve_model(path), ModelSettings(), TrainSettings(lr=1e-2, weight_decay=0.0, grad_clip=0.0),
                  EngineSettings(zero_stage=3, critic_lr=1e-2),
                  need_ref=True, need_critic=False)
resp = torch.tensor([[5, 6, 7, 8], [9, 10, 2, 2]])
mask = torch.tensor([[True] * 4, [True, True, True, False]])
r = Rollout(prompt_ids=[[1, 9, 10], [1, 4]], response_ids=resp, response_mask=mask,
            rollout_logprobs=torch.zeros(2, 4), group_ids=torch.tensor([0, 1]), truncated=torch.tensor([False] * 2),
            temperature=0.7)
zero3_after = is_deepspeed_zero3_enabled()  # a later transformers load (the HF rollout) must be whole
ref = trainer.ref_logprobs(r)
pol = trainer.logprobs(r, grad=False)[0]
replica = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
with torch.no_grad():
    ids, attn, pos, t = pack(r, trainer.pad_id, torch.device("cpu"))
    logits = replica(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -t - 1:-1]
    want = torch.where(mask, token_logprobs(logits, resp, 0.7, False)[0], 0.0)
held = lambda ps: sum(p.ds_tensor.numel() for p in ps)  # noqa: E731 - this rank's partition
full = sum(p.ds_numel for p in trainer.engine.module.parameters())
out = {"ref_diff": float((ref - want).abs().max()), "policy_diff": float((pol - want).abs().max()),
       "policy_held": held(trainer.engine.module.parameters()) / full,
       "ref_held": held(trainer.ref.module.parameters()) / full,
       "whole_now": sum(p.numel() for p in trainer.ref.module.parameters()), "trainable": trainer.trainable_params,
       "replica_params": sum(p.numel() for p in replica.parameters()), "zero3_after": zero3_after}
if dist.rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.close()  # a gloo group left to the exit can abort the process after the work (policyzoo.engine.dist.close)
