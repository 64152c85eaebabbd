"""The trainer's weights and checkpoints: the finiteness check,
DeepSpeed checkpoints (read without unpickling), the optimizer settings applied after a resume and
the ``save_pretrained`` export. A mixin of :class:`policyzoo.engine.trainer.deepspeed_trainer.Trainer`, which owns
``engine``, ``critic``, ``stage``, ``lora`` and ``info``. The full weights (``full_weights``) are the
weight sync's gather, :func:`policyzoo.engine.sync.full_weights`."""

from __future__ import annotations

import torch

from policyzoo.engine.dist import any_rank, rank
from policyzoo.engine.rundir import weights_only_load
from policyzoo.engine.sync import full_weights

from . import lora as lora_mod
from .dsconfig import BETAS


class TrainerIO:
    #: the policy's full weights (``(hf_name, tensor)`` pairs), the weight sync's gather
    full_weights = full_weights

    def weights_finite(self) -> bool:
        """True when every policy (and critic) weight is finite (gathered under ZeRO-3; the
        answer is agreed over data-parallel ranks)."""
        with self.full_weights() as weights:
            # a list, not a short-circuit: at ZeRO 3 every rank must take part in every gather
            bad = not all([bool(torch.isfinite(t).all()) for _, t in weights])
        if self.critic is not None:
            bad = bad or any(not bool(torch.isfinite(p.data).all()) for p in self.critic.module.parameters()
                             if p.data.numel())
        return not any_rank(bad)

    def save(self, folder: str, client_state: dict) -> None:
        self.engine.save_checkpoint(folder, tag="policy", client_state=client_state, save_latest=False)
        if self.critic is not None:
            self.critic.save_checkpoint(folder, tag="critic", save_latest=False)

    def load(self, folder: str) -> dict:
        """Restore a checkpoint written by :meth:`save`. Every file is read with
        ``torch.load(weights_only=True)`` (DeepSpeed's own loader unpickles anything): a file that
        holds other objects than tensors, containers and DeepSpeed's three state classes raises
        :class:`~policyzoo.engine.rundir.ResumeError` and nothing in it is executed."""
        for e in (self.engine, self.critic):
            if e is not None:
                e.checkpoint_engine.load = weights_only_load
        _, client = self.engine.load_checkpoint(folder, tag="policy", load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
        if self.critic is not None:
            self.critic.load_checkpoint(folder, tag="critic", load_optimizer_states=True)
        return client or {}

    def schedule_state(self) -> dict:
        """The policy's learning-rate schedule (:class:`~.modeling.LRSchedule` fields) and ``done``,
        the optimizer steps it has counted (skipped steps are not counted), for ``state.json``."""
        sched = getattr(self.engine, "lr_scheduler", None)
        if sched is None or not hasattr(sched, "lr_lambdas"):
            return {}
        return {**vars(sched.lr_lambdas[0]), "done": int(sched.last_epoch)}

    def set_schedule(self, plan: dict) -> None:
        """Replace the schedule's fields restored by :meth:`load` (the checkpoint's) with ``plan``
        (kept or re-planned before load by ``policyzoo.engine.run.resume.resume_schedule``); call
        :meth:`set_optimizer` after it, which applies the factor at the restored step."""
        fields = {k: v for k, v in plan.items() if k != "done"}
        for eng in (self.engine, self.critic):
            sched = getattr(eng, "lr_scheduler", None) if eng is not None else None
            for fn in getattr(sched, "lr_lambdas", ()):
                vars(fn).update(fields)

    def set_optimizer(self, lr: float, weight_decay: float, critic_lr: float,
                      betas: tuple[float, float] = BETAS, eps: float = 1e-8) -> None:
        """Set every parameter group's ``lr``, ``weight_decay``, ``betas`` and ``eps`` to the
        configured values. Called after :meth:`load`: DeepSpeed restores the optimizer's parameter
        groups as saved, so without this a resume with another ``train.lr`` would go on at the
        checkpoint's rate. The learning-rate schedule's base rate becomes ``lr`` too, and the group's
        rate ``lr`` x the schedule's factor at the restored step. The Adam moments and step counts
        are kept."""
        for eng, rate in ((self.engine, lr), (self.critic, critic_lr)):
            if eng is None:
                continue
            sched = getattr(eng, "lr_scheduler", None)
            groups = eng.optimizer.param_groups
            if sched is not None and hasattr(sched, "lr_lambdas"):
                sched.base_lrs = [rate] * len(groups)
            for i, group in enumerate(groups):
                factor = sched.lr_lambdas[i](sched.last_epoch) if hasattr(sched, "lr_lambdas") else 1.0
                group.update(lr=rate * factor, initial_lr=rate, weight_decay=weight_decay, betas=betas, eps=eps)

    def export(self, folder: str) -> None:
        """``save_pretrained`` (safetensors) of the trained policy and its tokenizer; with LoRA the
        merged model, and the adapter in ``folder/adapter`` (``policyzoo.engine.trainer.lora``).

        Rank 0 alone copies the weights to the host and writes them: at ZeRO 0-2 the other ranks do
        nothing; at ZeRO 3 every rank takes part in each one-parameter gather (streamed, whatever
        ``policyzoo.engine.sync.STREAMED`` says) and drops the parameter again, so one host copy of the model is
        made per run, not one per rank (at 7B in fp32, 28 GB instead of 28 GB x ranks)."""
        mine = rank() == 0
        if self.lora:
            if mine:
                lora_mod.export(self.engine.module, folder, self.info.tokenizer)
            return
        if not mine and self.stage != 3:
            return
        state = {}
        with self.full_weights(streamed=True) as weights:
            for n, t in weights:  # at ZeRO 3 a gather with every rank: each rank walks the whole model
                if mine:
                    state[n] = t.detach().cpu().clone()
        if not mine:
            return
        self.engine.module.save_pretrained(folder, state_dict=state, safe_serialization=True)
        self.info.tokenizer.save_pretrained(folder)
