"""Run by tests/test_sync_streamed.py under torchrun (2 CPU ranks): one DeepSpeed update of the tiny
model at the ZeRO stage given in argv[1], then the whole-model sync and the streamed sync each push
the trainer's weights into a transformers copy. Rank 0 prints one JSON line with what the test asserts."""

import json
import sys

from policyzoo.engine.process import setup_process

setup_process(threads=1)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings  # noqa: E402
from policyzoo.contract import Rollout  # noqa: E402
from policyzoo.engine import dist  # noqa: E402
from policyzoo.engine.models import resolve_model  # noqa: E402
from policyzoo.engine.trainer.deepspeed_trainer import Trainer  # noqa: E402

stage, path = int(sys.argv[1]), sys.argv[2]
dist.init()
info = resolve_model(path)
trainer = Trainer(info, ModelSettings(), TrainSettings(lr=1e-2, weight_decay=0.0, grad_clip=0.0),
                  EngineSettings(zero_stage=stage, critic_lr=1e-2),
                  need_ref=False, need_critic=False)
# one update, so the pushed weights are not the file's: raise the log-prob of a fixed response
resp = torch.tensor([[5, 6, 7, 8]])
r = Rollout(prompt_ids=[[1, 9, 10]], response_ids=resp, response_mask=torch.ones_like(resp, dtype=torch.bool),
            rollout_logprobs=torch.zeros(1, 4), group_ids=torch.tensor([0]), truncated=torch.tensor([False]))
trainer.backward(-trainer.logprobs(r, grad=True)[0].sum())
assert trainer.step()["skipped"] == 0


def available() -> int:
    """Parameters gathered whole on this rank right now (ZeRO 3); all of them at ZeRO 0-2."""
    ps = list(trainer.engine.module.parameters())
    return sum(1 for p in ps if getattr(p, "ds_status", None) is None or p.ds_status.name != "NOT_AVAILABLE")


def push(streamed: bool):
    copy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    params, most, names = dict(copy.named_parameters()), 0, []
    with torch.no_grad(), trainer.full_weights(streamed=streamed) as weights:
        for name, t in weights:
            most = max(most, available())
            params[name].copy_(t)
            names.append(name)
    return copy, most, names


seq = [1, 9, 10, 5, 6, 7, 8, 11]
want = trainer.score_sequence(seq)
out = {"params": len(list(trainer.engine.module.parameters()))}
state = {}
for mode in ("whole", "streamed"):
    copy, most, names = push(mode == "streamed")
    x = torch.tensor([seq])
    lp = copy(x).logits[0, :-1].log_softmax(-1).gather(-1, x[0, 1:, None]).squeeze(-1).detach()
    state[mode] = {k: v.detach().clone() for k, v in copy.state_dict().items()}
    out[mode] = {"most_gathered": most, "names": names, "lp_diff": float((lp - want).abs().max())}
base = load_file(f"{path}/model.safetensors")
out["weights_equal"] = all(torch.equal(state["whole"][k], state["streamed"][k]) for k in state["whole"])
out["moved"] = max(float((state["streamed"][k] - base[k]).abs().max()) for k in base)
out["ranks_agree"] = len({json.dumps(o, sort_keys=True) for o in dist.gather(out["weights_equal"])}) == 1
if dist.rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.close()  # a gloo group left to the exit can abort the process after the work (policyzoo.engine.dist.close)
