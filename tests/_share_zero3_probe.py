"""Run by tests/test_device_step.py under torchrun (2 CPU ranks): shared-prompt scoring at ZeRO 3 where the
ranks form different numbers of length groups (rank 0: one long response and seven short ones, 2 groups;
rank 1: eight equal ones, 1 group), with and without grad, then one update. Without the agreed call count
rank 1 would wait forever in a ZeRO-3 gather. Then a no-grad pass in chunks with the model gathered once,
against the per-layer gathers, and the start-up check agreed over the ranks. Rank 0 prints one JSON line
with what the test asserts."""

import json
import sys

from policyzoo.engine.process import setup_process

setup_process(threads=1)

import torch  # noqa: E402
from deepspeed.runtime.zero.partition_parameters import GatheredParameters  # noqa: E402
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator  # noqa: E402

from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings  # noqa: E402
from policyzoo.contract import Rollout  # noqa: E402
from policyzoo.engine import dist  # noqa: E402
from policyzoo.engine.models import resolve_model  # noqa: E402
from policyzoo.engine.trainer.deepspeed_trainer import Trainer  # noqa: E402
from policyzoo.engine.trainer.prefix import model_calls  # noqa: E402

dist.init()
info = resolve_model(sys.argv[1])
# persistence threshold 0: every parameter of the tiny model is partitioned (by default, parameters under 1e5
# elements -- all of the tiny model's -- stay whole and no forward would gather anything)
trainer = Trainer(info, ModelSettings(), TrainSettings(lr=1e-3, weight_decay=0.0, grad_clip=0.0),
                  EngineSettings(zero_stage=3, critic_lr=1e-3,
                                 deepspeed={"zero_optimization": {"stage3_param_persistence_threshold": 0}}),
                  need_ref=False, need_critic=False)
out0 = {"partitioned": all(p.ds_status.name == "NOT_AVAILABLE" for p in trainer.engine.module.parameters())}
t = 200
lengths = [t] + [2] * 7 if dist.rank() == 0 else [3] * 8
ids = torch.randint(3, 200, (8, t), generator=torch.Generator().manual_seed(dist.rank()))
mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
r = Rollout(prompt_ids=[[1, 9, 10, 11]] * 4 + [[1, 12, 13]] * 4, response_ids=torch.where(mask, ids, 0),
            response_mask=mask, rollout_logprobs=torch.zeros(8, t), group_ids=torch.tensor([0] * 4 + [1] * 4),
            truncated=torch.zeros(8, dtype=torch.bool))
check_ids = list(range(3, 40))
why = trainer.check_share_prompt(check_ids)  # both ranks pass (or both remembered a pass): on
out = {**out0, "check": dist.gather([why, trainer.share_prompt]), "share_prompt": trainer.share_prompt,
       "calls": dist.gather(model_calls(r))}
with torch.no_grad():
    shared = trainer._logprobs(trainer.engine, r, False, True)[0]
    per_row = trainer._logprobs(trainer.engine, r, False, False)[0]
out["no_grad_diff"] = max(dist.gather(float((shared - per_row).abs().max())))
lp = trainer.logprobs(r, grad=True)[0]
out["grad_diff"] = max(dist.gather(float((lp.detach() - per_row).abs().max())))
trainer.backward(-lp.sum() / 8)
out["skipped"] = trainer.step()["skipped"]
# a no-grad pass in 4 chunks of 2 rows: the model gathered once for the pass, or layer by layer in each forward
trainer.score_rows = 2
gathers = []  # per-module fetches (each gathers that module's parameters with all ranks) and whole-model gathers
Coordinator = PartitionedParameterCoordinator
real_fetch, real_enter = Coordinator.fetch_sub_module, GatheredParameters.__enter__


def fetch(self, *args, **kw):
    gathers.append("module")
    return real_fetch(self, *args, **kw)


def enter(self):
    gathers.append("whole")
    return real_enter(self)


Coordinator.fetch_sub_module, GatheredParameters.__enter__ = fetch, enter
with torch.no_grad():
    once = trainer.logprobs(r, grad=False)[0]
    n_once = {k: gathers.count(k) for k in ("whole", "module")}
    trainer._gather_once = lambda model: False
    gathers.clear()
    layered = trainer.logprobs(r, grad=False)[0]
    n_layered = {k: gathers.count(k) for k in ("whole", "module")}
Coordinator.fetch_sub_module, GatheredParameters.__enter__ = real_fetch, real_enter
del trainer._gather_once
out["pass_gathers"] = {"once": n_once, "per_layer": n_layered}
out["pass_equal"] = all(dist.gather(bool(torch.equal(once, layered))))
lp = trainer.logprobs(r, grad=True)[0]  # training still works after the hooks came back
trainer.backward(-lp.sum() / 8)
out["skipped_after"] = trainer.step()["skipped"]
# the check failing on rank 1 alone (a negative tolerance) turns sharing off on both ranks
why = trainer.check_share_prompt(check_ids, tolerance=-1.0 if dist.rank() == 1 else None)
out["one_rank_fails"] = dist.gather([why is not None, trainer.share_prompt])
if dist.rank() == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.close()
