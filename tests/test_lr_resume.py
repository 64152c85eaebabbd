"""The learning-rate schedule across a resume: its horizon is stored in the checkpoint and kept, or
re-planned from the factor it reached (never rebuilt from step 0 on a new horizon, which made the
lr jump: cosine at step 10 of 20 resumed with 40 steps went from 0.5 to 0.854)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from policyzoo.engine.run.resume import checkpoint_state, lr_plan, resume_schedule
from policyzoo.engine.trainer.checkpoint_io import TrainerIO
from policyzoo.engine.trainer.modeling import LRSchedule, lr_schedule
from policyzoo.run_config import load_config

COS20 = {"name": "cosine", "warmup_steps": 0, "total_steps": 20, "from_step": 0, "from_factor": 1.0}


def _config(*extra):
    return load_config(None, "grpo", ["train.lr=1e-5", "train.lr_scheduler_type=cosine", *extra])


def test_a_resume_with_the_same_horizon_keeps_the_schedule():
    plan, lines = resume_schedule({"step": 10, "schedule": {**COS20, "done": 10}}, _config("train.steps=20"))
    assert plan == COS20
    # cosine at step 10 of 20: 0.5 * (1 + cos(pi * 10 / 20)) = 0.5 -> 1e-5 * 0.5
    assert lines == ["learning rate of the next update (optimizer step 11): 5e-06"]


def test_a_longer_run_re_plans_from_the_factor_reached():
    plan, lines = resume_schedule({"step": 10, "schedule": {**COS20, "done": 10}}, _config("train.steps=40"))
    f = LRSchedule(**plan)
    assert math.isclose(f(10), 0.5)  # goes on at 0.5, not 0.5 * (1 + cos(pi * 10 / 40)) = 0.854
    assert math.isclose(f(25), 0.25)  # half-way through the 30 steps left: 0.5 * 0.5 * (1 + cos(pi / 2))
    assert f(39) > 0 and f(40) == 0  # the last step still trains; the horizon is the new one
    assert "re-planned from step 10 (factor 0.5) to end at 40" in lines[0]
    assert lines[-1] == "learning rate of the next update (optimizer step 11): 5e-06"


def test_a_resume_inside_the_warm_up_keeps_the_warm_up():
    old = {**COS20, "warmup_steps": 4, "done": 2}
    plan, lines = resume_schedule({"step": 2, "schedule": old}, _config("train.steps=40"))
    f = LRSchedule(**plan)
    assert math.isclose(f(2), 3 / 5) and f(4) == 1.0  # (2 + 1) / (4 + 1); then decay over 36 steps
    assert math.isclose(f(22), 0.5)  # (22 - 4) / 36 = 0.5 -> 0.5 * (1 + cos(pi / 2))
    assert lines[-1] == "learning rate of the next update (optimizer step 3): 6e-06"


def test_an_old_checkpoint_without_a_schedule_gets_the_new_plan_and_says_so():
    plan, lines = resume_schedule({"step": 3}, _config("train.steps=8", "train.warmup_steps=2"))
    assert plan == lr_plan(_config("train.steps=8", "train.warmup_steps=2"))
    assert plan["total_steps"] == 8 and plan["warmup_steps"] == 2
    assert "records no learning-rate schedule" in lines[0]
    # step 3 after a 2-step warm-up of 8: 0.5 * (1 + cos(pi * 1 / 6)) = 0.9330
    assert lines[1] == "learning rate of the next update (optimizer step 4): 9.33e-06"


def test_the_checkpoint_records_the_schedule_and_the_trainer_restores_the_plan():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-5)
    sched = lr_schedule("cosine", 0, 20)(opt)
    for _ in range(10):
        opt.step()
        sched.step()
    trainer = SimpleNamespace(engine=SimpleNamespace(lr_scheduler=sched, optimizer=opt), critic=None)
    saved = TrainerIO.schedule_state(trainer)
    assert saved == {**COS20, "done": 10}
    state = checkpoint_state(10, 20, 10, {}, _config(), 1, saved)
    assert state["schedule"] == saved
    # a new trainer's scheduler (40 steps), restored from the checkpoint's state dict, then the plan
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-5)
    sched2 = lr_schedule("cosine", 0, 40)(opt2)
    sched2.load_state_dict(sched.state_dict())  # what DeepSpeed's load does: the old horizon is back
    assert vars(sched2.lr_lambdas[0])["total_steps"] == 20
    plan, _ = resume_schedule(state, _config("train.steps=40"))
    t2 = SimpleNamespace(engine=SimpleNamespace(lr_scheduler=sched2, optimizer=opt2), critic=None)
    TrainerIO.set_schedule(t2, plan)
    TrainerIO.set_optimizer(t2, lr=1e-5, weight_decay=0.0, critic_lr=1e-4)
    assert math.isclose(opt2.param_groups[0]["lr"], 5e-6)  # the next update: 1e-5 x 0.5
    opt2.step()
    sched2.step()
    assert math.isclose(opt2.param_groups[0]["lr"], 1e-5 * 0.5 * 0.5 * (1 + math.cos(math.pi / 30)))
