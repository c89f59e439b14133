"""A resume keeps the default global batch its run trained (a run given none), so that
its steps stay the uninterrupted run's; on a world whose groups a step of that batch
cannot fill, the resume is refused in one line naming a fix that works (fewer ranks, or
a new run), by train's check before the ranks start and by a trainer started without
it alike. Before, the check advised a larger ``--global-batch-tokens``, which the
resume's settings check refuses, and a trainer started without it did not check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from datacentric.settings import load_config
from datacentric.shapes import SampleShape
from datacentric.train.checkpoints import resume
from datacentric.train.trainer_saves import TrainerSaves

#: 20 samples of 100,000 tokens: the 1-rank default (262,144 tokens) holds 2 or 3 a step.
SHAPES = [SampleShape(100_000)] * 20

#: The trainer record of a checkpoint saved on 1 rank, the default batch it trained.
RECORD = {"global_batch_tokens": 2**18, "world_size": 1}

#: The refusal on 4 ranks whose model runs no SP (groups of 1 rank: 4 samples a step).
REFUSAL = (
    r"^--world 4: the resumed run trains a global batch of 262,144 tokens \(the default of "
    r"the world it started on, .*\), and a step of it holds fewer than the 4 samples 4 "
    r"ranks in groups of at most 1 \(the model's largest SP size\) need; resume on fewer "
    r"ranks \(--world 1, as it was saved\), or start a new run \(another --out or "
    r"--overwrite\)$"
)


def settings(out):
    return load_config(None, model="llama", dataset="stdlib", out=str(out), resume=True)


def to_train(config, *where):  # noqa: ANN001, ANN002, ANN201
    """train's global-batch step of ``config``'s sections (as its start-up check calls it)."""
    sections = (config.scheduling, config.training, config.job, config.checkpoint)
    return resume.global_batch_to_train(*sections, *where)


def test_train_s_check_refuses_a_kept_batch_this_world_cannot_fill(tmp_path, monkeypatch):
    monkeypatch.setattr(resume, "record_to_resume", lambda checkpoint, out: (out, RECORD))
    config = settings(tmp_path)
    kept = to_train(config, SHAPES, [1, 2], 2)  # groups of 2: it fits
    assert kept.tokens == 2**18 and "kept at 262,144 tokens" in kept.note
    with pytest.raises(ValueError, match=REFUSAL):
        to_train(config, SHAPES, [1], 4)


def test_a_trainer_started_without_that_check_refuses_it_too(tmp_path):
    config = settings(tmp_path)
    pipeline = SimpleNamespace(options=config.scheduling, sp_sizes=[1])
    trainer = SimpleNamespace(
        dc=SimpleNamespace(pipeline=pipeline),
        groups=SimpleNamespace(world_size=4),
        shapes=SHAPES,
        training=config.training,
        job=config.job,
        is_main=False,
        config=config,
        settings_json=config.to_json(),
    )
    with pytest.raises(ValueError, match=REFUSAL):
        TrainerSaves._keep_global_batch(trainer, RECORD)
    assert pipeline.options.global_batch_tokens is None  # nothing kept
    trainer.groups.world_size, pipeline.sp_sizes = 2, [1, 2]
    TrainerSaves._keep_global_batch(trainer, RECORD)
    assert pipeline.options.global_batch_tokens == 2**18
    # the run records it, as train's check puts it in the settings: config.toml and its
    # checkpoints' settings (before, they said no batch while the run trained this one)
    assert trainer.settings_json["scheduling"]["global_batch_tokens"] == 2**18


def test_a_resume_of_a_batch_sized_from_the_samples_says_so_not_that_a_default_was_kept(
    tmp_path, monkeypatch
):
    """A small dataset's run records the batch sized from its samples, which any world
    sizes alike: its resume says that, as a fresh start does. Before, every resume, on
    the same world too, said 'global batch kept at 2,524 tokens, the default the resumed
    run trained (1 rank would default to 262,144)'."""
    shapes = [SampleShape(1000 + i) for i in range(20)]  # 20,190 tokens: sized to 2,524
    record = {"global_batch_tokens": 2524, "world_size": 1}
    monkeypatch.setattr(resume, "record_to_resume", lambda checkpoint, out: (out, record))
    for world, sp_sizes in [(1, [1]), (2, [1, 2])]:
        batch = to_train(settings(tmp_path), shapes, sp_sizes, world)
        assert batch.tokens == 2524, batch
        assert batch.note.startswith("the dataset holds 20,190 tokens, fewer than 8 "), batch
