"""The checks of settings that are each valid but cannot work together, or need parsing
(torch-free); :func:`~datacentric.settings.run_settings.validate` runs them on a run's
sections."""

from __future__ import annotations

from datacentric.settings.schema import ConfigError
from datacentric.settings.sections import (
    CheckpointConfig,
    JobConfig,
    TrainingConfig,
    ValidationConfig,
    split_fraction,
)

#: ``[validation]`` settings of a pipeline render only
RENDER_KEYS = (
    "height",
    "width",
    "num_frames",
    "num_inference_steps",
    "guidance_scale",
    "true_cfg_scale",
)


def check_validation(
    validation: ValidationConfig, training: TrainingConfig, checkpoint: CheckpointConfig
) -> None:
    """A held-out split that cannot be drawn, ``every`` past a run of known length, a
    pipeline with no prompts to render or render settings without one, a ``keep_best``
    with nothing to rank the checkpoints by."""
    try:
        split_fraction(validation.dataset)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    every, steps = validation.every, training.iterations
    if validation.dataset is None and validation.limit is not None:
        raise ConfigError(
            "validation.limit: no held-out samples; set validation.dataset "
            "(split=0.1, or a dataset such as jsonl:heldout.jsonl)"
        )
    if validation.dataset is None and validation.prompts is None and every:
        raise ConfigError(
            "validation.every: nothing to validate; set validation.dataset (split=0.1, or "
            "a dataset such as jsonl:heldout.jsonl) or validation.prompts"
        )
    if every and steps is not None and every > steps:
        raise ConfigError(
            f"validation.every: {every} is more than the run's {steps} "
            f"{'step' if steps == 1 else 'steps'} "
            "(training.iterations): validation would run only after the last step; lower it"
        )
    if validation.pipeline is not None and validation.prompts is None:
        raise ConfigError(
            "validation.pipeline: nothing to render; set validation.prompts (a file of "
            "prompts, one per line)"
        )
    for key in RENDER_KEYS:
        if validation.pipeline is None and getattr(validation, key) is not None:
            raise ConfigError(
                f"validation.{key}: only a pipeline render uses it; set validation.pipeline "
                "(a diffusers pipeline folder) or leave it unset"
            )
    check_keep_best(validation, checkpoint)


def check_keep_best(validation: ValidationConfig, checkpoint: CheckpointConfig) -> None:
    """A ``keep_best`` with no validation loss to rank checkpoints by, or one validated
    at steps that are not saved (``every`` not a multiple of ``checkpoint_every``): the
    best step's checkpoint is kept only if that step saved one, and with the default
    ``checkpoint_every`` a run validated every few steps kept none of them."""
    if not checkpoint.keep_best:
        return
    if validation.dataset is None:
        raise ConfigError(
            "checkpoint.keep_best: needs a validation loss to rank checkpoints by; set "
            "validation.dataset (and validation.every, at checkpoint steps)"
        )
    every, saves = validation.every, checkpoint.checkpoint_every
    if every == 0:
        raise ConfigError(
            "checkpoint.keep_best: validation.every 0 computes no validation loss to rank "
            "checkpoints by; leave validation.every unset (after the last step) or set it "
            "to a multiple of checkpoint.checkpoint_every"
        )
    if every is not None and (saves == 0 or every % saves):
        given = f"checkpoint.checkpoint_every {saves}" + (" (by time only)" if not saves else "")
        other = f", or validation.every to a multiple of {saves}" if saves else ""
        raise ConfigError(
            f"checkpoint.keep_best: validation.every {every} validates at steps that {given} "
            "does not save, so the best of them may have no checkpoint to keep; set "
            f"checkpoint.checkpoint_every to {every} (or a divisor of it){other}"
        )


def check_resume(job: JobConfig, checkpoint: CheckpointConfig) -> None:
    """``overwrite`` with a resume, and a SHA-256 pin that cannot be checked."""
    resuming = checkpoint.resume or checkpoint.resume_from is not None
    if job.overwrite and resuming:
        flag = "--resume" if checkpoint.resume else "--resume-from"
        raise ConfigError(
            f"job.overwrite and checkpoint.{flag[2:].replace('-', '_')} cannot both be set: "
            f"--overwrite deletes the run that {flag} continues; drop one of them"
        )
    if checkpoint.expect_sha256 is not None:
        digest = checkpoint.expect_sha256.strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(
                "checkpoint.expect_sha256: needs 64 hexadecimal digits (the SHA-256 of "
                f"manifest.json), got {checkpoint.expect_sha256!r}"
            )
        if not resuming:
            raise ConfigError(
                "checkpoint.expect_sha256: only checked when resuming; pass --resume or "
                "--resume-from with it"
            )


def parse_fault(spec: str) -> tuple[int, int, str]:
    """``RANK:ITERATION[:kill|hang]`` -> (rank, iteration, mode)."""
    parts = spec.split(":")
    mode = parts[2] if len(parts) == 3 else "kill"
    try:
        if len(parts) not in (2, 3) or mode not in ("kill", "hang", "term", "stop"):
            raise ValueError
        rank, iteration = int(parts[0]), int(parts[1])
    except ValueError:
        raise ConfigError(
            "training.fault_inject: must be 'RANK:ITERATION' or 'RANK:ITERATION:hang|term|stop' "
            f"(e.g. '1:3'), got {spec!r}"
        ) from None
    return rank, iteration, mode
