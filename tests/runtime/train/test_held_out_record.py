"""``--validation.dataset split=F`` writes the samples it held out of training into the
run folder (``validation/held_out.jsonl``: sample id, source file, whether the held-out
loss reads it), the same ids :func:`split_ids` draws from the seed."""

from __future__ import annotations

import json

import pytest
import torch
from cli_here import cli_here

from datacentric.data.holdout import held_out_records, split_ids
from datacentric.data.latents import LatentDataset
from datacentric.data.stdlib import StdlibCorpus
from datacentric.settings.sections import DataConfig, ValidationConfig
from datacentric.train.validation.held_out import build_run_data

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")


def _prepared(folder, count: int = 8) -> str:
    """``count`` Wan latents listed by a manifest as ``prepare`` writes it (``source``:
    the clip each came from)."""
    from safetensors.torch import save_file

    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    lines = []
    for i in range(count):
        latent, text = torch.randn(1, 4, 4, 4, generator=generator), torch.randn(5, 32)
        save_file({"latent": latent}, str(folder / f"c{i}.safetensors"))
        save_file({"text": text}, str(folder / f"c{i}.text.safetensors"))
        line = {"latent": f"c{i}.safetensors", "text": f"c{i}.text.safetensors"}
        lines.append(json.dumps({**line, "source": f"clips/clip{i}.mp4", "caption": "x"}))
    (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder)


def test_the_records_name_every_held_out_sample_and_its_source(tmp_path):
    folder = _prepared(tmp_path / "latents")
    data = DataConfig(dataset=f"latents:{folder}")
    train, held = build_run_data(data, ValidationConfig(dataset="split=0.25", limit=1), 5)
    records = held_out_records(train, held)
    ids = split_ids(8, 0.25, 5)[1]
    assert [r["sample"] for r in records] == ids and len(ids) == 2
    assert [r["source"] for r in records] == [f"clips/clip{i}.mp4" for i in ids]
    assert [r["validated"] for r in records] == [True, False]  # limit 1: the first only
    # another held-out dataset is no split: nothing to record
    corpus = StdlibCorpus(max_tokens=64, limit=2)
    assert held_out_records(corpus, corpus) is None
    # a folder without a manifest names each latent file
    (tmp_path / "latents" / "manifest.jsonl").unlink()
    assert LatentDataset(folder).sample_source(0).endswith("c0.safetensors")


def test_a_split_run_writes_its_held_out_samples(tmp_path, capsys):
    folder = _prepared(tmp_path / "latents")
    out = tmp_path / "run"
    argv = ["train", "--model", "diffusers:wan", "--model-arg", "num_attention_heads=2"]
    argv += ["--dataset", f"latents:{folder}", "--validation.dataset", "split=0.25"]
    argv += ["--seed", "5", "--iterations", "1", "--cost-model", "analytic", "--out", str(out)]
    argv += ["--no-progress", "--no-plots", "--no-tensorboard"]
    status, _, err = cli_here(argv, capsys)
    assert status == 0, err
    lines = (out / "validation" / "held_out.jsonl").read_text().splitlines()
    ids = split_ids(8, 0.25, 5)[1]
    assert [json.loads(line) for line in lines] == [
        {"sample": i, "source": f"clips/clip{i}.mp4", "validated": True} for i in ids
    ]
