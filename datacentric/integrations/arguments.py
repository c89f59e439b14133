"""transformers' ``TrainingArguments`` and TRL's ``SFTConfig``, field by field, as the
settings of a ``datacentric train`` run, by section.

Which field is honoured, noted, harmless or refused is the table of
:mod:`datacentric.settings.trainer_fields` (docs/integrations.md prints it): a refused
field, or one the table does not know, set away from its default stops the script by
name (:func:`refused_fields`), never ignored.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Sequence
from typing import Any

from datacentric.scheduling.global_batches import steps_per_epoch as epoch_steps
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.settings.trainer_fields import NOTED as NOTED_KIND
from datacentric.settings.trainer_fields import REFUSED, fields
from datacentric.shapes import SampleShape

#: field -> why its value does not change a run (said in a note when set)
NOTED: dict[str, str] = {name: t.text for name, t in fields().items() if t.kind == NOTED_KIND}
#: lr_scheduler_type values run as transformers computes them (its own ``get_scheduler``
#: lambdas); others are refused by name
SCHEDULES = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "warmup_stable_decay",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
)


#: refused fields' values that compute what the default computes (taken, not refused)
AS_DEFAULT = {"optim": ("adamw_torch", "adamw_torch_fused")}


class ArgumentsError(ValueError):
    """A field the runtime cannot honour, named."""


def refused_fields(args: Any, reference: Any) -> list[str]:
    """The fields of ``args`` set away from ``reference`` (the same class with the same
    ``output_dir``: its defaults as ``__post_init__`` resolves them) that no setting
    maps, each as ``name=value (why)``."""
    table = fields()
    refused = []
    for field in dataclasses.fields(args):
        treatment = table.get(field.name)
        if not field.init or field.name.startswith("_"):
            continue
        if treatment is not None and treatment.kind != REFUSED:
            continue
        value = _plain(getattr(args, field.name))
        if value in AS_DEFAULT.get(field.name, ()):
            continue
        if value != _plain(getattr(reference, field.name)):
            why = treatment.text if treatment is not None else "not known to this release"
            refused.append(f"{field.name}={value!r} ({why})")
    return refused


def _plain(value: Any) -> Any:
    """An enum's value, else the value (transformers holds some choices as enums)."""
    return getattr(value, "value", value)


def whole(value: float, name: str) -> int:
    """``value`` as an int when it is a whole number, else :class:`ArgumentsError`."""
    if float(value) != math.floor(float(value)) or value < 0:
        raise ArgumentsError(f"{name}={value!r}: give a whole number (datacentric counts steps)")
    return int(value)


def every(strategy: Any, steps: float | None, per_epoch: int, name: str, total: int) -> int:
    """The steps between two events of a ``*_strategy`` (``no``: 0) in a run of ``total``
    steps (``steps`` below 1: that share of them, rounded up, as transformers)."""
    strategy = _plain(strategy)
    if strategy == "no":
        return 0
    if strategy == "epoch":
        return per_epoch
    if strategy == "steps" and steps is not None:
        if 0 < steps < 1:
            return math.ceil(total * steps)
        return whole(steps, name)
    raise ArgumentsError(f"{name.split('_')[0]}_strategy={strategy!r}: use steps, epoch or no")


def sinks(report_to: Any) -> dict[str, bool]:
    """``report_to`` as the ``[metrics]`` sinks (tensorboard, wandb; ``all``: those
    installed)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" in names:  # as transformers: every one that is installed
        names = {name for name in ("tensorboard", "wandb") if importlib.util.find_spec(name)}
    names = set(names) - {"none"}
    other = sorted(names - {"tensorboard", "wandb"})
    if other:
        raise ArgumentsError(
            f"report_to={report_to!r}: {', '.join(other)} is not supported; use tensorboard, "
            "wandb or none"
        )
    return {"tensorboard": "tensorboard" in names, "wandb": "wandb" in names}


def training_settings(args: Any, *, world: int, tokens: Sequence[int]) -> dict[str, dict[str, Any]]:
    """The ``{section: {field: value}}`` settings of ``args`` for a run on ``world`` ranks
    of training samples of ``tokens`` tokens each (the schedule needs the steps of an
    epoch)."""
    scheduling = {
        **global_batch(args, world, tokens),
        "drop_remainder": bool(args.dataloader_drop_last),
    }
    check_drop_last(args, world, len(tokens))
    per_epoch = steps_per_epoch(args, tokens, SchedulingConfig(**scheduling))
    if args.max_steps > 0:  # transformers' count of epochs; num_train_epochs is not read
        epochs, total = math.ceil(args.max_steps / per_epoch), args.max_steps
        iterations = total
    else:  # as transformers: a share of the last epoch is its share of the steps
        if args.num_train_epochs <= 0:  # transformers' Trainer then returns untrained
            raise ArgumentsError(
                f"num_train_epochs={args.num_train_epochs!r} with no max_steps trains no "
                "step: give num_train_epochs above 0, or max_steps"
            )
        epochs = math.ceil(args.num_train_epochs)
        total = math.ceil(args.num_train_epochs * per_epoch)
        iterations = total if total < epochs * per_epoch else None  # ends inside an epoch
    warmup = warmup_steps(args, total)
    lr_factor(args, total)  # refused here, before the run is built
    log_every = every(args.logging_strategy, args.logging_steps, per_epoch, "logging_steps", total)
    every(args.save_strategy, args.save_steps, per_epoch, "save_steps", total)
    every(args.eval_strategy, args.eval_steps, per_epoch, "eval_steps", total)
    limit = args.save_total_limit or 0  # transformers deletes none at 0 or below, as unset
    return {
        "job": {"out": str(args.output_dir), "seed": args.seed},
        "scheduling": scheduling,
        "training": {
            "lr": args.learning_rate,
            # the schedule that runs is transformers' (lr_factor, through the hooks);
            # the section records the warm-up and the closest schedule of ours
            "lr_schedule": "constant" if "constant" in _plain(args.lr_scheduler_type) else "linear",
            "warmup_iterations": warmup,
            "weight_decay": args.weight_decay,
            "betas": (args.adam_beta1, args.adam_beta2),
            # as transformers: no clipping unless above 0
            "grad_clip": max(args.max_grad_norm or 0.0, 0.0),
            "epochs": max(1, epochs),
            "iterations": iterations,
        },
        "metrics": {"log_every": log_every, **sinks(args.report_to)},
        # the callbacks' TrainerControl asks for every save and evaluation (a final
        # checkpoint is always written)
        "checkpoint": {"checkpoint_every": 0, "keep_last": limit if limit > 0 else None},
        "validation": {"every": 0},
        "model": {"dtype": "bfloat16" if args.bf16 else "float32"},
        "parallelism": {
            "collective_timeout_s": float(args.ddp_timeout),
            **({"device": "cpu"} if args.use_cpu else {}),
        },
    }


def check_drop_last(args: Any, world: int, samples: int) -> None:
    """:class:`ArgumentsError` when ``dataloader_drop_last`` would leave out other samples
    of an epoch of ``samples`` than transformers' loader does: it drops the last partial
    micro-batch of each rank, the runtime the last partial global batch (with gradient
    accumulation, whole micro-batches more)."""
    if not args.dataloader_drop_last or getattr(args, "packing", False):
        return
    rows = args.per_device_train_batch_size * world
    batch = rows * args.gradient_accumulation_steps
    if samples // rows * rows != samples // batch * batch:
        raise ArgumentsError(
            f"dataloader_drop_last=True with gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}: transformers trains {samples // rows * rows} "
            f"of the {samples} samples an epoch (it leaves out a partial micro-batch), the "
            f"runtime {samples // batch * batch} (it leaves out a partial global batch); set "
            "dataloader_drop_last=False or gradient_accumulation_steps=1"
        )


def warmup_steps(args: Any, total: int) -> int:
    """The warm-up steps of a run of ``total`` steps (``warmup_steps``, a share when below
    1, or ``warmup_ratio``)."""
    warmup = args.get_warmup_steps(total)
    if getattr(args, "warmup_ratio", None):
        warmup = max(warmup, math.ceil(total * args.warmup_ratio))
    return warmup


def lr_factor(args: Any, total: int) -> Any:
    """transformers' multiplier of the peak learning rate at optimizer step n of a run of
    ``total`` steps (its own ``get_scheduler`` lambda, with ``lr_scheduler_kwargs``);
    :class:`ArgumentsError` naming a schedule that is not a per-step multiplier."""
    import torch
    from transformers.optimization import get_scheduler

    name = _plain(args.lr_scheduler_type)
    if name not in SCHEDULES:
        raise ArgumentsError(
            f"lr_scheduler_type={name!r}: not supported (not a schedule of the step); use "
            f"{', '.join(SCHEDULES)}"
        )
    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    try:
        scheduler = get_scheduler(
            name,
            probe,
            num_warmup_steps=warmup_steps(args, total),
            num_training_steps=total,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
        )
    except (TypeError, ValueError) as err:
        raise ArgumentsError(
            f"lr_scheduler_type={name!r} with lr_scheduler_kwargs="
            f"{args.lr_scheduler_kwargs!r}: {err}"
        ) from None
    return scheduler.lr_lambdas[0]


def global_batch(args: Any, world: int, tokens: Sequence[int]) -> dict[str, int]:
    """The run's global batch, as the ``[scheduling]`` setting: per_device_train_batch_size
    x gradient_accumulation_steps x ``world`` samples, or with TRL's ``packing=True`` as
    many rows of ``max_length`` tokens: ``global_batch_tokens`` (the tokens of TRL's
    packed step), never below the longest sample (of ``tokens``), as the runtime sizes a
    global batch (it keeps every sample whole)."""
    rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    if not getattr(args, "packing", False):
        return {"global_batch_samples": rows}
    if args.max_length is None:  # TRL refuses it too
        raise ArgumentsError(
            "packing=True with max_length=None: a packed row is max_length tokens; set max_length"
        )
    return {"global_batch_tokens": max(rows * args.max_length, max(tokens, default=0))}


def steps_per_epoch(args: Any, tokens: Sequence[int], scheduling: SchedulingConfig) -> int:
    """Optimizer steps in an epoch of samples of ``tokens`` tokens each: the run's own
    global batches at ``scheduling``'s global batch (in samples or tokens; the last,
    partial one left out with ``dataloader_drop_last``)."""
    shapes = [SampleShape.text(count) for count in tokens]
    return epoch_steps(shapes, scheduling, seed=args.seed, world_size=1)


def epoch_batches(args: Any, samples: int, world: int) -> int:
    """transformers' micro-batches of an epoch of ``samples`` on each of ``world`` ranks
    (its data loader's length), which its ``state.epoch`` counts; 0 with TRL's
    ``packing=True`` (its packed rows are not the runtime's global batches)."""
    if getattr(args, "packing", False):
        return 0
    rows = args.per_device_train_batch_size * world
    return samples // rows if args.dataloader_drop_last else math.ceil(samples / rows)


def best_metric_key(args: Any) -> str | None:
    """The metric ``metric_for_best_model`` names, as transformers reads it from an
    evaluation's metrics (``eval_`` added); None: unset."""
    metric = args.metric_for_best_model
    if metric is None:
        return None
    return metric if metric.startswith("eval_") else f"eval_{metric}"


def check_best_model(args: Any, prefixes: Sequence[str]) -> None:
    """:class:`ArgumentsError` when ``metric_for_best_model`` names a metric that the
    evaluations during training (eval sets of metric ``prefixes``: the held-out loss
    only) do not give, when ``load_best_model_at_end`` breaks transformers' rules (save
    and eval strategies equal, save_steps a multiple of eval_steps), or when
    ``save_total_limit`` could delete the best checkpoint (the runtime's ``keep_last``
    keeps the newest checkpoints only)."""
    strategy, saving = _plain(args.eval_strategy), _plain(args.save_strategy)
    key = best_metric_key(args)
    if key is None or strategy == "no":
        return
    given = [f"{prefix}_loss" for prefix in prefixes]
    if key not in given:
        raise unknown_best_metric(args, given)
    if args.load_best_model_at_end and strategy != saving:
        raise ArgumentsError(
            f"load_best_model_at_end=True with eval_strategy={strategy!r} and "
            f"save_strategy={saving!r}: set them equal, as transformers requires"
        )
    if args.load_best_model_at_end and strategy == "steps" and args.save_steps % args.eval_steps:
        raise ArgumentsError(
            f"load_best_model_at_end=True with save_steps={args.save_steps!r}: give a multiple "
            f"of eval_steps={args.eval_steps!r}, as transformers requires"
        )
    if args.save_total_limit is not None and args.save_total_limit > 0:
        raise ArgumentsError(
            f"save_total_limit={args.save_total_limit!r} with metric_for_best_model="
            f"{args.metric_for_best_model!r}: the runtime keeps the newest checkpoints only "
            "and could delete the best one; leave save_total_limit unset"
        )


def unknown_best_metric(args: Any, given: Sequence[str]) -> ArgumentsError:
    """The error of a ``metric_for_best_model`` that an evaluation during training (its
    metrics: ``given``) does not give."""
    return ArgumentsError(
        f"metric_for_best_model={args.metric_for_best_model!r}: the evaluations during "
        f"training give {', '.join(given)} only (compute_metrics runs after train()); "
        f"set metric_for_best_model to {given[0]!r}"
    )
