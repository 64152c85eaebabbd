"""The weight sync: after every optimizer step the trainer's weights go into the rollout engine, in one
direction (trainer -> rollout; nothing here is called back by the rollout engine).

One sync, in the order it runs (:meth:`WeightSync.sync <policyzoo.engine.sync.push.WeightSync.sync>`):

1. **gather** (:mod:`.gather`): the trainer's full weights as ``(hf_name, tensor)`` pairs, one parameter
   at a time under ZeRO-3, merged one layer at a time under LoRA;
2. **wake** (:mod:`.sleep`): with ``engine.vllm_sleep`` vLLM's weights are mapped again before they are
   written (and its KV cache before it samples);
3. **push** (:mod:`.push`): the rollout engine's ``load_weights`` consumes the pairs (vLLM's
   ``reload_weights`` in ``rollout/vllm_engine.py``, then the CPU kernels a reload leaves stale,
   :mod:`.cpu_kernels`, and its prefix cache reset; a rollout server through ``rollout/server/weight_push.py``;
   transformers' ``copy_`` in ``rollout/hf.py``), under ``engine.sync_timeout_s``;
4. **check** (:mod:`.check`, ``engine.sync_check``): a fixed sequence scored by both sides, within the
   tolerance of the trainer's and the sampler's dtypes, or :class:`~policyzoo.engine.sync.check.SyncError`.
"""
