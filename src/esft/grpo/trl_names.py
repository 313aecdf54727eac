"""Names of TRL's GRPOConfig options as esft treats them: those it sets itself, those it sets from one of its own
options, and those a TRL user may expect that do not apply here, each with the hint an error gives.
"""

GENERATION_BATCH = ("esft sets it to prompts_per_step * num_generations, the completions of one step, through "
                    "TRL's steps_per_generation: set prompts_per_step and num_generations; per_device_train_batch_size "
                    "is how many of them one forward pass takes")

#: TRL options esft sets from one of its own, and how (an unknown key's hint, GRPOConfig.unknown_option_hint)
TRL_EQUIVALENTS = {"bf16": "esft sets it from precision", "fp16": "esft sets it from precision",
                   "use_cpu": "esft sets it from device",
                   "gradient_accumulation_steps": "esft sets it from prompts_per_step and per_device_train_batch_size",
                   "steps_per_generation": "esft sets it from prompts_per_step and per_device_train_batch_size",
                   "logging_steps": "esft logs every step", "save_strategy": "esft sets it from save_steps",
                   "generation_batch_size": GENERATION_BATCH}

#: option names a TRL user may expect that TRL's GRPOConfig does not have here (the unknown key's hint)
NOT_TRL_OPTIONS = {"warmup_ratio": "transformers 5 has no warmup_ratio; use esft's warmup_steps, the warmup's length "
                                   "in optimizer steps; for a ratio r of max_steps, warmup_steps = r * max_steps"}

#: TRL options that trl_args may not set although esft does not pass them itself, and why
REFUSED_TRL_ARGS = {
    "generation_batch_size": GENERATION_BATCH,
    # esft moves TRL's checkpoints into checkpoints/, out of the folder TRL's own rotation looks at
    "save_total_limit": "TRL's rotation never sees the checkpoints esft keeps; use esft's own save_total_limit "
                        "option (a run that recorded it in its config.yaml's trl_args, where it did nothing, "
                        "resumes once that line is deleted)",
    "logging_strategy": "esft logs every step: its train records, held-out evaluations and trackers follow TRL's "
                        "log of each step",
}

#: the TRL GRPOConfig options esft sets itself (trl_arguments); trl_args may not override them
ESFT_TRL_ARGS = (
    "output_dir", "seed", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "num_generations", "learning_rate", "optim", "weight_decay", "max_grad_norm",
    "lr_scheduler_type", "warmup_steps", "epsilon", "beta", "loss_type", "scale_rewards", "num_iterations",
    "mask_truncated_completions", "temperature", "top_p", "max_completion_length", "bf16", "fp16", "use_cpu",
    "gradient_checkpointing", "activation_checkpointing", "disable_dropout", "logging_steps", "save_strategy",
    "save_steps", "report_to", "disable_tqdm", "remove_unused_columns", "dataloader_num_workers",
    "dataloader_pin_memory", "run_name", "logging_nan_inf_filter")
