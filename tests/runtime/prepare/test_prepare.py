"""``prepare`` on a tiny Wan pipeline saved from configs: every latent is the pipeline
VAE's own encoding of the decoded frames as its ``video_processor`` preprocesses them,
every text file its own ``encode_prompt``; the output trains and exports; a killed run
resumes to the same bytes; bad files are skipped and named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_here import cli_here, cli_json_here
from prepare_media import decoded_frames, save_wan_pipeline, write_media
from repo_paths import ROOT

pytest.importorskip("diffusers")
pytest.importorskip("av")

from safetensors.torch import load_file  # noqa: E402

from datacentric.cli.main import main  # noqa: E402
from datacentric.prepare import PrepareJob, prepare  # noqa: E402

#: (file, frames, height, width, caption): three sizes and lengths (one cropped to
#: whole 16-pixel patches, one longer than the VAE's 4k + 1), then an empty caption
CLIPS = [
    ("big.mp4", 17, 64, 64, "a cat walks on the grass under blue sky"),
    ("wide.mp4", 9, 48, 80, "red car drives past green trees"),
    ("odd.mp4", 14, 50, 70, "the sun sets over hills"),
    ("quiet.mp4", 5, 32, 32, ""),
]
#: what each good clip becomes: (frames kept, height, width)
EXPECTED = {"big.mp4": (17, 64, 64), "wide.mp4": (9, 48, 80), "odd.mp4": (13, 48, 64)}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """The pipeline, the media (with a corrupt file) and a world-2 ``prepare`` of them."""
    root = tmp_path_factory.mktemp("prepare")
    pipe_dir = save_wan_pipeline(root / "pipe")
    listing = write_media(root / "media", CLIPS)
    (root / "media" / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(600))
    with open(listing, "a", encoding="utf-8") as handle:
        handle.write("broken.mp4,birds flying near water\n")
    job = PrepareJob(pipeline=str(pipe_dir), media=str(listing), out=str(root / "out"), world=2)
    report = prepare(job)
    return {"root": root, "pipe": pipe_dir, "media": listing, "out": root / "out", "report": report}


def _pixels(pipe, prepared: dict, entry: dict) -> torch.Tensor:
    """A manifest entry's clip as the pipeline's ``video_processor`` preprocesses it."""
    frames, height, width = EXPECTED[entry["source"]]
    video = decoded_frames(prepared["media"].parent / entry["source"])[:frames]
    return pipe.video_processor.preprocess_video(
        video, height=height, width=width, resize_mode="crop"
    )


def test_latents_and_text_equal_the_pipelines_own_encoding(prepared):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(prepared["pipe"], local_files_only=True)
    lines = (prepared["out"] / "manifest.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert [e["source"] for e in entries] == list(EXPECTED)
    vae = pipe.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    for entry in entries:
        frames, height, width = EXPECTED[entry["source"]]
        with torch.no_grad():
            z = vae.encode(_pixels(pipe, prepared, entry)).latent_dist.mode()
            text = pipe.encode_prompt(
                entry["caption"], do_classifier_free_guidance=False, max_sequence_length=512
            )[0][0]
        want = ((z - mean) / std)[0].permute(1, 0, 2, 3)
        got = load_file(prepared["out"] / entry["latent"])["latent"]
        assert got.shape == (1 + (frames - 1) // 4, 4, height // 8, width // 8)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        got_text = load_file(prepared["out"] / entry["text"])["text"]
        torch.testing.assert_close(got_text, text, rtol=0, atol=1e-5)
        assert got_text.shape == (512, 32) and got_text[20:].abs().max() == 0  # padding


def test_report_names_skipped_files_and_balances_ranks(prepared):
    report = json.loads((prepared["out"] / "prepare_report.json").read_text())
    assert report == prepared["report"]
    reasons = {s["source"]: s["reason"] for s in report["skipped_files"]}
    assert report["skipped"] == 2 and set(reasons) == {"quiet.mp4", "broken.mp4"}
    assert reasons["quiet.mp4"] == "empty caption"
    assert reasons["broken.mp4"].startswith("corrupt")
    costs = [r["assigned_cost"] for r in report["ranks"]]
    # 17x64x64 alone on one rank; 9x48x80 and 13x48x64 on the other
    assert sorted(costs) == [17 * 64 * 64, 9 * 48 * 80 + 13 * 48 * 64]
    assert (max(costs) - min(costs)) / max(costs) <= 0.2
    assert report["cost_imbalance"] == pytest.approx(1 - min(costs) / max(costs), abs=1e-4)
    assert all(r["seconds"] > 0 for r in report["ranks"]) and report["encoded"] == 3


def test_the_empty_prompt_is_the_pipelines_own_and_a_rerun_adds_it(prepared):
    """What ``[training] caption_dropout`` trains a dropped caption on: the pipeline's
    ``encode_prompt("")``; a folder prepared before the file existed gets it (and only
    it) from a rerun with the same settings, which then trains with caption dropout."""
    from diffusers import WanPipeline

    from datacentric.data.diffusion_draws import DiffusionDraws
    from datacentric.data.latents import LatentDataset

    pipe = WanPipeline.from_pretrained(prepared["pipe"], local_files_only=True)
    with torch.no_grad():
        want = pipe.encode_prompt("", do_classifier_free_guidance=False, max_sequence_length=512)
    path = prepared["out"] / "empty_prompt.text.safetensors"
    got = load_file(path)["text"]
    torch.testing.assert_close(got, want[0][0], rtol=0, atol=1e-5)
    assert got.shape == (512, 32)
    old = prepared["root"] / "before"  # a copy of the folder as it was made before
    subprocess.run(["cp", "-a", str(prepared["out"]), str(old)], check=True)
    (old / path.name).unlink()
    draws = DiffusionDraws(caption_dropout=0.5)
    with pytest.raises(Exception, match="rerun datacentric prepare with the same settings"):
        LatentDataset(str(old), draws=draws)
    stamps = {p: p.stat().st_mtime_ns for p in (old / "latents").iterdir()}
    again = prepare(
        PrepareJob(pipeline=str(prepared["pipe"]), media=str(prepared["media"]), out=str(old))
    )
    assert again["encoded"] == 0 and again["samples"] == 3
    assert stamps == {p: p.stat().st_mtime_ns for p in (old / "latents").iterdir()}
    assert (old / path.name).read_bytes() == path.read_bytes()
    assert LatentDataset(str(old), draws=draws).empty_prompt == old / path.name


def test_latent_dist_sample_stores_the_vaes_mean_and_log_variance(prepared):
    """``--latent-dist sample``: each latent file is the VAE's normalised mean (the mode
    files' values), its ``logvar`` file the VAE's log-variance in the same units
    (``+ 2 log(1 / latents_std)``); the folder's settings refuse a mode rerun."""
    from diffusers import WanPipeline

    from datacentric.data.base import DataError
    from datacentric.data.latents import LatentDataset

    out = prepared["root"] / "sampled"
    job = PrepareJob(
        pipeline=str(prepared["pipe"]),
        media=str(prepared["media"]),
        out=str(out),
        latent_dist="sample",
    )
    assert prepare(job)["samples"] == 3
    pipe = WanPipeline.from_pretrained(prepared["pipe"], local_files_only=True)
    vae = pipe.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    for entry in entries:
        with torch.no_grad():
            dist = vae.encode(_pixels(pipe, prepared, entry)).latent_dist
        want_mean = ((dist.mean - mean) / std)[0].permute(1, 0, 2, 3)
        want_logvar = (dist.logvar - 2 * torch.log(std))[0].permute(1, 0, 2, 3)
        got = load_file(out / entry["latent"])["latent"]
        torch.testing.assert_close(got, want_mean, rtol=0, atol=1e-5)
        mode = load_file(prepared["out"] / entry["latent"])["latent"]
        torch.testing.assert_close(got, mode, rtol=0, atol=1e-6)
        logvar = load_file(out / entry["logvar"])["logvar"]
        torch.testing.assert_close(logvar, want_logvar, rtol=0, atol=1e-4)
    ds = LatentDataset(str(out))
    assert all(p is not None for p in ds.logvars)
    with pytest.raises(DataError, match=r"other settings: latent_dist \('sample' -> None\)"):
        prepare(
            PrepareJob(pipeline=str(prepared["pipe"]), media=str(prepared["media"]), out=str(out))
        )


def _encoded_records(out: Path) -> list[Path]:
    found = []
    for path in (out / ".prepare" / "records").glob("*.json"):
        try:
            if "shape" in json.loads(path.read_text()):
                found.append(path)
        except (OSError, ValueError):
            pass  # being renamed into place
    return found


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_bytes_and_a_rerun_encodes_nothing(prepared, capsys):
    out = prepared["root"] / "killed"
    args = ["prepare", "--pipeline", str(prepared["pipe"]), "--media", str(prepared["media"])]
    args += ["--out", str(out)]  # one rank: the reference ran two; the bytes are the same
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "datacentric.cli.main", *args]
    process = subprocess.Popen(command, env=env, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not _encoded_records(out) and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)  # mid-run: the first clip is recorded
    process.wait()
    assert not (out / "manifest.jsonl").exists()
    resumed = cli_json_here([*args, "--json"], capsys)  # the resume runs in this process
    assert resumed["already_done"] >= 1 and resumed["samples"] == 3
    reference = prepared["out"]
    names = sorted(p.name for p in (reference / "latents").iterdir())
    assert names == sorted(p.name for p in (out / "latents").iterdir())
    for name in [*(f"latents/{n}" for n in names), "manifest.jsonl"]:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    stamps = {p: p.stat().st_mtime_ns for p in (out / "latents").iterdir()}
    again = prepare(
        PrepareJob(pipeline=str(prepared["pipe"]), media=str(prepared["media"]), out=str(out))
    )
    # already done: the 3 samples encoded before (not the 2 skipped clips)
    assert again["encoded"] == 0 and again["already_done"] == 3 and again["samples"] == 3
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "latents").iterdir()}


def test_a_rerun_with_nothing_to_do_starts_no_rank(prepared, capsys, monkeypatch):
    """Every clip recorded at this reading and these settings: a rerun at world 2 says
    what it found done in one line and writes the same report and manifest, without
    starting its ranks or saying that it loads the pipeline (before: two ranks spawned,
    10-14 s on this machine, after 'loading the pipeline first')."""
    import datacentric.prepare.run as prepare_run

    out = prepared["root"] / "rerun"
    subprocess.run(["cp", "-a", str(prepared["out"]), str(out)], check=True)
    started, launch = [], prepare_run.launch
    monkeypatch.setattr(prepare_run, "launch", lambda *a, **k: started.append(k) or launch(*a, **k))
    argv = ["prepare", "--pipeline", str(prepared["pipe"]), "--media", str(prepared["media"])]
    status, stdout, stderr = cli_here([*argv, "--out", str(out), "--world", "2"], capsys)
    assert status == 0, stderr
    assert started == []
    assert "loading the pipeline" not in stdout + stderr
    done = [line for line in stderr.splitlines() if "nothing to encode" in line]
    assert len(done) == 1 and "5 clips" in done[0] and str(out) in done[0], stderr
    first = prepared["report"]
    ranks = [{**r, "encoded": 0, "already_done": r["encoded"]} for r in first["ranks"]]
    want = {**first, "encoded": 0, "already_done": 3, "earlier_media": first["media"]}
    report = json.loads((out / "prepare_report.json").read_text())
    untimed = [{**r, "seconds": None} for r in report["ranks"]]
    assert {**report, "ranks": untimed} == {
        **want,
        "ranks": [{**r, "seconds": None} for r in ranks],
    }
    assert (out / "manifest.jsonl").read_bytes() == (
        prepared["out"] / "manifest.jsonl"
    ).read_bytes()


@pytest.mark.slow
def test_train_on_prepared_latents_then_export_the_pipeline(prepared, capsys):
    """Both commands run in this process (the training's ranks are spawned from it)."""
    from diffusers import WanPipeline

    run, exported = prepared["root"] / "run", prepared["root"] / "exported"
    summary = cli_json_here([
        "train", "--model", f"diffusers:{prepared['pipe']}", "--dataset",
        f"latents:{prepared['out']}", "--world", "2", "--iterations", "3",
        "--training.lr", "1e-2", "--cost-model", "analytic", "--no-progress",
        "--out", str(run), "--json",
    ], capsys)  # fmt: skip
    assert summary["samples_seen"] == 3  # one epoch: 3 steps of one latent each
    cli_json_here(["export", str(run), "--out", str(exported), "--json"], capsys)
    pipe = WanPipeline.from_pretrained(exported, local_files_only=True)
    from datacentric.train.checkpoints.checkpoint_load import read_model_state
    from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint

    state = read_model_state(latest_checkpoint(run))
    trained = {k.removeprefix("transformer."): v for k, v in state.items()}
    before = WanPipeline.from_pretrained(prepared["pipe"], local_files_only=True).transformer
    moved = 0
    for name, value in pipe.transformer.state_dict().items():
        torch.testing.assert_close(value, trained[name], rtol=0, atol=0)
        moved += not torch.equal(value, before.state_dict()[name])
    assert moved > 0  # the exported transformer is the trained one, not the original


def test_bad_input_is_one_line_and_exit_2(prepared, capsys, tmp_path):
    argv = ["prepare", "--pipeline", str(tmp_path), "--media", str(prepared["media"])]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "model_index.json" in err[0] and err[0].startswith("datacentric prepare")
    )
    argv = ["prepare", "--pipeline", str(prepared["pipe"]), "--media", str(tmp_path / "none.csv")]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0]
    other = PrepareJob(
        pipeline=str(prepared["pipe"]), media=str(prepared["media"]), out=str(prepared["out"]),
        caption_rule="skip",
    )  # fmt: skip
    with pytest.raises(ValueError, match="other settings"):
        prepare(other)
