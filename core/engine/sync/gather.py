"""The trainer's side of the sync: its full weights, gathered (:func:`full_weights`).

:class:`~policyzoo.engine.trainer.deepspeed_trainer.Trainer` takes it as its ``full_weights`` method
(``trainer.full_weights()``); its finiteness check and its ``save_pretrained`` export read the weights
through it too."""

from __future__ import annotations

import contextlib

from policyzoo.engine.trainer import lora as lora_mod

#: stream the sync: gather and yield one parameter at a time (False: gather the whole model first)
STREAMED = True


def _gathered_one_at_a_time(params):
    import deepspeed

    for name, p in params:
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            yield name, p.data


@contextlib.contextmanager
def full_weights(trainer, streamed: bool | None = None):
    """An iterable of ``(hf_name, tensor)``: the policy's full weights of ``trainer`` (its DeepSpeed
    ``engine``, ZeRO ``stage`` and ``lora``), in ``named_parameters`` order on every rank (the order
    the ZeRO-3 gathers must agree on); tensors keep the trainer's dtype and device.

    * ZeRO 0-2: every weight is whole on every rank; nothing is gathered or copied.
    * ZeRO 3, ``streamed`` (default :data:`STREAMED`): a generator that gathers one parameter
      (``GatheredParameters([p])``), yields it and releases it when the consumer asks for the next,
      so a rank holds one gathered parameter beyond its shard (plus what the consumer keeps: vLLM's
      layer-wise loader keeps the tensors of one layer until the layer is complete; a released
      parameter's tensor stays valid while referenced, DeepSpeed only rebinds ``param.data``).
      TRL and OpenRLHF gather one parameter at a time too. Every rank must consume it to the end.
    * ZeRO 3, not streamed: the whole model gathered at once (a full copy per rank), as a list.
    * LoRA (ZeRO 0-2): the merged weights, computed one layer at a time as they are consumed
      (:func:`policyzoo.engine.trainer.lora.merged_weights`).
    """
    import deepspeed

    if trainer.lora:  # ZeRO 0-2 only: every weight is held whole on every rank
        yield lora_mod.merged_weights(trainer.engine.module)
        return
    params = list(trainer.engine.module.named_parameters())
    if trainer.stage != 3:
        yield ((n, p.data) for n, p in params)
        return
    if STREAMED if streamed is None else streamed:
        yield _gathered_one_at_a_time(params)
        return
    with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
        yield [(n, p.data) for n, p in params]
