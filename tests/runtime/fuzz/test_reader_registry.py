"""Every function of the package that reads a file (found by an AST scan,
:mod:`reader_scan`) is reached by a fuzz target (:data:`READERS` names it), or is
left out for a reason written here; a new reader fails this test until it is fuzzed.
Planted faults show the scan and the fuzzing catch what they must: a new reader, an
unguarded ``json.loads`` and a CSV line ``split(",")``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from fuzz_inputs import fuzz
from fuzz_targets import TARGETS
from reader_scan import find_readers
from repo_paths import ROOT

PACKAGE = ROOT / "datacentric"
TARGET_NAMES = {t.name for t in TARGETS}


def fuzzed(*targets: str) -> tuple[str, ...]:
    return targets


def left_out(reason: str) -> str:
    return reason


#: Each reader: the fuzz targets whose reads reach it, or why none does.
READERS: dict[str, tuple[str, ...] | str] = {
    "datacentric.data.bucket_config:BucketConfig.load": fuzzed("bucket config"),
    "datacentric.data.documents:_jsonl": fuzzed("text jsonl", "chat jsonl"),
    "datacentric.data.documents:_parquet": fuzzed("parquet"),
    "datacentric.data.documents:_text": fuzzed("plain text"),
    "datacentric.data.latent_files:_npy_header": fuzzed("latent npy", "latent manifest"),
    "datacentric.data.latent_files:_safetensors_header": fuzzed("latent safetensors"),
    "datacentric.data.latent_files:_pt_tensor": fuzzed("latent pt"),
    "datacentric.data.latent_files:open_latent": fuzzed("latent npy", "latent safetensors"),
    "datacentric.data.latent_files:read_latent_listing": fuzzed(
        "latent manifest", "earlier prepare"
    ),
    "datacentric.prepare.run:_earlier_run": fuzzed("earlier prepare"),
    "datacentric.data.media_boxes:_meta": fuzzed("heif boxes"),
    "datacentric.data.media_sources:_csv_rows": fuzzed("media csv"),
    "datacentric.data.media_sources:_rows": fuzzed("media csv", "media jsonl"),
    "datacentric.data.media_sources:_caption_file": fuzzed("caption txt"),
    "datacentric.data.prompts:read_prompts": fuzzed("prompts"),
    "datacentric.data.text_file:read_text_file": fuzzed("media csv", "prompts", "caption txt"),
    "datacentric.data.text_file:text_utf8": fuzzed("plain text"),
    "datacentric.data.tokenizer_files:tokenizer_digest": fuzzed("tokenizer.json", "chat template"),
    "datacentric.models.diffusers_build:read_model_config": fuzzed("diffusers config.json"),
    "datacentric.models.hf:check_weight_files": fuzzed("hf weights"),
    "datacentric.models.hf:folder_config": fuzzed("hf config.json"),
    "datacentric.models.model_args:model_held": fuzzed("unprefixed model folder"),
    "datacentric.models.diffusers_encode:read_model_index": fuzzed("model_index.json"),
    "datacentric.models.diffusers_encode:pipeline_geometry": fuzzed("vae config.json"),
    "datacentric.models.model_args:check_pipeline_scheduler": fuzzed("scheduler_config.json"),
    "datacentric.planning.hardware:load_hardware_file": fuzzed("hardware json"),
    "datacentric.settings.run_settings:_read_file": fuzzed("toml settings"),
    "datacentric.shapes:read_lengths_file": fuzzed("lengths file"),
    "datacentric.train.checkpoints.checkpoint_verify:verify_checkpoint": fuzzed("trainer.json"),
    "datacentric.train.checkpoints.checkpoint_verify:read_trainer_record": fuzzed("trainer.json"),
    "datacentric.train.checkpoints.checkpoint_verify:read_manifest": fuzzed("manifest.json"),
    "datacentric.train.exporting.export:run_settings": fuzzed("config.json"),
    "datacentric.train.exporting.export_folders:_export_record_files": fuzzed(
        "datacentric_export.json"
    ),
    "datacentric.train.checkpoints.safe_load:read_metadata_file": fuzzed("checkpoint .metadata"),
    "datacentric.integrations.outputs:_kept": fuzzed("drop-in trainer_state.json"),
    "datacentric.integrations.trl:read_chat_template": fuzzed("chat template"),
    # the read helpers themselves: fuzzed through every reader above that calls them
    "datacentric.regular_files:read_regular_text": fuzzed("trainer.json", "plain text"),
    "datacentric.regular_files:read_regular_bytes": fuzzed("prompts", "media csv"),
    "datacentric.regular_files:read_json_file": fuzzed("manifest.json", "config.json"),
    "datacentric.regular_files:parse_json": fuzzed("text jsonl", "media jsonl", "prompts"),
    "datacentric.regular_files:file_sha256": fuzzed("trainer.json"),
    # no file, or no file a user gives
    "datacentric.settings.run_settings:TrainConfig.to_json": left_out(
        "json.loads(json.dumps(...)) of settings in memory: no file"
    ),
    "datacentric.train.checkpoints.resume:_as_json": left_out(
        "json.loads(json.dumps(...)) in memory"
    ),
    "datacentric.train.reporting.run_plots:step_time_caption": left_out(
        "a figure's caption from the run's own config.json (read_json_file, fuzzed above): "
        "what does not read as the run's settings falls back to the general caption, never "
        "an error (test_step_time_caption)"
    ),
    "datacentric.prepare.plan:Task.key": left_out("json.loads(json.dumps(...)) in memory"),
    "datacentric.cli.prepare:_binary": left_out(
        "looks for a NUL in --media's first 4096 bytes (open_regular: never a FIFO); any "
        "bytes are an answer, nothing is parsed, and read_media_source (fuzzed: media csv, "
        "media jsonl) reads the list itself (test_a_media_list_of_another_suffix_...)"
    ),
    "datacentric.models.model_args:parse_model_args": left_out(
        "--model-arg KEY=VALUE values from the command line, not a file"
    ),
    "datacentric.integrations.records:_tools": left_out(
        "a drop-in record's tools string, a value the user's Python code passes, not a file"
    ),
    "datacentric.profiling.factory:_built_spec": left_out(
        "model arguments the package serialised itself for a profiling process"
    ),
    "datacentric.parallel.launch:_collect": left_out(
        "results the package's own rank processes wrote to its private temporary folder"
    ),
    "datacentric.data.tokenizer_files:encode_in_pieces": left_out(
        "parses the tokenizers library's own serialization (to_str) of a tokenizer already "
        "loaded; tokenizer.json itself is fuzzed by the tokenizer.json target"
    ),
    "datacentric.train.reporting.heartbeat:_FolderRecords.read": left_out(
        "the beats the package's own rank processes wrote to their launch's private "
        "rendezvous folder (mode 0700), only shown in a message after a timeout"
    ),
    "datacentric.profiling.store:device_name": left_out("the kernel's /proc/cpuinfo"),
    "datacentric.train.comparison.machine_load:cores_busy_s": left_out("the kernel's /proc/stat"),
    "datacentric.data.stdlib:StdlibCorpus.sample": left_out(
        "the Python standard library's own source files (the stdlib demo corpus)"
    ),
    # bytes read without being parsed
    "datacentric.data.tokenizer_files:TextCodec.__init__": left_out(
        "hashes tokenizer.json's bytes for the cache key (any content hashes); the file is "
        "parsed by load_tokenizer, fuzzed by the tokenizer.json target"
    ),
    "datacentric.prepare.plan:_file_hash": left_out("hashes a file's bytes (any content)"),
    "datacentric.train.exporting.export:_copy_tokenizer": left_out(
        "copies tokenizer files' bytes unread"
    ),
    "datacentric.train.run_folder:RunFolderLock._holder": left_out(
        "the run folder lock's text, only shown in a message naming the lock file"
    ),
    "datacentric.train.rank_agreement:check_shared_run_folder": left_out(
        "the run folder lock's text, only compared with what rank 0 read, never parsed"
    ),
    # files the package writes and reads back itself
    "datacentric.data.tokenized:TokenizedTextDataset.__init__": left_out(
        "the token cache the package wrote (meta.json, offsets.npy), in a folder named by "
        "the SHA-256 of its inputs"
    ),
    "datacentric.prepare.run:claim_folder": left_out(
        "prepare's own settings.json in its output folder (prepare/ checks it)"
    ),
    "datacentric.prepare.run:_done_record": left_out(
        "prepare's own per-clip records in its output folder, read only when their key matches"
    ),
    "datacentric.prepare.run:write_outputs": left_out(
        "prepare's own per-clip records, written by the same run moments before"
    ),
    "datacentric.train.checkpoints.checkpoint_verify:_named_by_latest": left_out(
        "the checkpoints/latest pointer: its text is a folder name, checked to exist and "
        "verified as a checkpoint (fuzzed as trainer.json and manifest.json)"
    ),
    "datacentric.train.checkpoints.safe_load:SafeLoadPlanner.load_bytes": left_out(
        "checkpoint tensor files, read only after their SHA-256 matched the fuzzed manifest"
    ),
    "datacentric.train.checkpoints.safe_load:load_tensor_file": left_out(
        "checkpoint RNG files, read only after their SHA-256 matched the fuzzed manifest"
    ),
    "datacentric.train.reporting.metrics:read_jsonl": left_out(
        "a run's own metrics.jsonl and samples.jsonl, which the run appends"
    ),
    "datacentric.train.reporting.metric_sinks:wandb_run_id": left_out(
        "a run folder's own wandb/run_id, written by its first start; anything but an id "
        "is one line naming the file"
    ),
    "datacentric.train.comparison.measured_comparison:compare_policies": left_out(
        "the comparison's own step files, written by the runs it started"
    ),
    "datacentric.train.comparison.measured_comparison:RunSteps.__call__": left_out(
        "the comparison's own step files, written by the runs it started"
    ),
    "datacentric.profiling.store:load_profile": left_out(
        "the profile store the package writes, in a folder keyed by the SHA-256 of what was "
        "measured; a corrupt entry is re-measured"
    ),
    "datacentric.profiling.store:last_checked": left_out("the profile store's own probe file"),
    "datacentric.profiling.store:load_plan": left_out("the profile store's own plan files"),
    "datacentric.schedule:Schedule.load": left_out(
        "a schedule `datacentric schedule --out` wrote, for `simulate`; not a file kind of "
        "the training path (not fuzzed yet)"
    ),
    "datacentric.cli.calibrate:_fit": left_out(
        "measurement files `datacentric bench` wrote, for `calibrate` (not fuzzed yet)"
    ),
    "datacentric.cli.demo:_print_plan": left_out("the plan the demo itself wrote moments before"),
    "datacentric.cli.tiny:write_clips": left_out(
        "writes captions.csv (csv.DictWriter, the scan's csv match): it reads no file"
    ),
}


def problems_of(found: dict[str, set[str]], registry: dict) -> list[str]:
    """Readers the registry misses, names it keeps that no longer read, unknown targets."""
    problems = [
        f"{reader} reads files ({', '.join(sorted(found[reader]))}) and is reached by no fuzz "
        "target: add one (tests/runtime/fuzz/fuzz_targets.py) and name it in READERS, or "
        "say in READERS why it is left out"
        for reader in sorted(set(found) - set(registry))
    ]
    problems += [
        f"{reader} is in READERS but reads no file" for reader in set(registry) - set(found)
    ]
    for reader, entry in registry.items():
        if isinstance(entry, tuple):
            problems += [f"{reader}: no fuzz target {t!r}" for t in entry if t not in TARGET_NAMES]
    return problems


def test_every_reader_of_the_package_is_fuzzed_or_left_out_for_a_reason():
    problems = problems_of(find_readers(PACKAGE), READERS)
    assert not problems, "\n".join(problems)


def test_every_fuzz_target_reaches_a_listed_reader():
    named = {t for entry in READERS.values() if isinstance(entry, tuple) for t in entry}
    assert TARGET_NAMES <= named, TARGET_NAMES - named


PLANTED = """
import json
from pathlib import Path


def read_settings(path):
    return json.loads(Path(path).read_text())


def write_settings(path, value):
    with open(path, "w") as handle:
        handle.write(json.dumps(value))
"""


def test_a_planted_reader_is_found_and_refused(tmp_path):
    package = tmp_path / "datacentric"
    (package / "data").mkdir(parents=True)
    (package / "data" / "planted.py").write_text(PLANTED)
    found = find_readers(package)
    assert found == {"datacentric.data.planted:read_settings": {".read_text", "json.loads"}}
    (problem,) = problems_of(found | find_readers(PACKAGE), READERS)
    assert problem.startswith("datacentric.data.planted:read_settings reads files")


def test_a_planted_unguarded_json_loads_is_caught_by_the_fuzzing(tmp_path, monkeypatch):
    from datacentric.train.checkpoints import checkpoint_verify

    target = next(t for t in TARGETS if t.name == "manifest.json")
    monkeypatch.setattr(
        checkpoint_verify, "read_json_file", lambda path, **_: json.loads(Path(path).read_text())
    )
    problems = fuzz(target, tmp_path / "planted", count=60)
    assert any("JSONDecodeError leaked" in p for p in problems), problems
    monkeypatch.undo()  # the reader as it is: the same mutants pass
    assert fuzz(target, tmp_path / "real", count=60) == []


def _split_csv_rows(path: Path, text: str) -> list:
    """A planted fault: a CSV list read by splitting at commas and line ends."""
    lines = [line.split(",") for line in text.splitlines() if line]
    return [(f"{path}:{n}", dict(zip(lines[0], cells))) for n, cells in enumerate(lines[1:], 2)]


def test_a_planted_split_at_commas_is_caught_by_the_fuzzing(tmp_path, monkeypatch):
    from datacentric.data import media_sources

    target = next(t for t in TARGETS if t.name == "media csv")
    monkeypatch.setattr(media_sources, "_csv_rows", _split_csv_rows)
    with pytest.raises(AssertionError, match="the valid seed reads"):
        fuzz(target, tmp_path, count=20)
    (tmp_path / "again").mkdir()
    assert list(csv.reader(io.StringIO(target.seed(tmp_path / "again").read_text())))[1] == [
        "a.png",
        "a cat, running",
    ]
