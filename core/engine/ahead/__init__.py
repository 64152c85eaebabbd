"""Sampling ahead of the step that trains on the batch: the one-step overlap (``engine.overlap``,
:mod:`.overlap`) and the asynchronous sampler with a staleness bound (``engine.max_staleness``,
:mod:`.async_sampler`). Each wraps the rollout policy (the methods it does not change pass through
:class:`.passthrough.PassThrough`, one ``def`` each) and gives the step an
:class:`~policyzoo.step.learn.Ahead`; the step itself is always :func:`policyzoo.step.train_step`."""
