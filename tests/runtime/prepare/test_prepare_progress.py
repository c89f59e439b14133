"""``prepare``'s progress: each clip's line says a time left that holds from a fifth of
the work on (by encoding cost, the pipeline's loading and the first clip's warm-up left
out), and a ``prepare`` run from Python prints no loader bar of diffusers or
transformers."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest

from datacentric.data.latents import EMPTY_PROMPT
from datacentric.prepare import run as prepare_run


def seconds_of(text: str) -> float:
    """The seconds :func:`datacentric.progress.elapsed_text` wrote as ``text``."""
    parts = dict((unit, int(n)) for n, unit in re.findall(r"(\d+) (h|min|s)\b", text))
    return 3600 * parts.get("h", 0) + 60 * parts.get("min", 0) + parts.get("s", 0)


def test_each_clips_time_left_holds_from_a_fifth_of_the_work_on(tmp_path, monkeypatch, capsys):
    """40 clips of costs 10x apart, each encoding in 0.2 s plus its cost's time +-30%, the
    first one 6 s slower (a warm-up), after a 20 s pipeline load: from 20% of the work
    on, every line's time left is within 50% of the time the clips left really take.
    The former estimate (the time since the start, load included, over the cost done)
    is not."""
    rng = random.Random(1)
    now = [0.0]
    costs = [rng.choice([1, 2, 5, 10]) * 1000 for _ in range(40)]
    durations = [0.2 + c / 1000 * rng.uniform(0.7, 1.3) for c in costs]
    durations[0] += 6.0
    load_s = 20.0

    def encode(encoder, out, task, latent_dist):
        now[0] += durations[task.number]
        return {"shape": [1]}

    def load(*args, **kwargs):
        now[0] += load_s

    monkeypatch.setattr(prepare_run, "open_pipeline", load)
    monkeypatch.setattr(prepare_run, "PipelineEncoder", lambda pipe, **kwargs: object())
    monkeypatch.setattr(prepare_run, "_encode_one", encode)
    (tmp_path / prepare_run.STATE / "records").mkdir(parents=True)
    (tmp_path / EMPTY_PROMPT).write_bytes(b"")
    tasks = [
        SimpleNamespace(
            number=k, cost=c, plan=object(), rank=0, duplicate_of=None,
            item=SimpleNamespace(name=f"clip{k}", is_image=False), key=lambda k=k: {"clip": k},
        )
        for k, c in enumerate(costs)
    ]  # fmt: skip
    plan = SimpleNamespace(tasks=tasks, world=1, assigned_cost=[sum(costs)])
    job = SimpleNamespace(
        out=str(tmp_path), device="cpu", pipeline="pipe", max_text_tokens=None,
        vae_tiling=False, latent_dist="mode",
    )  # fmt: skip
    capsys.readouterr()
    prepare_run.encode_rank(job, plan, clock=lambda: now[0])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(costs)
    work = load_s + sum(durations)
    checked = old_misses = 0
    for k, line in enumerate(lines):
        said = re.fullmatch(r"prepare: (\d+)/40 clips, [\d.]+/s, (.+) left", line)
        assert said and int(said[1]) == k + 1, line
        at = load_s + sum(durations[: k + 1])
        actual = work - at
        if at >= 0.2 * work and actual > 0:
            left = seconds_of(said[2])
            assert abs(left - actual) <= 0.5 * actual + 1, (k, left, actual)
            checked += 1
            done = sum(costs[: k + 1])
            old = at * (sum(costs) - done) / done
            old_misses += abs(old - actual) > 0.5 * actual + 1
    assert checked >= 25 and old_misses > 0


def test_prepare_from_python_prints_no_loader_bar(tmp_path, monkeypatch, capfd):
    """A script's ``prepare(PrepareJob(...))`` (no command set the environment's
    switches): stderr holds ``prepare:`` lines only, and the libraries' switches are as
    they were after."""
    pytest.importorskip("diffusers")
    pytest.importorskip("av")
    import diffusers.utils.logging as diffusers_logs
    import transformers.utils.logging as transformers_logs
    from prepare_media import save_wan_pipeline, write_media

    from datacentric.log import QUIET_ENV
    from datacentric.prepare import PrepareJob, prepare

    pipe = save_wan_pipeline(tmp_path / "pipe")
    listing = write_media(tmp_path / "media", [("a.mp4", 5, 16, 16, "a cat")])
    for name in QUIET_ENV:
        monkeypatch.delenv(name, raising=False)
    for logs in (diffusers_logs, transformers_logs):
        logs.enable_progress_bar()
    capfd.readouterr()
    prepare(PrepareJob(pipeline=str(pipe), media=str(listing), out=str(tmp_path / "out")))
    err = capfd.readouterr().err
    assert err and all(line.startswith("prepare: ") for line in err.splitlines()), err
    assert diffusers_logs.is_progress_bar_enabled() and transformers_logs.is_progress_bar_enabled()
