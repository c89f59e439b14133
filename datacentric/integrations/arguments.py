"""transformers' ``TrainingArguments`` and TRL's ``SFTConfig``, field by field, as the
settings of a ``datacentric train`` run (docs/integrations.md holds the same table).

:data:`MAPPED` names every field that becomes a setting; :data:`NOTED` the fields
whose value the runtime decides itself (said in a note); :data:`HARMLESS` the fields
that change nothing a run computes. Any other field set away from its default is
refused by name (:func:`refused_fields`), never ignored.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

#: field -> the setting it becomes
MAPPED: dict[str, str] = {
    "output_dir": "job.out (the run folder)",
    "per_device_train_batch_size": "scheduling.global_batch_samples (x accumulation x world)",
    "gradient_accumulation_steps": "scheduling.global_batch_samples (x batch x world)",
    "learning_rate": "training.lr",
    "lr_scheduler_type": "training.lr_schedule (linear, constant, constant_with_warmup)",
    "warmup_steps": "training.warmup_iterations (a value below 1: a share of the steps)",
    "warmup_ratio": "training.warmup_iterations (that share of the steps, rounded up)",
    "weight_decay": "training.weight_decay",
    "adam_beta1": "training.betas[0]",
    "adam_beta2": "training.betas[1]",
    "max_grad_norm": "training.grad_clip",
    "num_train_epochs": "training.epochs (a whole number)",
    "max_steps": "training.iterations (when above 0)",
    "logging_steps": "metrics.log_every, and the steps of on_log",
    "logging_strategy": "metrics.log_every (no: 0)",
    "save_strategy": "checkpoint.checkpoint_every (steps, epoch or no)",
    "save_steps": "checkpoint.checkpoint_every",
    "save_total_limit": "checkpoint.keep_last",
    "eval_strategy": "validation.every (steps, epoch or no)",
    "eval_steps": "validation.every (unset: logging_steps)",
    "report_to": "metrics.tensorboard, metrics.wandb",
    "seed": "job.seed",
    "bf16": "model.dtype bfloat16 (autocast)",
    "max_length": "the records' truncation (keep_start) and data.max_tokens",
    "assistant_only_loss": "the loss on the chat template's assistant tokens",
    "completion_only_loss": "the loss on the completion of prompt-completion records",
    "dataset_text_field": "the text column of text records",
    "model_init_kwargs": "only dtype float32 (the weights the runtime holds; others refused)",
}
#: field -> why its value does not change a run (a note)
NOTED: dict[str, str] = {
    "packing": "packing is always on: samples are packed without padding, attention "
    "never crossing a sample",
    "padding_free": "packing is always on (padding-free)",
    "gradient_checkpointing": "recomputation is the planner's decision, block by block",
    "activation_checkpointing": "recomputation is the planner's decision, block by block",
    "per_device_eval_batch_size": "the held-out loss is over the whole set at once",
}
#: fields that change nothing a run computes, or that transformers derives from others
HARMLESS = frozenset(
    {
        "logging_dir",
        "run_name",
        "disable_tqdm",
        "do_train",
        "do_eval",
        "do_predict",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "dataset_num_proc",
        "fp16",  # transformers derives it; fp16=True is refused below
        "pad_to_multiple_of",
        "use_cpu",  # the device is parallelism.device's (cuda when available)
        "eval_packing",
    }
)
#: lr_scheduler_type -> training.lr_schedule; others are refused
SCHEDULES = {"linear": "linear", "constant": "constant", "constant_with_warmup": "constant"}


class ArgumentsError(ValueError):
    """A field the runtime cannot honour, named."""


def refused_fields(args: Any, reference: Any) -> list[str]:
    """The fields of ``args`` set away from ``reference`` (the same class with the same
    ``output_dir``: its defaults as ``__post_init__`` resolves them) that no setting
    maps, each as ``name=value``."""
    known = set(MAPPED) | set(NOTED) | HARMLESS
    refused = []
    for field in dataclasses.fields(args):
        if not field.init or field.name.startswith("_") or field.name in known:
            continue
        value = getattr(args, field.name)
        if _plain(value) != _plain(getattr(reference, field.name)):
            refused.append(f"{field.name}={value!r}")
    if getattr(args, "fp16", False):
        refused.append("fp16=True")
    return refused


def _plain(value: Any) -> Any:
    """An enum's value, else the value (transformers holds some choices as enums)."""
    return getattr(value, "value", value)


def whole(value: float, name: str) -> int:
    """``value`` as an int when it is a whole number, else :class:`ArgumentsError`."""
    if float(value) != math.floor(float(value)) or value < 0:
        raise ArgumentsError(f"{name}={value!r}: give a whole number (datacentric counts steps)")
    return int(value)


def every(strategy: Any, steps: float | None, per_epoch: int, name: str) -> int:
    """The steps between two events of a ``*_strategy`` (``no``: 0)."""
    strategy = _plain(strategy)
    if strategy == "no":
        return 0
    if strategy == "epoch":
        return per_epoch
    if strategy == "steps" and steps is not None:
        if 0 < steps < 1:
            raise ArgumentsError(
                f"{name}={steps!r}: a share of the steps is not supported; give a step count"
            )
        return whole(steps, name)
    raise ArgumentsError(f"{name.split('_')[0]}_strategy={strategy!r}: use steps, epoch or no")


def sinks(report_to: Any) -> dict[str, bool]:
    """``report_to`` as the ``[metrics]`` sinks (tensorboard, wandb)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = {"tensorboard", "wandb"} if "all" in names else set(names) - {"none"}
    other = sorted(names - {"tensorboard", "wandb"})
    if other:
        raise ArgumentsError(
            f"report_to={report_to!r}: {', '.join(other)} is not supported; use tensorboard, "
            "wandb or none"
        )
    return {"tensorboard": "tensorboard" in names, "wandb": "wandb" in names}


def training_settings(args: Any, *, world: int, samples: int) -> dict[str, Any]:
    """The flat settings of ``args`` for a run of ``samples`` training samples on
    ``world`` ranks (the schedule needs the steps of an epoch)."""
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    per_epoch = max(1, math.ceil(samples / batch))
    epochs = whole(args.num_train_epochs, "num_train_epochs")
    total = args.max_steps if args.max_steps > 0 else epochs * per_epoch
    schedule = _plain(args.lr_scheduler_type)
    if schedule not in SCHEDULES:
        raise ArgumentsError(
            f"lr_scheduler_type={schedule!r}: not supported; use linear, constant or "
            "constant_with_warmup (datacentric's cosine ends at a tenth of the peak: "
            "`datacentric train --lr-schedule cosine`)"
        )
    warmup = args.get_warmup_steps(total)
    if getattr(args, "warmup_ratio", None):
        warmup = max(warmup, math.ceil(total * args.warmup_ratio))
    if schedule == "constant" and warmup:
        raise ArgumentsError(
            "lr_scheduler_type='constant' has no warm-up: use constant_with_warmup"
        )
    log_every = args.logging_steps if _plain(args.logging_strategy) != "no" else 0
    return {
        "out": str(args.output_dir),
        "seed": args.seed,
        "global_batch_samples": batch,
        "lr": args.learning_rate,
        "lr_schedule": SCHEDULES[schedule],
        "warmup_iterations": warmup,
        "weight_decay": args.weight_decay,
        "betas": (args.adam_beta1, args.adam_beta2),
        "grad_clip": args.max_grad_norm or 0.0,
        "epochs": max(1, epochs),
        "iterations": args.max_steps if args.max_steps > 0 else None,
        "log_every": every("steps" if log_every else "no", log_every, per_epoch, "logging_steps"),
        "checkpoint_every": every(args.save_strategy, args.save_steps, per_epoch, "save_steps"),
        "keep_last": args.save_total_limit,
        "validation_every": every(
            args.eval_strategy, args.eval_steps or args.logging_steps, per_epoch, "eval_steps"
        ),
        "dtype": "bfloat16" if args.bf16 else "float32",
        **sinks(args.report_to),
    }
