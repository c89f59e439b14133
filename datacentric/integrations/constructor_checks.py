"""What a drop-in trainer's constructor checks before it keeps anything, each refusal in
one line: the arguments against their defaults (a field that does not map stops; some
are noted), the evaluations the run can give, the methods a subclass may not override
and a ``PeftModel`` given as the model. Reading the arguments leaves accelerate's shared
state as transformers' ``Trainer`` constructor does."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from datacentric.integrations.arguments import (
    NOTED,
    ArgumentsError,
    check_best_model,
    refused_fields,
)
from datacentric.integrations.stops import stop
from datacentric.settings.trainer_fields import METHODS, REFUSED


def checked_construction(
    trainer_class: type,
    command: str,
    given: dict[str, Any],
) -> list[str]:
    """Stop (in one line, as ``command``) on what a drop-in of ``trainer_class`` cannot
    run of what the script ``given`` (``args``, ``model``, ``eval_dataset``,
    ``compute_metrics``); the notes on the fields the run reads otherwise (:data:`NOTED`)."""
    args, eval_dataset = given["args"], given["eval_dataset"]
    _refuse_overrides(trainer_class, command)
    with _quiet_transformers():  # its advice and deprecations were the user's to see
        reference = type(args)(output_dir=args.output_dir, bf16=args.bf16, use_cpu=args.use_cpu)
        refused = refused_fields(args, reference)
        values = {name: getattr(args, name, None) for name in NOTED}
    _accelerate_state_as_transformers(args)
    if refused:
        stop(
            command,
            f"{', '.join(refused)}: not supported by datacentric's "
            "drop-in trainer (docs/integrations.md lists what maps); leave "
            f"{'them' if len(refused) > 1 else 'it'} at the default",
        )
    _refuse_evaluations(command, args, eval_dataset, given["compute_metrics"])
    if getattr(given["model"], "peft_config", None):
        where = (
            "peft_config"
            if command == "SFTTrainer"  # transformers' Trainer takes no peft_config
            else "peft_config to datacentric.integrations.trl.SFTTrainer (it takes "
            "tokenized input_ids and labels)"
        )
        stop(command, f"model is a PeftModel: give its base model and {where}")
    return [
        f"note: {name}={values[name]!r}: {why}"
        for name, why in NOTED.items()
        if values[name] and not (name == "per_device_eval_batch_size" and eval_dataset is None)
    ]


def _refuse_evaluations(command: str, args: Any, eval_dataset: Any, compute_metrics: Any) -> None:
    """Stop when ``eval_strategy`` has no ``eval_dataset``, when
    ``metric_for_best_model`` / ``load_best_model_at_end`` ask what the evaluations
    during training cannot give (:func:`.arguments.check_best_model`), or when
    ``compute_metrics`` would be asked of an evaluation during training (the runtime's
    evaluations compute the held-out loss only) or in a form that ``evaluate()`` does
    not give it (lists of batches)."""
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if strategy != "no" and eval_dataset is None:  # transformers raises here too
        stop(
            command,
            f"eval_strategy={strategy!r}: no eval_dataset to evaluate; give one, or set "
            "eval_strategy='no'",
        )
    names = eval_dataset if isinstance(eval_dataset, dict) else {None: None}
    try:  # metric_for_best_model and load_best_model_at_end
        check_best_model(args, ["eval" if n is None else f"eval_{n}" for n in names])
    except ArgumentsError as err:
        stop(command, str(err))
    if compute_metrics is None:
        return
    during = f"eval_strategy={strategy!r}" if strategy != "no" else None
    if during is None and args.eval_on_start:
        during = "eval_on_start=True"
    if during:
        stop(
            command,
            f"compute_metrics with {during}: the evaluations during training compute "
            "the held-out loss only; set eval_strategy='no' (eval_on_start=False) and "
            "call trainer.evaluate() after train() (it computes the metrics)",
        )
    if not args.eval_do_concat_batches:
        stop(
            command,
            "compute_metrics with eval_do_concat_batches=False: its predictions are "
            "concatenated over the eval set; leave eval_do_concat_batches at True",
        )


def _refuse_overrides(trainer_class: type, command: str) -> None:
    """Stop when ``trainer_class`` overrides a method of transformers' loop that the
    runtime never calls (``compute_loss``, ``training_step``...)."""
    for name, treatment in METHODS.items():
        if treatment.kind == REFUSED and name in vars(trainer_class):
            stop(
                command,
                f"{trainer_class.__name__}.{name}: overriding it has no effect "
                f"({treatment.text}); remove the override",
            )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings and logged advice silenced while the drop-in builds and
    reads arguments objects (a reference ``TrainingArguments`` under torchrun logs that
    DDP wants ``torch.distributed.launch``; a deprecated field's alias warns on read)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)


def _accelerate_state_as_transformers(args: Any) -> None:
    """accelerate's shared state set up again, as transformers' ``Trainer`` constructor
    leaves it (its ``Accelerator``, of ``args.mixed_precision``).

    Every ``TrainingArguments`` (the script's, and the reference the drop-in reads the
    defaults from) clears accelerate's shared ``AcceleratorState`` when it sets up its
    device; transformers' ``Trainer`` fills it again with the ``Accelerator`` it builds.
    Without this, a transformers ``Trainer`` built earlier in the script finds the state
    cleared when it trains (``AcceleratorState`` has no ``distributed_type``). The
    runtime itself never reads it; the ``Accelerator`` is not kept."""
    from accelerate import Accelerator

    # transformers before 5 reads it from ACCELERATE_MIXED_PRECISION (None: as there)
    Accelerator(mixed_precision=getattr(args, "mixed_precision", None))
