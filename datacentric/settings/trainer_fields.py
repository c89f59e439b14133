"""Every field of transformers' ``TrainingArguments`` and TRL's ``SFTConfig``, and every
public method and attribute of their ``Trainer`` / ``SFTTrainer``, as the drop-in trainers
(:mod:`datacentric.integrations`) treat them: honoured (the setting it becomes, and the
test that shows it), refused away from its default (with the reason), noted (the runtime
decides; a note says so) or harmless (no effect on what a run computes, by design).

The command line's did-you-mean reads the same table (:func:`equivalent`): a flag from a
transformers, TRL or torchtitan script is answered with the setting the drop-in maps it
to. docs/integrations.md prints the table (:func:`markdown`); a test fails on any field or
method of the installed transformers and TRL that is not classified here.
"""

from __future__ import annotations

from dataclasses import dataclass

HONOURED, REFUSED, NOTED, HARMLESS = "honoured", "refused", "noted", "harmless"
KINDS = (HONOURED, REFUSED, NOTED, HARMLESS)
DROP_IN_TESTS = "tests/runtime/integrations"


@dataclass(frozen=True)
class Treatment:
    """What the drop-in does with one field, method or attribute."""

    kind: str
    """honoured, refused, noted or harmless."""
    text: str
    """What it becomes (honoured), why not (refused), what decides it instead (noted),
    why it changes nothing (harmless)."""
    setting: str | None = None
    """Our setting it becomes, ``section.key`` (the did-you-mean answer)."""
    test: str | None = None
    """The test that shows it honoured (a function of :data:`DROP_IN_TESTS`)."""


def _h(text: str, test: str, setting: str | None = None) -> Treatment:
    return Treatment(HONOURED, text, setting, test)


def _r(text: str, setting: str | None = None) -> Treatment:
    return Treatment(REFUSED, text, setting)


def _n(text: str) -> Treatment:
    return Treatment(NOTED, text)


def _x(text: str) -> Treatment:
    return Treatment(HARMLESS, text)


SAME = "test_drop_ins_under_torchrun_equal_trl_and_transformers"
CONTROL = "test_should_save_and_should_training_stop_then_resume"
SURFACE = "test_the_script_epilogue_and_trainer_surface"
MAPPED = "test_fields_become_settings"
SWEEP = "test_each_field_trains_as_transformers"
_METRICS = "test_compute_metrics_after_train_as_transformers_evaluate"
_BEST = "test_load_best_model_at_end_as_transformers"
_EARLY = "test_early_stopping_as_transformers"
_GLOBAL = "per_device_train_batch_size x gradient_accumulation_steps x world"
_OWN_LOOP = "the runtime runs its own packed steps; this hook of transformers' loop is never called"
_NO_HUB = "nothing is uploaded: push the saved folder with huggingface_hub yourself"
_OPTIMIZER = "the runtime builds AdamW itself (transformers' adamw_torch)"

#: ``TrainingArguments`` (and so ``SFTConfig``) fields
TRAINING_ARGUMENTS: dict[str, Treatment] = {
    "output_dir": _h(
        "the folder of the run's outputs (the drop-in: checkpoint-N, the saved model, run/)",
        SAME,
        "job.out",
    ),
    "per_device_train_batch_size": _h(
        f"the global batch in samples: {_GLOBAL}", SAME, "scheduling.global_batch_samples"
    ),
    "gradient_accumulation_steps": _h(
        f"the global batch in samples: {_GLOBAL}", SAME, "scheduling.global_batch_samples"
    ),
    "num_train_epochs": _h(
        "the epochs; a share of the last trains that share of its steps (rounded up), as "
        "transformers",
        SWEEP,
        "training.epochs",
    ),
    "max_steps": _h("the step count (when above 0)", CONTROL, "training.iterations"),
    "learning_rate": _h("the peak learning rate", SAME, "training.lr"),
    "lr_scheduler_type": _h(
        "linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup, "
        "inverse_sqrt, warmup_stable_decay, cosine_with_min_lr, cosine_warmup_with_min_lr: "
        "transformers' own schedule; others refused by name",
        "test_lr_schedules_equal_transformers",
        "training.lr_schedule",
    ),
    "lr_scheduler_kwargs": _h(
        "the schedule's arguments, as transformers takes them",
        "test_lr_schedules_equal_transformers",
    ),
    "warmup_steps": _h(
        "the warm-up steps (below 1: a share of the steps)", SAME, "training.warmup_iterations"
    ),
    "optim": _r(f"{_OPTIMIZER}; adamw_torch and adamw_torch_fused are taken as it"),
    "optim_args": _r(_OPTIMIZER),
    "optim_target_modules": _r(_OPTIMIZER),
    "weight_decay": _h(
        "AdamW's decay, not on biases and norm weights (transformers' groups)",
        SURFACE,
        "training.weight_decay",
    ),
    "adam_beta1": _h("AdamW's first beta", SAME, "training.betas"),
    "adam_beta2": _h("AdamW's second beta", SAME, "training.betas"),
    "adam_epsilon": _h("AdamW's epsilon", SURFACE),
    "average_tokens_across_devices": _r(
        "the loss is always the mean over every loss token of the global batch (True)"
    ),
    "max_grad_norm": _h("gradient clipping (0 or below: none)", SWEEP, "training.grad_clip"),
    "label_smoothing_factor": _r("the loss is the model's own cross-entropy"),
    "bf16": _h("training under bfloat16 autocast", SAME, "model.dtype"),
    "fp16": _r("float16 is not supported: use bf16=True", "model.dtype"),
    "bf16_full_eval": _r("evaluation runs as training does (bf16: autocast)"),
    "fp16_full_eval": _r("evaluation runs as training does (bf16: autocast)"),
    "tf32": _h(
        "TF32 matmuls on or off: TrainingArguments sets torch's flags for the process itself",
        "test_a_refused_field_and_method_stop_in_one_line",
    ),
    "activation_checkpointing": _n("recomputation is the planner's decision, block by block"),
    "activation_checkpointing_kwargs": _n("recomputation is the planner's decision"),
    "gradient_checkpointing": _n("recomputation is the planner's decision, block by block"),
    "gradient_checkpointing_kwargs": _n("recomputation is the planner's decision"),
    "torch_compile": _r("use datacentric train --compile", "training.compile"),
    "torch_compile_backend": _r("use datacentric train --compile", "training.compile"),
    "torch_compile_mode": _r("use datacentric train --compile", "training.compile"),
    "use_liger_kernel": _r("the runtime's attention and loss are its own"),
    "liger_kernel_config": _r("the runtime's attention and loss are its own"),
    "use_cache": _x("the generation cache is off while training either way"),
    "neftune_noise_alpha": _r("NEFTune noise is not implemented"),
    "torch_empty_cache_steps": _x("the CUDA cache is the runtime's; no effect on results"),
    "auto_find_batch_size": _n("micro-batches are the planner's decision, from memory"),
    "logging_strategy": _h(
        "steps, epoch or no: the steps on_log is called at",
        "test_logging_strategy_epoch_and_metric_key_prefix",
        "metrics.log_every",
    ),
    "logging_steps": _h(
        "the steps between two on_log calls (below 1: a share of the steps)",
        SWEEP,
        "metrics.log_every",
    ),
    "logging_first_step": _h(
        "step 1 logged too (transformers' DefaultFlowCallback asks it)",
        "test_first_step_and_eval_delay",
    ),
    "log_on_each_node": _x("logging is rank 0's"),
    "logging_nan_inf_filter": _x("a NaN or inf loss is logged as it is"),
    "include_num_input_tokens_seen": _h(
        "num_input_tokens_seen in each log (and a step's train_tokens_per_second), counted "
        "without padding (transformers' all also counts a padded batch's padding)",
        "test_include_num_input_tokens_seen_logs_them_as_transformers",
    ),
    "log_level": _x("only transformers' own logger"),
    "log_level_replica": _x("only transformers' own logger"),
    "disable_tqdm": _x("the progress line is the runtime's"),
    "report_to": _h(
        "tensorboard, wandb, none or all (those installed)", SAME, "metrics.tensorboard"
    ),
    "run_name": _x("a name for the trackers"),
    "project": _x("a name for the trackers"),
    "trackio_space_id": _x("trackio is refused in report_to"),
    "trackio_bucket_id": _x("trackio is refused in report_to"),
    "trackio_static_space_id": _x("trackio is refused in report_to"),
    "eval_strategy": _h("steps, epoch or no", CONTROL, "validation.every"),
    "eval_steps": _h(
        "the steps between two evaluations (below 1: a share of the steps)",
        CONTROL,
        "validation.every",
    ),
    "eval_delay": _h(
        "no evaluation before it (transformers' DefaultFlowCallback asks none)",
        "test_first_step_and_eval_delay",
    ),
    "per_device_eval_batch_size": _h(
        "eval_loss as transformers computes it: the mean of its eval batches' losses (rows "
        "in the set's order, this many a rank, as accelerate shards them), each counted "
        "once per row (TRL's packed eval set: the mean over its loss tokens); "
        "compute_metrics' predictions are each record's alone, padded with -100 to the "
        "longest",
        "test_eval_loss_is_the_mean_of_transformers_eval_batches",
    ),
    "prediction_loss_only": _h(
        "True: compute_metrics is not called (the loss only), as transformers", _METRICS
    ),
    "eval_on_start": _h(
        "an evaluation before the first step, as transformers", "test_first_step_and_eval_delay"
    ),
    "eval_do_concat_batches": _x(
        "predict() concatenates (compute_metrics with False is refused: it is given one array)"
    ),
    "eval_use_gather_object": _x("predict() gathers on every rank itself"),
    "eval_accumulation_steps": _x("predictions move to the CPU record by record"),
    "include_for_metrics": _r("compute_metrics is given the predictions and label_ids only"),
    "batch_eval_metrics": _r("compute_metrics is called once, over the whole eval set"),
    "save_only_model": _x("a checkpoint also holds the optimizer: it only saves more"),
    "save_strategy": _h(
        "steps, epoch or no (a final checkpoint is always written)",
        CONTROL,
        "checkpoint.checkpoint_every",
    ),
    "save_steps": _h(
        "the steps between two checkpoints (below 1: a share of the steps)",
        CONTROL,
        "checkpoint.checkpoint_every",
    ),
    "save_on_each_node": _x("rank 0 writes; the folder is shared"),
    "save_total_limit": _h(
        "keep the newest N checkpoints",
        MAPPED,
        "checkpoint.keep_last",
    ),
    "enable_jit_checkpoint": _r("a stop signal saves already (checkpoint.save_on_signal)"),
    "push_to_hub": _r(_NO_HUB),
    "hub_token": _x("push_to_hub is refused"),
    "hub_private_repo": _x("push_to_hub is refused"),
    "hub_model_id": _x("push_to_hub is refused"),
    "hub_strategy": _x("push_to_hub is refused"),
    "hub_always_push": _x("push_to_hub is refused"),
    "hub_revision": _x("push_to_hub is refused"),
    "load_best_model_at_end": _h(
        "after train(), trainer.model holds the best checkpoint's weights (save_model writes "
        "them; datacentric train: --keep-best)",
        _BEST,
        "checkpoint.keep_best",
    ),
    "metric_for_best_model": _h(
        "state.best_metric, best_global_step and best_model_checkpoint as transformers keeps "
        "them (EarlyStoppingCallback reads them); the eval loss only during training; "
        "save_total_limit with it is refused (keep_last keeps the newest, not the best)",
        _EARLY,
    ),
    "greater_is_better": _h("which way metric_for_best_model improves", _BEST),
    "ignore_data_skip": _r("a resumed run continues at the exact sample it stopped at"),
    "restore_callback_states_from_checkpoint": _r("callback states are not saved"),
    "full_determinism": _r("the runtime's determinism is its own (docs/runtime.md)"),
    "seed": _h("the seed of the model's init and the data order", SAME, "job.seed"),
    "data_seed": _r("the data order follows seed"),
    "use_cpu": _h(
        "train on the CPU", "test_use_cpu_keeps_the_run_on_the_cpu", "parallelism.device"
    ),
    "accelerator_config": _r("no accelerate Accelerator: the runtime holds the ranks"),
    "parallelism_config": _r("parallelism is the planner's decision"),
    "dataloader_drop_last": _h(
        "leave out the last, partial global batch (refused with gradient accumulation where "
        "transformers, which leaves out a partial micro-batch, trains more samples)",
        MAPPED,
        "scheduling.drop_remainder",
    ),
    "dataloader_num_workers": _x("the records are read in the process"),
    "dataloader_pin_memory": _x("the runtime moves its batches itself"),
    "dataloader_persistent_workers": _x("the records are read in the process"),
    "dataloader_prefetch_factor": _x("the records are read in the process"),
    "dataloader_multiprocessing_context": _x("the records are read in the process"),
    "dataloader_in_order": _x("the records are read in the process"),
    "remove_unused_columns": _x("only the columns of the records' format are read"),
    "label_names": _r("the labels are the labels column (or input_ids)"),
    "train_sampling_strategy": _r("the data order is the runtime's (its seed)"),
    "length_column_name": _x("lengths are measured from the records"),
    "ddp_find_unused_parameters": _x("the runtime holds the model (no DDP wrapper settings)"),
    "ddp_bucket_cap_mb": _x("the runtime holds the model (no DDP wrapper settings)"),
    "ddp_broadcast_buffers": _x("the runtime holds the model (no DDP wrapper settings)"),
    "ddp_static_graph": _x("the runtime holds the model (no DDP wrapper settings)"),
    "ddp_backend": _x("nccl on GPUs, gloo on CPUs"),
    "ddp_timeout": _h("seconds a collective may wait", MAPPED, "parallelism.collective_timeout_s"),
    "fsdp": _r("sharding is parallelism.shard (the runtime holds the model)", "parallelism.shard"),
    "fsdp_config": _r("sharding is parallelism.shard", "parallelism.shard"),
    "deepspeed": _r("the runtime holds the model and optimizer itself"),
    "debug": _r("transformers' debug modes are not run"),
    "skip_memory_metrics": _r(
        "transformers' *_mem_* metrics are not computed (the run's metrics.jsonl records "
        "each step's memory)"
    ),
    "do_train": _x("read by scripts, not by the trainer"),
    "do_eval": _x("read by scripts, not by the trainer"),
    "do_predict": _x("read by scripts, not by the trainer"),
    "resume_from_checkpoint": _x("read by scripts: pass it to train()"),
    "local_rank": _x("the rank comes from the launcher's environment"),
}

#: the fields ``SFTConfig`` adds
SFT_CONFIG: dict[str, Treatment] = {
    "model_init_kwargs": _h(
        "dtype float32 (the weights the runtime holds), any attn_implementation, revision "
        "main, trust_remote_code False; others refused",
        SAME,
    ),
    "trust_remote_code": _r("no code of a model folder runs"),
    "router_aux_loss_coef": _r("no router loss is added"),
    "chat_template_path": _h(
        "a .jinja or .j2 file: the tokenizer's chat template, as TRL sets it; another path "
        "(TRL clones that model's template and tokens) refused",
        "test_each_sft_field_trains_as_trl_or_is_refused",
    ),
    "dataset_text_field": _h("the text column of text records", SAME, "data.text_field"),
    "dataset_kwargs": _h(
        "skip_prepare_dataset=True: each row's input_ids and labels taken as given (unset "
        "labels: every token), uncut, as TRL; refused with packing=True, with rows of no "
        "input_ids, and with masks but no labels (TRL refuses those)",
        "test_each_sft_field_trains_as_trl_or_is_refused",
    ),
    "dataset_num_proc": _x("the records are prepared in the process"),
    "eos_token": _h(
        "the tokenizer's own EOS, appended as TRL appends it; another token is refused (TRL "
        "also makes it the model's eos_token_id): set it on the tokenizer given as "
        "processing_class",
        "test_each_sft_field_trains_as_trl_or_is_refused",
    ),
    "max_length": _h("each record cut to its first max_length tokens", SAME, "data.max_tokens"),
    "truncation_mode": _r("records keep their start (keep_start)"),
    "shuffle_dataset": _x("the data order is the runtime's"),
    "packing": _h(
        "True: the global batch in tokens, as TRL's packed step: "
        f"{_GLOBAL} x max_length (never below the longest sample); False: in samples. "
        "Samples are packed without padding either way, attention never crossing a sample",
        "test_packing_steps_as_trl_in_tokens",
        "scheduling.global_batch_tokens",
    ),
    "packing_strategy": _n(
        "the runtime packs its own micro-batches, every sample whole (records are cut to "
        "max_length, as bfd does); with packing=True, bfd_split (it trains the pieces past "
        "max_length) and wrapped (rows across samples) are refused"
    ),
    "padding_free": _n("packing is always on (padding-free)"),
    "pad_to_multiple_of": _x("no padding: samples are packed"),
    "eval_packing": _n(
        "the held-out set is packed as the training set; TRL's packed eval rows are not the "
        "runtime's, so with it (unset: packing) eval_loss is the mean over every loss token "
        "of the set, without it TRL's mean of its eval batches"
    ),
    "completion_only_loss": _h(
        "the loss on the completion of prompt-completion records", SAME, "data.loss_on"
    ),
    "assistant_only_loss": _h(
        "the loss on the chat template's assistant tokens", SAME, "data.loss_on"
    ),
    "loss_type": _r("the loss is the mean negative log-likelihood (nll)"),
    "activation_offloading": _r("recomputation is the planner's decision"),
    "pad_token": _x("no padding: samples are packed"),
}

#: public methods and attributes of transformers' ``Trainer`` (and TRL's ``SFTTrainer``)
METHODS: dict[str, Treatment] = {
    "train": _h("runs datacentric train's trainer", SAME),
    "evaluate": _h(
        "the held-out loss (a dict of sets: one loss each; metric_key_prefix), and "
        "compute_metrics' metrics after train() (refused with an evaluation during training)",
        "test_logging_strategy_epoch_and_metric_key_prefix",
    ),
    "predict": _h("logits and labels of a dataset under the trained model", SURFACE),
    "save_model": _h("the model, or the adapter with its tokenizer", SURFACE),
    "save_state": _h("trainer_state.json in output_dir", SURFACE),
    "log": _h("on_log, and state.log_history", SAME),
    "log_metrics": _h("the metrics printed as transformers prints them", SURFACE),
    "save_metrics": _h("SPLIT_results.json and all_results.json", SURFACE),
    "metrics_format": _h("transformers' own formatting", SURFACE),
    "is_world_process_zero": _h("True on rank 0 only", SURFACE),
    "is_local_process_zero": _h("True on each node's first rank only", SURFACE),
    "add_callback": _h("a TrainerCallback (a class: instantiated)", SURFACE),
    "remove_callback": _h("by object or class", SURFACE),
    "pop_callback": _h("by object or class, returned", SURFACE),
    "create_model_card": _h("a README.md in output_dir", SURFACE),
    "get_num_trainable_parameters": _h("the trained parameters' count", SURFACE),
    "get_learning_rates": _h("the optimizer's learning rate per group", SURFACE),
    "get_decay_parameter_names": _h("transformers' own (the names decayed)", SURFACE),
    "get_total_train_batch_size": _h(f"the global batch: {_GLOBAL}", SURFACE),
    "push_to_hub": _r(_NO_HUB),
    "init_hf_repo": _r(_NO_HUB),
    "hyperparameter_search": _r("run one drop-in per trial yourself"),
    "autocast_smart_context_manager": _r(_OWN_LOOP),
    "call_model_init": _r(_OWN_LOOP),
    "compute_loss": _r(_OWN_LOOP),
    "compute_loss_context_manager": _r(_OWN_LOOP),
    "create_accelerator_and_postprocess": _r(_OWN_LOOP),
    "create_optimizer": _r(_OWN_LOOP),
    "create_optimizer_and_scheduler": _r(_OWN_LOOP),
    "create_scheduler": _r(_OWN_LOOP),
    "end": _r(_OWN_LOOP),
    "evaluation_loop": _r(_OWN_LOOP),
    "floating_point_ops": _r(_OWN_LOOP),
    "get_batch_samples": _r(_OWN_LOOP),
    "get_cp_size": _r("sequence parallelism is the planner's, per group"),
    "get_sp_size": _r("sequence parallelism is the planner's, per group"),
    "get_tp_size": _r("no tensor parallelism"),
    "get_eval_dataloader": _r(_OWN_LOOP),
    "get_test_dataloader": _r(_OWN_LOOP),
    "get_train_dataloader": _r(_OWN_LOOP),
    "get_resumed_dataloader": _r(_OWN_LOOP),
    "get_optimizer_cls_and_kwargs": _r(_OWN_LOOP),
    "get_optimizer_group": _r(_OWN_LOOP),
    "loss_is_scaled_for_ga": _r(_OWN_LOOP),
    "num_examples": _r(_OWN_LOOP),
    "prediction_step": _r(_OWN_LOOP),
    "set_initial_training_values": _r(_OWN_LOOP),
    "store_flos": _r(_OWN_LOOP),
    "training_step": _r(_OWN_LOOP),
    # attributes
    "model": _h("the trained module after train() (a PeftModel for LoRA)", SURFACE),
    "model_wrapped": _h("the same module as model", SURFACE),
    "optimizer": _h("the run's optimizer after train()", SURFACE),
    "lr_scheduler": _h("the run's learning-rate schedule after train()", SURFACE),
    "args": _h("the arguments given", SAME),
    "state": _h("transformers' TrainerState, filled as transformers fills it", CONTROL),
    "control": _h(
        "transformers' TrainerControl; every flag honoured (should_epoch_stop skips the "
        "rest of the epoch)",
        CONTROL,
    ),
    "accelerator": _r("no accelerate Accelerator: the runtime holds the ranks"),
    "callback_handler": _r("the callbacks are called by the drop-in (add_callback)"),
}

#: torchtitan's TOML names (``--section.key`` flags) -> ours
TORCHTITAN: dict[str, str] = {
    "validation.freq": "validation.every",
    "training.steps": "training.iterations",
    "training.global_batch_size": "scheduling.global_batch_samples",
    "training.local_batch_size": "scheduling.global_batch_samples",
    "training.seq_len": "data.max_tokens",
    "training.max_norm": "training.grad_clip",
    "training.dataset_path": "data.dataset",
    "optimizer.lr": "training.lr",
    "optimizer.weight_decay": "training.weight_decay",
    "lr_scheduler.warmup_steps": "training.warmup_iterations",
    "lr_scheduler.decay_type": "training.lr_schedule",
    "checkpoint.interval": "checkpoint.checkpoint_every",
    "checkpoint.keep_latest_k": "checkpoint.keep_last",
    "checkpoint.folder": "job.out",
    "job.dump_folder": "job.out",
    "metrics.log_freq": "metrics.log_every",
    "metrics.enable_tensorboard": "metrics.tensorboard",
    "metrics.enable_wandb": "metrics.wandb",
}


#: Other trainers' names outside the tables above -> (ours, whose name it is)
OTHER_TRAINERS: dict[str, tuple[str, str]] = {
    "train_iters": ("training.iterations", "Megatron-LM's"),
    "save_interval": ("checkpoint.checkpoint_every", "Megatron-LM's"),
    "log_interval": ("metrics.log_every", "Megatron-LM's"),
    "clip_grad": ("training.grad_clip", "Megatron-LM's"),
    "seq_length": ("data.max_tokens", "Megatron-LM's"),
    "nproc_per_node": ("parallelism.world", "torchrun's"),
    "world_size": ("parallelism.world", "torchrun's"),
    "max_seq_length": ("data.max_tokens", "TRL's former"),
    "resume_from_checkpoint": ("checkpoint.resume_from", "transformers' train() argument"),
}


def other_names() -> dict[str, str]:
    """Every other trainer's name of one of our settings, as a key of a TOML file or
    section would be written (``learning_rate``, torchtitan's ``steps`` of ``[training]``)
    -> our setting, ``section.key``: the one table the command line's and the settings
    file's did-you-mean read."""
    names = {key.rpartition(".")[2]: ours for key, ours in TORCHTITAN.items()}
    names |= {name: t.setting for name, t in fields().items() if t.setting}
    return names | {name: ours for name, (ours, _) in OTHER_TRAINERS.items()}


def fields() -> dict[str, Treatment]:
    """Every ``TrainingArguments`` and ``SFTConfig`` field classified."""
    return {**TRAINING_ARGUMENTS, **SFT_CONFIG}


def equivalent(name: str) -> tuple[str, str] | None:
    """Our setting (``section.key``) that another trainer's ``name`` means, and what the
    drop-in makes of it: a field of ``TrainingArguments``/``SFTConfig`` (dashes read as
    underscores), a torchtitan ``section.key`` or a name of :data:`OTHER_TRAINERS`; None
    when it has none."""
    key = name.lstrip("-").replace("-", "_")
    if key in TORCHTITAN:
        return TORCHTITAN[key], f"torchtitan's {key}"
    if key in OTHER_TRAINERS:
        ours, whose = OTHER_TRAINERS[key]
        return ours, f"{whose} {key}"
    treatment = fields().get(key)
    if treatment is None or treatment.setting is None:
        return None
    return treatment.setting, f"transformers' {key}: {treatment.text}"


def markdown() -> str:
    """The table as docs/integrations.md prints it: one row per field, then per method."""
    rows = ["| field | treatment | what, or why |", "|---|---|---|"]
    for name, t in fields().items():
        rows.append(f"| `{name}` | {t.kind} | {_row_text(t)} |")
    rows += ["", "| method or attribute | treatment | what, or why |", "|---|---|---|"]
    for name, t in METHODS.items():
        rows.append(f"| `{name}` | {t.kind} | {_row_text(t)} |")
    return "\n".join(rows) + "\n"


def _row_text(treatment: Treatment) -> str:
    text = treatment.text.replace("|", "\\|")
    if treatment.kind == HONOURED and treatment.setting:
        return f"`{treatment.setting}`: {text}"
    return text
