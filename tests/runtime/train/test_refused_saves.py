"""A resumed run refused once its rebuilt schedule is found to differ from the saved one
has saved checkpoints of the steps that ran on it before: each is marked (its
``schedule-refused.json``, nothing deleted) and the next ``--resume`` passes over them to
the newest checkpoint before them, saying so in one line; ``--resume-from`` one of them
is used, with a note. While the schedule is unchecked, ``keep_last`` never prunes the
checkpoint the run resumed from (nor one before it); once it is checked equal, pruning
catches up. The build is held back on purpose, so no test reads a clock."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from run_config import small_config
from test_resumed_saves import GateAfterSave, watch_whole_builds
from test_resumed_stream import CHANGED
from test_streamed_schedule import HeldBack

from datacentric.scheduling import resume
from datacentric.scheduling.pipeline import Pipeline
from datacentric.settings.sections import CheckpointConfig
from datacentric.train.checkpoints.checkpoint_folders import (
    REFUSED_FILE,
    REFUSED_REASON,
    checkpoint_step,
    list_checkpoints,
)
from datacentric.train.checkpoints.checkpoint_verify import find_checkpoint
from datacentric.train.checkpoints.run_checkpoints import RunCheckpoints
from datacentric.train.reporting.metric_sinks import logger
from datacentric.train.trainer import Trainer, train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def heard(monkeypatch) -> None:
    """The run's notes reach ``caplog`` (a run's logging set up before keeps them apart)."""
    monkeypatch.setattr(logger, "propagate", True)


def refused_after_resume(out, monkeypatch, **limits) -> tuple[ValueError, int]:
    """A run of 2 steps saved each step; its resume (to step 6, saving each step) runs
    steps on a rebuilt schedule whose fingerprint differs, its build held until the
    step-3 checkpoint is complete: the refusal, and the last step saved before it.
    ``limits``: what both runs keep (``keep_last``)."""
    train_rank(small_config(out, iterations=2, checkpoint_every=1, **limits))
    gate = threading.Event()
    waited = watch_whole_builds(monkeypatch, gate)
    with monkeypatch.context() as changed:  # the schedule differs in this run alone
        stream = Pipeline.stream
        changed.setattr(
            Pipeline, "stream", lambda self, *a, **kw: HeldBack(stream(self, *a, **kw), gate, 2)
        )
        changed.setattr(resume, "schedule_fingerprint", lambda s: "0" * 32)
        again = small_config(out, iterations=6, checkpoint_every=1, resume=True, **limits)
        with pytest.raises(ValueError, match=CHANGED) as refused:
            Trainer(again, hooks=GateAfterSave(gate, waited, 3)).run()
    return refused.value, max(checkpoint_step(p) for p in list_checkpoints(out))


@pytest.mark.slow
def test_the_next_resume_passes_over_the_checkpoints_of_steps_run_on_a_refused_schedule(
    tmp_path, monkeypatch, caplog
):
    err, last = refused_after_resume(tmp_path, monkeypatch)
    assert 3 <= last < 6
    path, notice = find_checkpoint(tmp_path)  # what --resume loads: not the last step's
    assert path.name == "step-00000002"
    names = [f"step-{step:08d}" for step in range(3, last + 1)]
    for name in names:  # kept, and marked with the refusal
        record = json.loads((tmp_path / "checkpoints" / name / REFUSED_FILE).read_text())
        assert record["steps"][0] == 3 and "differs from the saved one" in record["refusal"]
    assert not (tmp_path / "checkpoints" / "step-00000002" / REFUSED_FILE).exists()
    said = names[0] if last == 3 else f"{names[0]} to {names[-1]} ({len(names)} checkpoints)"
    marked = f"saved after those steps: {said}, each now marked {REFUSED_FILE}, which --resume"
    assert str(err).endswith(f"{marked} passes over")
    assert f"passing over {said}, marked {REFUSED_FILE}" in notice
    assert f"names {names[-1]}, saved after steps that ran on a schedule found" in notice
    assert notice.endswith("using step-00000002, the newest valid checkpoint")
    heard(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="datacentric"):  # what --resume says
        assert RunCheckpoints(CheckpointConfig(resume=True), tmp_path).to_load(False) == path
    assert f"note: {notice}" in caplog.text
    # the schedule is back: the run resumes from step 2
    result = train_rank(small_config(tmp_path, iterations=6, checkpoint_every=1, resume=True))
    assert len(result.losses) == 4  # steps 3-6
    straight = train_rank(small_config(tmp_path / "straight", iterations=6))
    assert result.losses == straight.losses[2:]
    assert result.weights_sha256 == straight.weights_sha256


@pytest.mark.slow
def test_resume_from_a_marked_checkpoint_uses_it_and_says_so(tmp_path, monkeypatch, caplog):
    _, last = refused_after_resume(tmp_path, monkeypatch)
    named = RunCheckpoints(CheckpointConfig(resume_from=str(last)), tmp_path)
    heard(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="datacentric"):
        assert named.to_load(False).name == f"step-{last:08d}"
    said = f"{REFUSED_REASON} (its {REFUSED_FILE}); resuming from it as named"
    assert f"note: --resume-from step-{last:08d}: {said}" in caplog.text
    result = train_rank(small_config(tmp_path, iterations=last + 1, resume_from=str(last)))
    assert len(result.losses) == 1  # from the checkpoint named


class SavedBeside(GateAfterSave):
    """:class:`GateAfterSave` that also records the steps of the checkpoints in the run
    folder once each checkpoint is complete (after its pruning)."""

    def __init__(self, gate: threading.Event, waited: list, step: int, out) -> None:
        super().__init__(gate, waited, step)
        self.out, self.beside = out, {}

    def saved(self, step: int, folder) -> None:
        self.beside[step] = sorted(checkpoint_step(p) for p in list_checkpoints(self.out))
        super().saved(step, folder)


@pytest.mark.slow
def test_keep_last_keeps_the_resumed_checkpoint_through_a_refused_schedule(tmp_path, monkeypatch):
    err, last = refused_after_resume(tmp_path, monkeypatch, keep_last=1)
    steps = sorted(checkpoint_step(p) for p in list_checkpoints(tmp_path))
    assert steps == [2, last]  # the one resumed from, and the newest of the refused run
    assert f"saved after those steps: step-{last:08d}, each now marked" in str(err)
    path, _ = find_checkpoint(tmp_path)
    assert path.name == "step-00000002"
    again = small_config(tmp_path, iterations=6, checkpoint_every=1, keep_last=1, resume=True)
    result = train_rank(again)
    assert len(result.losses) == 4  # steps 3-6, from step 2
    straight = train_rank(small_config(tmp_path / "straight", iterations=6))
    assert result.weights_sha256 == straight.weights_sha256
    assert [checkpoint_step(p) for p in list_checkpoints(tmp_path)] == [6]  # caught up


@pytest.mark.slow
def test_keep_last_catches_up_once_the_resumed_schedule_is_checked_equal(tmp_path, monkeypatch):
    """The same resume on its own schedule: the step-3 checkpoint, saved before the
    schedule is checked, keeps step 2 beside it; the run ends with its last one alone."""
    train_rank(small_config(tmp_path, iterations=2, checkpoint_every=1, keep_last=1))
    gate = threading.Event()
    waited = watch_whole_builds(monkeypatch, gate)
    stream = Pipeline.stream
    monkeypatch.setattr(
        Pipeline, "stream", lambda self, *a, **kw: HeldBack(stream(self, *a, **kw), gate, 2)
    )
    hooks = SavedBeside(gate, waited, 3, tmp_path)
    again = small_config(tmp_path, iterations=6, checkpoint_every=1, keep_last=1, resume=True)
    result = Trainer(again, hooks=hooks).run()
    assert hooks.seen == 0 and hooks.beside[3] == [2, 3]  # saved unchecked: step 2 kept
    assert [checkpoint_step(p) for p in list_checkpoints(tmp_path)] == [6]
    assert result.checkpoint == "step-00000006"
