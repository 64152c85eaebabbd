"""``policyzoo doctor --gpu``: the engine's GPU checks, run on a user's node, one markdown report.

Each part of the plan (:mod:`.plan`) runs in its own process under its own timeout
(:mod:`.runner`, which also holds the command), its measurements are judged against the stated tolerances
(:mod:`.plan` too), and
one report file (:mod:`.report`) holds versions, devices, every part's pass/fail and the command,
meant to be pasted into an issue. Two plans:

* the full plan (``policyzoo doctor --gpu``, under 10 minutes): the trainer subset below, plus the
  device of every rank and a NCCL all-reduce, ZeRO-3 gathers on all GPUs, a step of the default
  model's shape (vLLM with sleep mode where vLLM is installed), and the same step with TRL where
  TRL is installed;
* the trainer subset (``--trainer-only``, or ``--device cpu``, under 8 minutes): needs only torch,
  transformers, DeepSpeed and policyzoo (what ``make gpu-bundle`` carries): ZeRO 0 (fp32) and
  ZeRO 3 (bf16) steps of a tiny model built in place, the log-prob agreement between the trainer
  and a transformers-generate rollout, and memory.

Nothing is imported here: ``policyzoo.doctor.doctor_args`` (the arguments) stays free of torch.
"""
