"""The rollout room: the engines that sample (:mod:`.engines`: vLLM in the training process, the
transformers fallback), sampling one step ahead (:mod:`.overlap`) and held-out evaluation
(:mod:`.evaluate`). Never imports the trainer room; the two meet in :mod:`policyzoo.engine.lm_policy`."""
