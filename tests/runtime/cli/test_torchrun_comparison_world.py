"""Under torchrun without ``--world``, ``bench`` and ``demo`` run on torchrun's world
(their own default of 2 ranks was refused as if given), and ``prepare``'s first line
counts torchrun's ranks. Simulated torchrun environment; each case stops before any
rank starts."""

from __future__ import annotations

import pytest

from datacentric.cli.main import main

TORCHRUN_ENV = dict(
    RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500"
)


@pytest.fixture
def torchrun(monkeypatch):
    """torchrun's environment of 4 ranks, with no marker folder (every line said)."""
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)


def _stop_at_precheck(monkeypatch) -> list[int | None]:
    """Stop ``bench`` at its check before ranks, recording the settings' world."""
    worlds: list[int | None] = []

    def precheck(config, command):
        worlds.append(config.parallelism.world)
        return None

    monkeypatch.setattr("datacentric.cli.bench.check_dataset", precheck)
    return worlds


@pytest.mark.parametrize(
    ("flags", "world"), [([], 4), (["--world", "4"], 4), (["--world", "3"], 3)]
)
def test_bench_under_torchrun_takes_torchrun_s_world(
    flags, world, torchrun, monkeypatch, tmp_path, capsys
):
    """Without --world, bench filled in its default of 2 and was then refused ("--world
    2 under torchrun (WORLD_SIZE=4) ...: drop --world"); now its settings' world, for
    the check before ranks, is torchrun's 4. A --world given is kept (one that differs
    is refused when the ranks start, as before)."""
    worlds = _stop_at_precheck(monkeypatch)
    assert main(["bench", "--out", str(tmp_path / "bench"), *flags]) == 2
    assert worlds == [world]
    err = capsys.readouterr().err
    assert f", {world} gloo ranks, " in err and "drop --world" not in err


def test_bench_outside_torchrun_keeps_its_default_of_two(monkeypatch, tmp_path, capsys):
    """Outside torchrun, bench without --world still runs on its own 2 ranks."""
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    worlds = _stop_at_precheck(monkeypatch)
    assert main(["bench", "--out", str(tmp_path / "bench")]) == 2
    assert worlds == [2]
    assert ", 2 gloo ranks, " in capsys.readouterr().err


def test_demo_under_torchrun_takes_torchrun_s_world(torchrun, monkeypatch, tmp_path, capsys):
    """Without --world, demo compared its policies on its default 2 ranks, refused under
    torchrun's 4; now its settings and its ranks are torchrun's 4."""
    seen: list[tuple[int | None, int]] = []

    def compare(config, policies, world, out, **options):
        seen.append((config.parallelism.world, world))
        raise ValueError("stopped before the ranks")

    monkeypatch.setattr(
        "datacentric.train.comparison.measured_comparison.compare_policies", compare
    )
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 2
    assert seen == [(4, 4)]
    out, err = capsys.readouterr()
    assert ", 4 gloo ranks, " in out and "drop --world" not in err


def test_prepare_s_start_line_counts_torchrun_s_ranks(torchrun, monkeypatch, tmp_path, capsys):
    """prepare's first line said "on 1 rank" under torchrun, whose 4 ranks encode."""

    def stop(job):
        raise ValueError("stopped before the pipeline")

    monkeypatch.setattr("datacentric.prepare.prepare", stop)
    pipeline = tmp_path / "pipeline"
    (pipeline / "vae").mkdir(parents=True)
    (pipeline / "model_index.json").write_text("{}", encoding="utf-8")
    media = tmp_path / "media"
    media.mkdir()
    (media / "a.png").write_bytes(b"")
    (media / "a.txt").write_text("a caption", encoding="utf-8")
    argv = ["prepare", "--pipeline", str(pipeline), "--media", str(media)]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert " on 4 ranks; " in out, (out, err)
