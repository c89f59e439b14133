"""The unclear cases of the fifth reliability round, each one line naming the file and
the key or cause, exit status 2: a checkpoint whose ``trainer.json`` lacks its keys
(``inspect``), a ``manifest.json`` nested thousands deep, a LoRA resume over weights
saved without adapters, ``export`` of a run whose ``config.json`` has an unknown
section."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from run_config import SMALL_TRAIN_FLAGS, small_config

from datacentric.cli.main import main
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``datacentric ARGV`` in this process: (exit status, stderr lines but notes)."""
    status = main(argv)
    lines = capsys.readouterr().err.splitlines()
    return status, [ln for ln in lines if ln.strip() and "note:" not in ln]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    """A finished one-process run of 2 steps without LoRA, saved once (at its end: no
    earlier checkpoint to fall back on)."""
    out = tmp_path_factory.mktemp("full") / "run"
    train_rank(small_config(out, iterations=2, checkpoint_every=2))
    return out


@pytest.fixture
def run_copy(full_run, tmp_path) -> tuple[Path, Path]:
    """A copy of the run to alter, and its latest checkpoint."""
    out = shutil.copytree(full_run, tmp_path / "run", symlinks=True)
    return out, sorted((out / "checkpoints").glob("step-*"))[-1]


def rewrite(checkpoint: Path, name: str, text: str) -> Path:
    """Replace a checkpoint file and its SHA-256 in the manifest (a consistent edit)."""
    (checkpoint / name).write_text(text, encoding="utf-8")
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest[name] = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
    (checkpoint / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return checkpoint / name


@pytest.mark.parametrize("key", ["iterations_done", "world_size"])
def test_inspect_of_a_trainer_json_without_its_keys_names_file_and_key(run_copy, key, capsys):
    out, checkpoint = run_copy
    state = json.loads((checkpoint / "trainer.json").read_text())
    del state[key]
    trainer = rewrite(checkpoint, "trainer.json", json.dumps(state))
    status, err = run_cli(["inspect", str(out)], capsys)
    assert status == 2 and len(err) == 1, err
    assert f"{trainer}: no key {key!r}" in err[0] and "internal error" not in err[0], err


@pytest.mark.parametrize(("value", "kind"), [("many", "string"), ([1, 2], "array")])
def test_inspect_of_a_trainer_json_with_a_key_of_another_kind(run_copy, value, kind, capsys):
    out, checkpoint = run_copy
    state = json.loads((checkpoint / "trainer.json").read_text())
    state["samples_seen"] = value
    rewrite(checkpoint, "trainer.json", json.dumps(state))
    status, err = run_cli(["inspect", str(out)], capsys)
    assert status == 2 and len(err) == 1, err
    assert f"trainer.json: key 'samples_seen' holds a JSON {kind} (" in err[0], err


def test_a_deeply_nested_manifest_names_the_file(run_copy, capsys):
    out, checkpoint = run_copy
    (checkpoint / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    status, err = run_cli(["inspect", str(out)], capsys)
    assert status == 2 and len(err) == 1, err
    assert f"{checkpoint / 'manifest.json'}: the file is nested too deeply" in err[0], err
    assert "recursion" not in err[0], err


def test_a_lora_resume_over_weights_without_adapters_names_the_adapters(run_copy, capsys):
    """The checkpoint's settings say LoRA (altered, checksums kept consistent), its
    weights have no adapters: one line naming the first adapter tensor, no source line."""
    out, checkpoint = run_copy
    state = json.loads((checkpoint / "trainer.json").read_text())
    state["config"]["lora"]["rank"] = 2
    rewrite(checkpoint, "trainer.json", json.dumps(state))
    argv = ["train", "--out", str(tmp := out.parent / "resumed"), *SMALL_TRAIN_FLAGS]
    argv += ["--iterations", "3", "--resume-from", str(checkpoint), "--lora.rank", "2"]
    status, err = run_cli(argv, capsys)
    assert status == 2 and len(err) == 1, err
    assert f"{checkpoint / '.metadata'}: the checkpoint holds no tensor" in err[0], err
    assert ".lora_A" in err[0] and "saved without adapters" in err[0], err
    assert "raise " not in err[0] and not any(tmp.rglob("step-*")), err


def test_export_of_a_config_with_an_unknown_section_names_it(run_copy, capsys):
    out, _ = run_copy
    settings = json.loads((out / "config.json").read_text())
    settings["trainning"] = {"lr": 1.0}
    (out / "config.json").write_text(json.dumps(settings))
    status, err = run_cli(["export", str(out), "--out", str(out.parent / "exported")], capsys)
    assert status == 2 and len(err) == 1, err
    assert f"{out / 'config.json'}: unknown section 'trainning' (sections: job," in err[0], err
    assert not (out.parent / "exported").exists()


def _pipeline(folder: Path, class_name: object = "WanPipeline") -> Path:
    """A pipeline folder's model_index.json (the components' folders left to the test)."""
    folder.mkdir()
    index = {"_class_name": class_name, "_diffusers_version": "0.35.0"}
    index |= {"text_encoder": ["transformers", "UMT5EncoderModel"]}
    index |= {"vae": ["diffusers", "AutoencoderKLWan"]}
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_a_model_index_whose_class_name_is_a_list_names_file_and_key(tmp_path):
    from datacentric.models.diffusers_encode import PipelineError, read_model_index

    folder = _pipeline(tmp_path / "pipe", ["WanPipeline"])
    with pytest.raises(PipelineError, match="model_index.json: _class_name is \"\\['WanPip"):
        read_model_index(folder)


def test_a_pipeline_whose_text_encoder_is_pickle_only_is_refused_before_loading(tmp_path):
    from datacentric.models.diffusers_encode import PipelineError, read_model_index

    folder = _pipeline(tmp_path / "pipe")
    (folder / "text_encoder").mkdir()
    (folder / "text_encoder" / "config.json").write_text("{}")
    (folder / "text_encoder" / "pytorch_model.bin").write_bytes(b"a pickle")
    with pytest.raises(PipelineError) as refused:
        read_model_index(folder)
    line = str(refused.value)
    assert f"{folder / 'text_encoder'}: the text_encoder has only pickled weights" in line
    assert "pytorch_model.bin" in line and "weights_only" not in line, line
    (folder / "text_encoder" / "model.safetensors").write_bytes(b"")  # safetensors: read
    assert read_model_index(folder)["_class_name"] == "WanPipeline"


def test_validation_on_the_training_set_itself_is_noted(tmp_path):
    from datacentric.settings.sections import DataConfig, ValidationConfig
    from datacentric.train.validation.held_out import training_set_note

    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "a"}\n')
    (tmp_path / "link.jsonl").symlink_to(docs)
    (tmp_path / "other.jsonl").write_text('{"text": "b"}\n')
    data = DataConfig(dataset=f"jsonl:{docs}")

    def note(held: object) -> str | None:
        return training_set_note(data, ValidationConfig(dataset=held))

    for same in (f"jsonl:{docs}", f"jsonl:{tmp_path}/./docs.jsonl", f"jsonl:{tmp_path}/link.jsonl"):
        assert "is the training set itself" in note(same), same
    for other in (None, "split=0.1", f"jsonl:{tmp_path / 'other.jsonl'}", f"parquet:{docs}"):
        assert note(other) is None, other
    dataset = object()
    assert training_set_note(DataConfig(dataset=dataset), ValidationConfig(dataset=dataset))


def test_train_with_the_training_set_as_validation_set_trains_with_a_note(tmp_path, capsys):
    argv = ["train", "--out", str(tmp_path / "run"), *SMALL_TRAIN_FLAGS, "--iterations", "1"]
    argv += ["--validation.dataset", "stdlib", "--validation.every", "1", "--validation.limit", "2"]
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 0, err
    assert "note: validation.dataset stdlib is the training set itself" in err, err
