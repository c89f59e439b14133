"""``datacentric.train.checkpoints.checkpoint`` keeps every public name it had before its
four concerns moved to modules of their own, each the very object of its new home."""

from __future__ import annotations

import importlib

import pytest
from moved_names import assert_given_as_defined

#: each public name ``checkpoint`` held before the split, and where it lives now
HOMES = {
    "MANIFEST": "checkpoint_folders",
    "TRAINER_FILE": "checkpoint_folders",
    "CheckpointError": "checkpoint_folders",
    "checkpoint_step": "checkpoint_folders",
    "unfinished_saves": "checkpoint_folders",
    "list_checkpoints": "checkpoint_folders",
    "checkpoint_dir": "checkpoint_folders",
    "WRITE_LIMIT_ERRNOS": "checkpoint_save",
    "WRITE_LIMIT_TEXTS": "checkpoint_save",
    "rng_state": "checkpoint_save",
    "save_checkpoint": "checkpoint_save",
    "PendingSave": "checkpoint_save",
    "start_checkpoint": "checkpoint_save",
    "latest_checkpoint": "checkpoint_verify",
    "find_checkpoint": "checkpoint_verify",
    "resolve_resume_from": "checkpoint_verify",
    "manifest_sha256": "checkpoint_verify",
    "verify_checkpoint": "checkpoint_verify",
    "read_trainer_record": "checkpoint_verify",
    "read_manifest": "checkpoint_verify",
    "set_rng_state": "checkpoint_load",
    "load_checkpoint": "checkpoint_load",
    "weights_sha256": "checkpoint_load",
    "read_model_state": "checkpoint_load",
}
PACKAGE = "datacentric.train.checkpoints"


@pytest.mark.parametrize("name", sorted(HOMES))
def test_checkpoint_still_gives_each_name_as_its_new_home_defines_it(name):
    assert_given_as_defined(f"{PACKAGE}.checkpoint", f"{PACKAGE}.{HOMES[name]}", name)


def test_checkpoint_lists_exactly_those_names():
    checkpoint = importlib.import_module(f"{PACKAGE}.checkpoint")
    assert sorted(checkpoint.__all__) == sorted(HOMES)
