"""``datacentric.train.trainer`` keeps every name it had before one step and the resume,
saves and stop notes moved to modules beside it, each the very object of its new home,
and the trainer still answers every method it had from the base that now defines it."""

from __future__ import annotations

import importlib

import pytest
from moved_names import assert_given_as_defined

from datacentric.train.trainer import Trainer
from datacentric.train.trainer_saves import TrainerSaves
from datacentric.train.trainer_step import TrainerStep

PACKAGE = "datacentric.train"
#: each public name ``trainer`` held that moved, and where it lives now
HOMES = {"NonFiniteLossError": "trainer_step"}
#: the public names ``trainer`` still defines: the run, its result and its entry points
KEPT = ["TrainResult", "Trainer", "steps_text", "train_rank", "train_rank_in_locked_folder"]
#: the methods of :class:`Trainer` that moved, by the base that defines them
METHODS = {
    TrainerStep: ["_autocast", "_maybe_inject_fault", "_step", "_forward_backward"],
    TrainerSaves: ["_resume", "_stop_note", "_lost_note", "_save", "_maybe_stop_in_save"],
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_trainer_still_gives_each_name_as_its_new_home_defines_it(name):
    assert_given_as_defined(f"{PACKAGE}.trainer", f"{PACKAGE}.{HOMES[name]}", name)


def test_trainer_lists_exactly_those_names_and_defines_its_own():
    trainer = importlib.import_module(f"{PACKAGE}.trainer")
    assert sorted(trainer.__all__) == sorted([*HOMES, *KEPT])
    for name in KEPT:
        assert getattr(trainer, name).__module__ == trainer.__name__


@pytest.mark.parametrize("base", list(METHODS), ids=lambda base: base.__name__)
def test_the_trainer_answers_each_moved_method_from_its_base(base):
    for name in METHODS[base]:
        assert getattr(Trainer, name) is vars(base)[name], name
        assert name not in vars(Trainer), name
