"""The note that ``training.iterations`` overrides ``training.epochs`` reads as the
command's other notes: ``datacentric train: note: ...``."""

from __future__ import annotations

import logging

import pytest

from datacentric.settings.sections import TrainingConfig
from datacentric.train.lr_schedule import planned_total


@pytest.mark.parametrize(("iterations", "level"), [(1, logging.INFO), (9, logging.WARNING)])
def test_the_iterations_note_names_the_command_as_its_other_notes(iterations, level, caplog):
    """The note began ``note:`` alone, under the first line's ``datacentric train: note:``."""
    training = TrainingConfig(iterations=iterations, epochs=1)
    with caplog.at_level(logging.INFO, logger="datacentric"):
        assert planned_total(training, 6, note=True) == iterations
    (record,) = [r for r in caplog.records if "training.iterations" in r.getMessage()]
    assert record.levelno == level
    assert record.getMessage() == (
        f"datacentric train: note: training.iterations {iterations} sets the step count over "
        f"training.epochs 1 (6 steps per epoch): {iterations / 6:.3g} epochs of data"
    )


def test_no_note_where_the_iterations_are_the_epochs_steps(caplog):
    with caplog.at_level(logging.INFO, logger="datacentric"):
        assert planned_total(TrainingConfig(iterations=6, epochs=1), 6, note=True) == 6
    assert "training.iterations" not in caplog.text
