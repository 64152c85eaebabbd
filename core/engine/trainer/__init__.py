"""The trainer room: the DeepSpeed trainer (:mod:`.deepspeed_trainer`), its weights and checkpoint
I/O (:mod:`.checkpoint_io`), the DeepSpeed config (:mod:`.dsconfig`), input packing, value head, LR
schedule and compute options (:mod:`.modeling`), log-prob scoring with shared prompts (:mod:`.prefix`) and
LoRA (:mod:`.lora`). Never imports the rollout room; the two meet in
:mod:`policyzoo.engine.lm_policy`."""
