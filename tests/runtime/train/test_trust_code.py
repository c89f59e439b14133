"""Trust, round two: no code runs from a run or model folder (a factory only the folder
names, a model folder's ``auto_map``), and ``export`` never destroys what it did not write.
Each attack leaves a marker when it succeeds; each must be refused in one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT
from test_reliability_cases import run_cli, snapshot
from test_trust import rewrite_manifest
from test_trust_paths import copy_run, one_step_run, refused

from datacentric.models.source import build_model_named
from datacentric.train.checkpoints import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The one-step run, trained on one thread as the tests run (a module's fixture is set
    up before their ``one_thread``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return one_step_run(tmp_path_factory)
    finally:
        torch.set_num_threads(threads)


def set_model(run: Path, model: str, args: dict, *, checkpoint_too: bool = True) -> None:
    """What an attacker does: rename the run's model in config.json and (rewriting the
    manifest) in the checkpoint's trainer.json."""
    checkpoint = ckpt.latest_checkpoint(run)
    files = [run / "config.json"]
    if checkpoint_too:
        files.append(checkpoint / ckpt.TRAINER_FILE)
    for file in files:
        record = json.loads(file.read_text())
        settings = record.get("config", record)
        settings["model"].update(model=model, model_args=args)
        file.write_text(json.dumps(record))
    if checkpoint_too:
        rewrite_manifest(checkpoint)


def export(run: Path, out: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    return run_cli(["export", str(run), "--out", str(out), *extra], capsys)


# ---------------------------------------------------------------- factories


@pytest.mark.parametrize("checkpoint_too", [False, True])
def test_a_factory_named_only_by_the_run_folder_never_runs(
    trained, tmp_path, capsys, checkpoint_too
):
    run, _ = copy_run(trained, tmp_path)
    marker = tmp_path / "PWNED"
    set_model(run, "os:system", {"command": f"touch {marker}"}, checkpoint_too=checkpoint_too)
    status, err = export(run, tmp_path / "exported", capsys)
    if checkpoint_too:
        refused(status, err, "'os:system'", "pass --model os:system")
    else:  # the checkpoint (which its manifest covers) says llama
        refused(status, err, "config.json", "'os:system'", "'llama'")
    assert not marker.exists() and not (tmp_path / "exported").exists()


def test_export_checks_the_model_against_the_checkpoints_tensors(trained, tmp_path, capsys):
    run, _ = copy_run(trained, tmp_path)
    set_model(run, "dit", {})
    refused(*export(run, tmp_path / "exported", capsys), "does not hold model 'dit'", "lacks")
    status, err = export(run, tmp_path / "exported", capsys, "--model", "llama-7b")
    refused(status, err, "'llama-7b'", "in the model")
    assert not (tmp_path / "exported").exists()
    status, err = export(run, tmp_path / "exported", capsys, "--model", "llama", "--json")
    assert status == 0, err  # the user names the model the run trained


def test_export_pins_the_checkpoint(trained, tmp_path, capsys):
    run, checkpoint = copy_run(trained, tmp_path)
    status, err = export(run, tmp_path / "exported", capsys, "--expect-sha256", "0" * 64)
    refused(status, err, "manifest.json", "0" * 64)
    pin = ckpt.manifest_sha256(checkpoint)
    status, err = export(run, tmp_path / "exported", capsys, "--expect-sha256", pin)
    assert status == 0, err


# ---------------------------------------------------------------- export --out


def test_export_never_replaces_the_run_or_a_folder_it_did_not_write(trained, tmp_path, capsys):
    parent = tmp_path / "parent"
    parent.mkdir()
    run, _ = copy_run(trained, parent)
    (parent / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    for out, words in (
        (run, ("is the run folder",)),
        (parent, ("holds the run folder",)),
        (tmp_path, ("holds the run folder",)),
        (run / "checkpoints", ("no export wrote it",)),
    ):
        refused(*export(run, out, capsys, "--overwrite"), f"--out {out}", *words)
    assert snapshot(tmp_path) == before
    exported = tmp_path / "exported"
    assert export(run, exported, capsys)[0] == 0
    refused(*export(run, exported, capsys), "not empty", "--overwrite")
    first = snapshot(exported)
    status, err = export(run, exported, capsys, "--overwrite")
    assert status == 0 and snapshot(exported) == first, err  # an earlier export: replaced
    (exported / "notes.txt").write_text("mine")
    refused(*export(run, exported, capsys, "--overwrite"), "notes.txt", "nothing was deleted")
    assert (exported / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- model folders


def code_folder(folder: Path, model_type: str, marker: Path) -> Path:
    """A model folder whose auto_map names code that creates ``marker`` when imported."""
    from transformers import AutoConfig

    folder.mkdir()
    config = AutoConfig.for_model(
        "qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=300,
    ).to_dict()  # fmt: skip
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.Evil"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("stdin", ["y", "closed"])
def test_a_model_folder_that_needs_its_own_code_is_refused_without_a_prompt(tmp_path, stdin):
    marker = tmp_path / "PWNED"
    folder = code_folder(tmp_path / "model", "evilnet", marker)
    argv = [sys.executable, "-m", "datacentric", "train", "--model", f"hf:{folder}"]
    argv += ["--iterations", "1", "--dataset-limit", "2", "--out", str(tmp_path / "run")]
    done = subprocess.run(
        argv,
        input="y\n" if stdin == "y" else None,  # what a user answers transformers' prompt
        preexec_fn=(lambda: os.close(0)) if stdin == "closed" else None,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    ours = [ln for ln in done.stderr.splitlines() if ln.startswith("datacentric train: ")]
    assert done.returncode == 2 and len(ours) == 1, done.stderr
    assert "'evilnet'" in ours[0] and "auto_map" in ours[0] and "never runs" in ours[0]
    assert "[y/N]" not in done.stderr and "trust_remote_code" not in done.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_export_of_a_run_naming_such_a_folder_is_refused(trained, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    folder = code_folder(tmp_path / "model", "evilnet", marker)
    run, _ = copy_run(trained, tmp_path)
    set_model(run, f"hf:{folder}", {})
    refused(*export(run, tmp_path / "exported", capsys), "'evilnet'", "auto_map")
    assert not marker.exists() and not (tmp_path / "exported").exists()


def test_a_known_model_type_with_an_auto_map_loads_without_its_code(tmp_path):
    marker = tmp_path / "PWNED"
    folder = code_folder(tmp_path / "model", "qwen2", marker)
    model = build_model_named(f"hf:{folder}")
    assert type(model.hf).__module__.startswith("transformers.") and not marker.exists()


def test_a_mistyped_model_arg_or_a_corrupt_safetensors_file_is_named(tmp_path, capsys):
    out = str(tmp_path / "run")
    for model in ("llama", "hf:qwen2"):
        argv = ["train", "--model", model, "--model-arg", "hidden_size=abc", "--out", out]
        refused(*run_cli(argv, capsys), "hidden_size='abc'", "is int", "not str")
    assert not Path(out).exists()
    folder = code_folder(tmp_path / "model", "qwen2", tmp_path / "unused")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    argv = ["train", "--model", f"hf:{folder}", "--dataset-limit", "2", "--out", out]
    refused(*run_cli(argv, capsys), str(folder / "model.safetensors"), "not a readable")
