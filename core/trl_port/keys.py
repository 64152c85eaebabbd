"""Every key of TRL 1.16's ``GRPOConfig`` (with transformers 5.19's ``TrainingArguments``), classified.

``DEFAULTS``: TRL's default of every key (the dataclass defaults; ``bf16`` None means True unless
``fp16``, ``steps_per_generation`` None means ``gradient_accumulation_steps``, as TRL's
``__post_init__`` sets them). Each key is in exactly one of ``MAPPED`` (``{key: the policyzoo
keys it sets}``, done in :mod:`policyzoo.trl_port.port`), ``IGNORED`` (``{key: why it has no effect
on training here}``) or ``REFUSED`` (``{key: why}``: refused when it differs from TRL's default).
``tests/test_trl_port.py`` checks the three tables partition the installed GRPOConfig's fields and
that ``DEFAULTS`` equals its defaults.
"""

from __future__ import annotations

TRL_VERSION = "1.16.0"

DEFAULTS: dict = {
    "output_dir": None, "per_device_train_batch_size": 8, "num_train_epochs": 3.0, "max_steps": -1,
    "learning_rate": 1e-06, "lr_scheduler_type": 'linear', "lr_scheduler_kwargs": None, "warmup_steps": 0,
    "optim": 'adamw_torch_fused', "optim_args": None, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
    "adam_epsilon": 1e-08, "optim_target_modules": None, "gradient_accumulation_steps": 1,
    "average_tokens_across_devices": True, "max_grad_norm": 1.0, "label_smoothing_factor": 0.0, "bf16": None,
    "fp16": False, "bf16_full_eval": False, "fp16_full_eval": False, "tf32": None, "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": None, "torch_compile": False, "torch_compile_backend": None,
    "torch_compile_mode": None, "use_liger_kernel": False, "liger_kernel_config": None, "use_cache": False,
    "neftune_noise_alpha": None, "torch_empty_cache_steps": None, "auto_find_batch_size": False,
    "logging_strategy": 'steps', "logging_steps": 10, "logging_first_step": False, "log_on_each_node": True,
    "logging_nan_inf_filter": True, "include_num_input_tokens_seen": 'no', "log_level": 'passive',
    "log_level_replica": 'warning', "disable_tqdm": None, "report_to": 'none', "run_name": None,
    "project": 'huggingface', "trackio_space_id": None, "trackio_bucket_id": None, "trackio_static_space_id": None,
    "eval_strategy": 'no', "eval_steps": None, "eval_delay": 0, "per_device_eval_batch_size": 8,
    "prediction_loss_only": False, "eval_on_start": False, "eval_do_concat_batches": True,
    "eval_use_gather_object": False, "eval_accumulation_steps": None, "include_for_metrics": [],
    "batch_eval_metrics": False, "save_only_model": False, "save_strategy": 'steps', "save_steps": 500,
    "save_on_each_node": False, "save_total_limit": None, "enable_jit_checkpoint": False, "push_to_hub": False,
    "hub_token": None, "hub_private_repo": None, "hub_model_id": None, "hub_strategy": 'every_save',
    "hub_always_push": False, "hub_revision": None, "load_best_model_at_end": False, "metric_for_best_model": None,
    "greater_is_better": None, "ignore_data_skip": False, "restore_callback_states_from_checkpoint": False,
    "full_determinism": False, "seed": 42, "data_seed": None, "use_cpu": False, "accelerator_config": None,
    "parallelism_config": None, "dataloader_drop_last": False, "dataloader_num_workers": 0,
    "dataloader_pin_memory": True, "dataloader_persistent_workers": False, "dataloader_prefetch_factor": None,
    "dataloader_multiprocessing_context": None, "dataloader_in_order": True, "remove_unused_columns": False,
    "label_names": None, "train_sampling_strategy": 'random', "length_column_name": 'length',
    "ddp_find_unused_parameters": None, "ddp_bucket_cap_mb": None, "ddp_broadcast_buffers": None,
    "ddp_static_graph": None, "ddp_backend": None, "ddp_timeout": 1800, "fsdp": None, "fsdp_config": None,
    "deepspeed": None, "debug": '', "skip_memory_metrics": True, "do_train": False, "do_eval": False,
    "do_predict": False, "resume_from_checkpoint": None, "local_rank": -1, "model_init_kwargs": None,
    "trust_remote_code": False, "router_aux_loss_coef": None, "disable_dropout": False,
    "cast_lm_head_to_fp32": False, "num_generations": 8, "num_generations_eval": None, "max_completion_length": 512,
    "ds3_gather_for_generation": True, "shuffle_dataset": True, "pad_to_multiple_of": 'auto',
    "generation_batch_size": None, "steps_per_generation": None, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
    "min_p": None, "generation_kwargs": None, "chat_template_kwargs": None, "repetition_penalty": 1.0,
    "cache_implementation": None, "use_vllm": False, "vllm_mode": 'colocate', "vllm_model_impl": 'vllm',
    "vllm_enable_sleep_mode": False, "vllm_structured_outputs_regex": None, "vllm_server_base_url": None,
    "vllm_server_host": '0.0.0.0', "vllm_server_port": 8000, "vllm_server_timeout": 240.0, "vllm_group_port": 51216,
    "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": None, "vllm_tensor_parallel_size": 1, "beta": 0.0,
    "num_iterations": 1, "epsilon": 0.2, "delta": None, "epsilon_high": None, "sapo_temperature_neg": 1.05,
    "sapo_temperature_pos": 1.0, "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0, "importance_sampling_level": 'token', "reward_weights": None,
    "multi_objective_aggregation": 'sum_then_normalize', "scale_rewards": 'group', "loss_type": 'dapo',
    "mask_truncated_completions": False, "sync_ref_model": False, "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512, "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
    "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005, "entropy_target": 0.2,
    "max_tool_calling_iterations": None, "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": 'sequence_mask', "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None, "off_policy_mask_threshold": None, "use_bias_correction_kl": True,
    "log_completions": False, "log_multimodal": True, "num_completions_to_print": None, "log_unique_prompts": False,
    "log_completions_hub_repo": None, "use_transformers_continuous_batching": False,
    "transformers_continuous_batching_config": None, "use_transformers_paged": False,
    "vllm_importance_sampling_cap": None,
}

MAPPED: dict[str, str] = {
    "output_dir": "output_dir",
    "per_device_train_batch_size": "train.prompts_per_step (x gradient_accumulation_steps x WORLD_SIZE / "
                                   "num_generations: TRL counts completions, we count prompts)",
    "gradient_accumulation_steps": "train.micro_batches, train.prompts_per_step",
    "generation_batch_size": "checked: equal to per_device_train_batch_size x WORLD_SIZE x gradient_accumulation_steps",
    "steps_per_generation": "checked: equal to gradient_accumulation_steps (one optimizer step per sampled batch)",
    "num_generations": "algorithm.sample.n",
    "num_generations_eval": "eval.n (eval.temperature = temperature; with eval_strategy steps)",
    "max_steps": "train.steps (/ num_iterations)",
    "num_train_epochs": "refused when set: we count optimizer steps (set max_steps)",
    "learning_rate": "train.lr",
    "lr_scheduler_type": "train.lr_scheduler_type (constant_with_warmup = constant after warm-up)",
    "warmup_steps": "train.warmup_steps (an integer), train.warmup_ratio (a float < 1)",
    "optim": "AdamW (adamw_torch, adamw_torch_fused, adamw_hf); others refused",
    "weight_decay": "train.weight_decay",
    "adam_beta1": "train.adam_beta1",
    "adam_beta2": "train.adam_beta2",
    "adam_epsilon": "train.adam_epsilon",
    "max_grad_norm": "train.grad_clip",
    "bf16": "train.autocast (bf16 compute over fp32 weights, as TRL's mixed precision)",
    "gradient_checkpointing": "train.gradient_checkpointing",
    "tf32": "train.tf32 (TF32 matmuls on CUDA; null: the GPU profile's true on a GPU)",
    "seed": "train.seed",
    "data_seed": "data.seed",
    "report_to": "train.report_to (tensorboard, wandb; none = [])",
    "logging_steps": "train.log_completions_every (with log_completions; metrics are logged every step)",
    "log_completions": "train.log_completions_every (logging_steps, or 0)",
    "eval_strategy": "data.eval_size (no, TRL's default: 0, no held-out evaluation), train.eval_every (steps: "
                     "eval_steps)",
    "eval_steps": "train.eval_every",
    "save_strategy": "train.save_every (no: 0 = only at the end; steps: save_steps)",
    "save_steps": "train.save_every",
    "save_total_limit": "engine.keep_checkpoints",
    "deepspeed": "engine.deepspeed",
    "trust_remote_code": "model.trust_remote_code",
    "max_completion_length": "algorithm.sample.max_tokens (and dr_grpo's reduce constant)",
    "temperature": "algorithm.sample.temperature",
    "top_p": "algorithm.sample.top_p",
    "top_k": "algorithm.sample.top_k",
    "min_p": "algorithm.sample.min_p (None = 0.0)",
    "repetition_penalty": "algorithm.sample.repetition_penalty",
    "use_vllm": "engine.rollout (true: vllm, false: transformers generate, as TRL)",
    "vllm_enable_sleep_mode": "engine.vllm_sleep (true: 2, TRL's level)",
    "vllm_gpu_memory_utilization": "engine.gpu_memory_utilization",
    "beta": "algorithm.kl (0: none; else k3 with beta)",
    "use_bias_correction_kl": "algorithm.kl.times_ratio",
    "num_iterations": "train.updates_per_batch",
    "epsilon": "algorithm.clip.eps_low",
    "epsilon_high": "algorithm.clip.eps_high (None = epsilon; cispo's cap)",
    "delta": "algorithm.clip.dual_clip",
    "sapo_temperature_neg": "algorithm.clip.tau_neg (loss_type sapo)",
    "sapo_temperature_pos": "algorithm.clip.tau_pos (loss_type sapo)",
    "vespo_k_pos": "algorithm.clip.k_pos (loss_type vespo)",
    "vespo_lambda_pos": "algorithm.clip.lambda_pos (loss_type vespo)",
    "vespo_k_neg": "algorithm.clip.k_neg (loss_type vespo)",
    "vespo_lambda_neg": "algorithm.clip.lambda_neg (loss_type vespo)",
    "importance_sampling_level": "algorithm.ratio (token / sequence)",
    "multi_objective_aggregation": "algorithm.baseline (sum_then_normalize: by scale_rewards; "
                                   "normalize_then_sum: gdpo)",
    "scale_rewards": "algorithm.baseline (group: group_norm; batch: group_norm scale batch; none: group_mean)",
    "loss_type": "algorithm.clip, algorithm.reduce (and ratio for luspo)",
    "entropy_coef": "algorithm.term (entropy coef)",
    "use_adaptive_entropy": "algorithm.term (entropy_adaptive)",
    "entropy_coef_min": "algorithm.term (entropy_adaptive coef_min)",
    "entropy_coef_max": "algorithm.term (entropy_adaptive coef_max)",
    "entropy_coef_delta": "algorithm.term (entropy_adaptive delta)",
    "entropy_target": "algorithm.term (entropy_adaptive target)",
    "vllm_importance_sampling_correction": "algorithm.ratio (tis / mis, with use_vllm)",
    "vllm_importance_sampling_mode": "algorithm.ratio (*_truncate: tis, *_mask: mis; token / sequence level)",
    "vllm_importance_sampling_clip_max": "algorithm.ratio cap / high",
    "vllm_importance_sampling_clip_min": "algorithm.ratio floor / low",
    "vllm_importance_sampling_cap": "algorithm.ratio cap / high (TRL's deprecated name of clip_max)",
    "off_policy_mask_threshold": "algorithm.ratio (opsm threshold)",
}

_PERF = "changes speed or memory, not the numbers policyzoo trains on"
_LOG = "display and logging only (policyzoo logs every step's metrics)"
_HUB = "the Hub: policyzoo writes the run directory and final/ locally"
_DIST = "distributed plumbing: policyzoo runs one process per rank through torchrun or DeepSpeed's launcher"
_SERVER = "vLLM server mode only: policyzoo always runs vLLM inside the training process (colocate)"

IGNORED: dict[str, str] = {
    **dict.fromkeys(("average_tokens_across_devices",), "policyzoo normalises by the whole step's tokens on "
                    "every rank already (the dapo loss is the same)"),
    **dict.fromkeys(("torch_compile", "torch_compile_backend", "torch_compile_mode", "use_liger_kernel",
                     "liger_kernel_config", "use_cache", "torch_empty_cache_steps", "gradient_checkpointing_kwargs",
                     "ds3_gather_for_generation", "pad_to_multiple_of", "cache_implementation",
                     "use_transformers_continuous_batching", "transformers_continuous_batching_config",
                     "use_transformers_paged", "vllm_max_model_length",
                     "eval_accumulation_steps", "eval_do_concat_batches", "eval_use_gather_object",
                     "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory",
                     "dataloader_persistent_workers", "dataloader_prefetch_factor",
                     "dataloader_multiprocessing_context", "dataloader_in_order", "skip_memory_metrics"), _PERF),
    **dict.fromkeys(("logging_strategy", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter",
                     "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm", "run_name",
                     "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
                     "log_multimodal", "num_completions_to_print", "log_unique_prompts", "debug",
                     "prediction_loss_only", "include_for_metrics", "batch_eval_metrics", "eval_delay",
                     "save_only_model", "save_on_each_node", "enable_jit_checkpoint"), _LOG),
    **dict.fromkeys(("hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push",
                     "hub_revision"), _HUB),
    **dict.fromkeys(("use_cpu", "local_rank", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
                     "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend", "ddp_timeout",
                     "accelerator_config", "do_train", "do_eval", "do_predict"), _DIST),
    **dict.fromkeys(("vllm_mode", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
                     "vllm_server_timeout", "vllm_group_port"), _SERVER),
    "per_device_eval_batch_size": "policyzoo's evaluation hands every held-out prompt to the rollout engine in one "
                                  "call (vLLM batches them itself): speed and memory only",
    "remove_unused_columns": "policyzoo hands every data column to the reward functions (TRL's GRPO default)",
    "disable_dropout": "policyzoo's trainer always runs the model without dropout (it must score what was sampled)",
    "ref_model_mixup_alpha": "used only with sync_ref_model, which is refused",
    "ref_model_sync_steps": "used only with sync_ref_model, which is refused",
    "label_names": "no labels in RL training",
    "length_column_name": "used only by group_by_length sampling, which GRPO does not use",
    "train_sampling_strategy": "GRPO samples prompts by its own repeat sampler; policyzoo by its seeded stream",
}

REFUSED: dict[str, str] = {
    "lr_scheduler_kwargs": "policyzoo's schedules (constant, linear, cosine) take no extra arguments",
    "optim_args": "policyzoo's AdamW takes only the adam_* keys",
    "optim_target_modules": "no optimizer restricted to some modules (GaLore, APOLLO) in policyzoo",
    "label_smoothing_factor": "no labels in RL training",
    "fp16": "policyzoo trains in float32 or bfloat16 (bf16: true), not float16",
    "bf16_full_eval": "policyzoo evaluates with the rollout engine's dtype (engine.rollout_dtype)",
    "fp16_full_eval": "policyzoo evaluates with the rollout engine's dtype (engine.rollout_dtype)",
    "neftune_noise_alpha": "no noise on embeddings in policyzoo's trainer",
    "auto_find_batch_size": "TRL refuses it for GRPO too (the batch must hold whole groups)",
    "eval_on_start": "policyzoo evaluates before the first step always",
    "push_to_hub": _HUB + "; push final/ yourself",
    "load_best_model_at_end": "policyzoo keeps the last checkpoint and exports final/ from the last step",
    "metric_for_best_model": "used only with load_best_model_at_end, which is refused",
    "greater_is_better": "used only with load_best_model_at_end, which is refused",
    "ignore_data_skip": "a resumed run continues the prompt stream where it stopped (resumable, seeded)",
    "restore_callback_states_from_checkpoint": "policyzoo has no trainer callbacks",
    "full_determinism": "policyzoo seeds its sampling streams (train.seed) but sets no deterministic kernels",
    "parallelism_config": "no context or sequence parallelism in policyzoo (TRL's GRPO refuses it too)",
    "fsdp": "policyzoo shards with DeepSpeed ZeRO (engine.zero_stage, or deepspeed: a config)",
    "fsdp_config": "policyzoo shards with DeepSpeed ZeRO (engine.zero_stage, or deepspeed: a config)",
    "resume_from_checkpoint": "continue a policyzoo run with `policyzoo train --resume RUN_DIR`",
    "model_init_kwargs": "policyzoo loads the model folder itself (model.path, model.dtype, model.trust_remote_code)",
    "router_aux_loss_coef": "no mixture-of-experts auxiliary loss term in policyzoo",
    "cast_lm_head_to_fp32": "policyzoo computes the LM head in the model's dtype (float32 by default)",
    "shuffle_dataset": "policyzoo always draws prompts in a seeded shuffled order",
    "generation_kwargs": "policyzoo's sampler takes the named sampling keys only (temperature, top_p, top_k, "
                         "min_p, repetition_penalty, max_completion_length)",
    "chat_template_kwargs": "policyzoo applies the tokenizer's chat template without extra arguments",
    "vllm_model_impl": "policyzoo runs vLLM's own model implementation",
    "vllm_structured_outputs_regex": "no guided decoding in policyzoo's sampler",
    "vllm_tensor_parallel_size": "policyzoo runs one vLLM per rank without tensor parallelism",
    "reward_weights": "policyzoo sets each reward's weight on its entry: rewards=[{use: function, function: "
                      "'pkg.mod:fn', weight: w}]",
    "mask_truncated_completions": "TRL keeps a truncated completion's reward in its group's mean and std and "
                                  "masks its tokens; policyzoo's drop_truncated filter removes the row before the "
                                  "advantages, so the numbers differ (use algorithm.filter: [drop_truncated] for "
                                  "DAPO's overlong filtering)",
    "sync_ref_model": "policyzoo's reference is the initial policy, never synchronised (TR-DPO's mix-up)",
    "top_entropy_quantile": "no entropy-quantile token mask in policyzoo",
    "max_tool_calling_iterations": "tool calling runs through a policyzoo environment (algorithm.env, "
                                   "docs/agents.md)",
    "log_completions_hub_repo": _HUB,
}

#: keys of older TRL / transformers versions that GRPO configs still carry: ``{key: policyzoo key}``
#: (mapped) or ``{key: None}`` with the reason in ``LEGACY_REFUSED``
LEGACY: dict[str, str] = {
    "warmup_ratio": "train.warmup_ratio (transformers < 5; now warmup_steps < 1)",
}
LEGACY_REFUSED: dict[str, str] = {
    "max_prompt_length": "TRL < 1.0 truncated prompts to it from the left; policyzoo never truncates a prompt "
                         "(data.on_long_prompt drops or refuses a prompt that does not fit the context)",
}
