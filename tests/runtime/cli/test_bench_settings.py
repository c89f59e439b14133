"""``bench`` takes a section's settings in every spelling ``train`` takes them in: the
section flag (``--lora.rank``), its short alias (``--lora-rank``) and the key in a
``--config`` file (``[lora] rank``), and drops none of its settings flags."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pytest

from datacentric.cli.bench import bench_config
from datacentric.cli.flags import apply_config_file
from datacentric.cli.main import build_parser
from datacentric.settings import TrainConfig


def bench_settings(*argv: str) -> TrainConfig:
    """The settings ``datacentric bench ARGV`` starts its runs from (nothing is run)."""
    args: argparse.Namespace = build_parser().parse_args(["bench", *argv])
    apply_config_file(args)
    return bench_config(args)


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bench.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "spelling",
    ["--lora.rank", "--lora-rank", "[lora] rank", "lora_rank (an old flat file)"],
)
def test_every_spelling_of_a_key_reaches_bench_s_settings(spelling: str, tmp_path: Path) -> None:
    if spelling.startswith("--"):
        argv = [spelling, "4", "--data.max_tokens" if "." in spelling else "--max-tokens", "96"]
    elif spelling.startswith("["):
        argv = ["--config", config_file(tmp_path, "[lora]\nrank = 4\n[data]\nmax_tokens = 96\n")]
    else:
        argv = ["--config", config_file(tmp_path, "lora_rank = 4\nmax_tokens = 96\n")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the flat file's, if it warns
        settings = bench_settings(*argv)
    assert settings.lora.rank == 4
    assert settings.data.max_tokens == 96


def test_bench_keeps_its_own_defaults_and_every_settings_flag(tmp_path: Path) -> None:
    plain = bench_settings()
    assert plain.lora.rank == 0 and plain.data.dataset_limit == 12  # bench's own default
    assert plain.cost.memory_gb == pytest.approx(0.2)
    given = bench_settings(
        "--model-arg",
        "hidden_size=64",
        "--dataset-limit",
        "3",
        "--memory-gb",
        "0.5",
        "--world",
        "3",
        "--out",
        str(tmp_path / "runs"),
    )
    assert given.model.model_args == ("hidden_size=64",)
    assert given.data.dataset_limit == 3 and given.cost.memory_gb == pytest.approx(0.5)
    assert given.parallelism.world == 3 and given.job.out == str(tmp_path / "runs")
    # a flag wins over the file
    path = config_file(tmp_path, "[lora]\nrank = 4\n")
    assert bench_settings("--config", path, "--lora.rank", "8").lora.rank == 8


def test_a_sample_longer_than_bench_s_global_batch_is_refused_naming_bench_s_flag(
    capsys, monkeypatch
) -> None:
    """Bench's global batch (16,384 tokens, its own: no flag or ``--config`` key sets it)
    below its longest sample was refused naming ``--global-batch-tokens``, a flag bench
    does not take; the refusal names ``--max-tokens``, which bench takes."""
    from datacentric.cli.precheck import check_dataset

    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    settings = bench_settings("--max-tokens", "32768", "--dataset-limit", "40")
    assert check_dataset(settings, "bench") is None
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("datacentric bench: bench's global batch of 16,384 tokens ")
    assert "--global-batch-tokens" not in line
    assert line.endswith("give --max-tokens 16384 or less")
