"""The global batch the library sizes trains, and a user's batch that cannot is refused
before ranks start: 13 latents on a 2-head Wan transformer at world 4 (groups of at most
2 ranks, so 2 samples a step)."""

from __future__ import annotations

import json

import pytest
import torch
from cli_here import cli_here

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

WAN = ["--model", "diffusers:wan", "--model-arg", "num_attention_heads=2"]
RUN = ["--world", "4", "--cost-model", "analytic", "--iterations", "2", "--no-progress"]
RUN += ["--no-plots", "--no-tensorboard"]


def _latents(folder, count: int = 13) -> str:
    """``count`` Wan latents (4 channels) of mixed sizes, each with its text rows."""
    from safetensors.torch import save_file

    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        shape = (1 + i % 3, 4, 2 * (2 + i % 3), 2 * (2 + (i * 7) % 4))
        latent = torch.randn(*shape, generator=generator)
        save_file({"latent": latent}, str(folder / f"c{i:02d}.safetensors"))
        text = torch.randn(5, 32, generator=generator)
        save_file({"latent": text}, str(folder / f"c{i:02d}.text.safetensors"))
    return f"latents:{folder}"


def test_a_users_batch_that_leaves_a_group_without_a_sample_is_refused(tmp_path, capsys):
    data = _latents(tmp_path / "latents")
    out = tmp_path / "run"
    argv = ["train", *WAN, "--dataset", data, *RUN, "--out", str(out)]
    status, _, err = cli_here([*argv, "--global-batch-tokens", "60"], capsys)
    assert status == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("datacentric train: --global-batch-tokens 60: step ")
    assert "groups of at most 2" in line and "give --global-batch-tokens 142 or more" in line
    status, _, err = cli_here([*argv, "--global-batch-tokens", "20"], capsys)
    assert status == 2 and "smaller than the longest sample (60 tokens)" in err
    assert not (out / "config.json").exists()  # no rank started


@pytest.mark.slow
def test_the_batch_the_library_sizes_trains_at_world_4(tmp_path, capsys):
    """No batch flag: the data alone sized 60 tokens (a step of one sample, which four
    ranks in groups of two cannot share); the sized batch trains and is recorded."""
    data = _latents(tmp_path / "latents")
    out = tmp_path / "run"
    status, _, err = cli_here(["train", *WAN, "--dataset", data, *RUN, "--out", str(out)], capsys)
    assert status == 0, err
    assert "global batch sized to 142 tokens" in err and "holds 2 samples" in err
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["scheduling"]["global_batch_tokens"] == 142


def test_a_held_out_sample_longer_than_the_sized_batch_validates(tmp_path, capsys):
    """The held-out set's one pass is cut by the run's global batch raised to cover its
    samples: a held-out document of 40 tokens, 20 training ones of 10 (sized: 25
    tokens), was refused ('give at least 40', a batch that would change training's
    steps); it now validates, and training keeps its sized batch and steps."""
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"text": "abcdefghij"}) + "\n" for _ in range(20)))
    held.write_text(json.dumps({"text": "x" * 40}) + "\n")
    argv = ["train", "--dataset", f"jsonl:{train}", "--validation.dataset", f"jsonl:{held}"]
    argv += ["--cost-model", "analytic", "--iterations", "2", "--no-progress", "--no-plots"]
    out = tmp_path / "run"
    status, _, err = cli_here([*argv, "--no-tensorboard", "--out", str(out)], capsys)
    assert status == 0, err
    assert "global batch sized to 25 tokens" in err
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["scheduling"]["global_batch_tokens"] == 25
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1], records
    assert "val_loss" not in records[0] and 0 < records[1]["val_loss"] < 10, records
