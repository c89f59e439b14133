"""Atomic, checksummed checkpoints built on ``torch.distributed.checkpoint``.

Layout of a run folder::

    checkpoints/step-00000006/     one checkpoint (DCP shards + our files)
        .metadata, __0_0.distcp    model and optimizer state (torch.distributed.checkpoint)
        rng-rank0.pt ...           each rank's RNG states (tensors only)
        trainer.json               position (epoch, iteration, samples seen, consumed ids),
                                   learning-rate schedule, profile fingerprint, world size
        manifest.json              SHA-256 of every file above (written last)
    checkpoints/latest             name of the newest complete checkpoint

A checkpoint is written into ``step-N.tmp`` and renamed only when complete (to
``step-N``, or ``step-N-rK`` when step N was saved before: a final save after a
periodic one), then ``latest`` is switched atomically, and only then are older
copies and checkpoints beyond ``keep_last`` deleted: a kill at any moment leaves
``latest`` naming a complete checkpoint. Loading verifies every checksum first;
:func:`find_checkpoint` falls back to the newest valid checkpoint, with a notice,
when ``latest`` is missing, dangling or corrupt. A full disk is a
:class:`CheckpointError` saying so. Model and optimizer go
through ``torch.distributed.checkpoint`` so that a run can resume on a different
number of ranks (replicated parameters are resharded by DCP's planner).

Nothing in a checkpoint runs code when it is read (:mod:`datacentric.train.checkpoints.safe_load`):
every pickle in it goes through an allow-list, and ``expect_sha256`` (the SHA-256 of
``manifest.json``, printed at save time and by ``inspect``) pins every file of a
checkpoint before any of them is read.

Where each part lives: the folder's layout and names in
:mod:`~datacentric.train.checkpoints.checkpoint_folders`; saving in
:mod:`~datacentric.train.checkpoints.checkpoint_save`; verifying, and finding the
checkpoint to trust, in :mod:`~datacentric.train.checkpoints.checkpoint_verify`; loading,
and the model's weights, in :mod:`~datacentric.train.checkpoints.checkpoint_load`. Every
public name this module held is still importable from it.
"""

from __future__ import annotations

from datacentric.train.checkpoints.checkpoint_folders import (
    MANIFEST,
    TRAINER_FILE,
    CheckpointError,
    checkpoint_dir,
    checkpoint_step,
    list_checkpoints,
    unfinished_saves,
)
from datacentric.train.checkpoints.checkpoint_load import (
    load_checkpoint,
    read_model_state,
    set_rng_state,
    weights_sha256,
)
from datacentric.train.checkpoints.checkpoint_save import (
    WRITE_LIMIT_ERRNOS,
    WRITE_LIMIT_TEXTS,
    PendingSave,
    rng_state,
    save_checkpoint,
    start_checkpoint,
)
from datacentric.train.checkpoints.checkpoint_verify import (
    find_checkpoint,
    latest_checkpoint,
    manifest_sha256,
    read_manifest,
    read_trainer_record,
    resolve_resume_from,
    verify_checkpoint,
)

#: every public name this module held before its parts moved (each the object of its home)
__all__ = [
    "CheckpointError",
    "MANIFEST",
    "PendingSave",
    "TRAINER_FILE",
    "WRITE_LIMIT_ERRNOS",
    "WRITE_LIMIT_TEXTS",
    "checkpoint_dir",
    "checkpoint_step",
    "find_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "manifest_sha256",
    "read_manifest",
    "read_model_state",
    "read_trainer_record",
    "resolve_resume_from",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "start_checkpoint",
    "unfinished_saves",
    "verify_checkpoint",
    "weights_sha256",
]
