"""Every file kind the package reads, as a fuzz target: a valid seed written into a
folder and the package's own reader of it (called in this process), returning what it
read as plain data to compare (:mod:`fuzz_inputs` says the rule)."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz_inputs import Target

# -- data files ----------------------------------------------------------------------


def _text_jsonl(folder: Path) -> Path:
    path = folder / "docs.jsonl"
    lines = [{"text": "a cat runs"}, {"text": "deux chats, \u00e9t\u00e9", "id": 3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return path


def _read_text_jsonl(path: Path) -> Any:
    from datacentric.data.documents import read_documents

    return [(d.row, d.text) for d in read_documents("jsonl", [str(path)], "text")]


def _chat_jsonl(folder: Path) -> Path:
    path = folder / "chat.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    records = [{"messages": turns}, {"prompt": "2+2?", "completion": "4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _read_chat_jsonl(path: Path) -> Any:
    from datacentric.data.chat import conversation_turns, is_conversation
    from datacentric.data.documents import read_records

    out = []
    for record in read_records("jsonl", [str(path)]):
        if not is_conversation(record.fields):
            return ("not a conversation", record.where)  # the dataset refuses it so
        out.append(conversation_turns(record))
    return out


def _parquet(folder: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / "docs.parquet"
    pq.write_table(pa.table({"text": ["a cat runs", "two dogs"], "n": [1, 2]}), path)
    return path


def _read_parquet(path: Path) -> Any:
    from datacentric.data.documents import read_documents

    return [(d.row, d.text) for d in read_documents("parquet", [str(path)], "text")]


#: What the caption seeds read as: each caption byte for byte (a comma, a U+2028 kept).
CAPTIONS = [("a.png", "a cat, running"), ("b.mp4", "two dogs")]
JSONL_CAPTIONS = [("a.png", "a cat,\u2028running"), ("b.mp4", "x")]


def _media_folder(folder: Path) -> Path:
    for name in ("a.png", "b.mp4"):
        (folder / name).write_bytes(b"not decoded when listed")
    return folder


def _media_csv(folder: Path) -> Path:
    path = _media_folder(folder) / "list.csv"
    path.write_text('path,caption\na.png,"a cat, running"\nb.mp4,two dogs\n', encoding="utf-8")
    return path


def _media_jsonl(folder: Path) -> Path:
    path = _media_folder(folder) / "list.jsonl"
    rows = [{"path": "a.png", "caption": "a cat,\u2028running"}, {"path": "b.mp4", "caption": "x"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _read_media(path: Path) -> Any:
    from datacentric.data.media_sources import read_media_source

    return [(i.source, i.caption) for i in read_media_source(path)]


def _caption_txt(folder: Path) -> Path:
    (folder / "media").mkdir()
    media = _media_folder(folder / "media")
    (media / "b.txt").write_text("two dogs\n", encoding="utf-8")
    path = media / "a.txt"
    path.write_text("a cat, running\n", encoding="utf-8")
    return path


def _read_captions(path: Path) -> Any:
    return _read_media(path.parent)


def _prompts(folder: Path) -> Path:
    path = folder / "prompts.txt"
    path.write_text('a red fox\n{"prompt": "a cat", "max_new_tokens": 8}\n', encoding="utf-8")
    return path


def _read_prompts(path: Path) -> Any:
    from datacentric.data.prompts import read_prompts

    return read_prompts(path)


def _chat_template(folder: Path) -> Path:
    path = folder / "template.jinja"
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    path.write_text(template, encoding="utf-8")
    return path


def _read_chat_template(path: Path) -> Any:
    from datacentric.integrations.trl import read_chat_template

    return read_chat_template(path)


def _bucket_config(folder: Path) -> Path:
    path = folder / "buckets.json"
    buckets = {"480p": {"1": 0.5, "17": [0.5, 1.0]}, "240p": {"1": 1.0}}
    ratios = {"240p": {"0.56": [240, 426], "1.00": [320, 320]}}
    path.write_text(json.dumps({"buckets": buckets, "aspect_ratios": ratios}))
    return path


def _read_bucket_config(path: Path) -> Any:
    from datacentric.data.bucket_config import BucketConfig

    return BucketConfig.load(str(path)).table


def _latent_npy(folder: Path) -> Path:
    import numpy as np

    path = folder / "clip.npy"
    np.save(path, np.arange(2 * 4 * 2 * 3, dtype=np.float32).reshape(2, 4, 2, 3))
    return path


def _latent_safetensors(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path = folder / "clip.safetensors"
    save_file({"latent": torch.arange(24, dtype=torch.float32).reshape(1, 4, 2, 3)}, str(path))
    return path


def _read_latent(path: Path) -> Any:
    import numpy as np

    from datacentric.data.latent_files import as_float_tensor, open_latent, read_shape

    shape = read_shape(path)
    data = as_float_tensor(open_latent(path))
    return shape, tuple(data.shape), np.asarray(data).tobytes()


def _latent_manifest(folder: Path) -> Path:
    _latent_npy(folder)
    (folder / "clip.text.npy").write_bytes((folder / "clip.npy").read_bytes())
    path = folder / "manifest.jsonl"
    rows = [{"latent": "clip.npy", "text": "clip.text.npy", "frames": 2, "bucket": "b"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _read_latent_manifest(path: Path) -> Any:
    from datacentric.data.latent_files import read_latent_listing

    return [
        (e.latent.name, e.text and e.text.name, e.frames, e.bucket)
        for e in read_latent_listing(str(path.parent))
    ]


def _earlier_prepare(folder: Path) -> Path:
    """A prepare output folder: its manifest (mutated) and its report."""
    path = _latent_manifest(folder)
    (folder / "prepare_report.json").write_text(json.dumps({"media": "clips.csv"}))
    return path


def _read_earlier_prepare(path: Path) -> Any:
    """What a later prepare into the folder reads of the earlier run (nothing, where the
    manifest does not read: the note is left out, never a failure)."""
    from datacentric.prepare.run import _earlier_run

    samples, media = _earlier_run(path.parent)
    return sorted(samples), media


# -- settings and run folders ------------------------------------------------------------


def _toml(folder: Path) -> Path:
    path = folder / "run.toml"
    path.write_text(
        '[job]\nout = "runs/a"\n[training]\nlr = 0.001\niterations = 4\n'
        '[data]\ndataset = "stdlib"\n',
        encoding="utf-8",
    )
    return path


def _read_toml(path: Path) -> Any:
    from datacentric.settings.run_settings import file_settings

    return file_settings(path)


def _run_config(folder: Path) -> Path:
    from datacentric.settings.run_settings import load_config

    run = folder / "run"
    run.mkdir()
    config = load_config(model="llama", lr=0.001, iterations=4)
    (run / "config.json").write_text(json.dumps(config.to_json()), encoding="utf-8")
    return run / "config.json"


def _read_run_config(path: Path) -> Any:
    from datacentric.train.exporting.export import run_settings

    return run_settings(path.parent)


def _checkpoint(folder: Path) -> Path:
    """A checkpoint folder as a save writes it (no tensors: the readers fuzzed here read
    its manifest, its trainer record and its DCP metadata)."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = folder / "checkpoints" / "step-00000002"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    trainer = {"iterations_done": 2, "samples_seen": 8, "epoch": 0, "world_size": 1}
    (path / "trainer.json").write_text(json.dumps({**trainer, "position": {"epoch": 0}}))
    _write_manifest(path)
    return path


def _write_manifest(path: Path) -> None:
    names = (".metadata", "trainer.json")
    manifest = {n: hashlib.sha256((path / n).read_bytes()).hexdigest() for n in names}
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def _in_checkpoint(name: str) -> Callable[[Path], Path]:
    """The seed of one file of a checkpoint folder."""
    return lambda folder: _checkpoint(folder) / name


def _refit_manifest(path: Path) -> None:
    if path.is_file() and not path.is_symlink():
        _write_manifest(path.parent)


def _read_trainer(path: Path) -> Any:
    """``inspect``'s reading, after the check before a resume's ranks start has read the
    same record (each refuses what the other would)."""
    from datacentric.cli.inspect import checkpoint_position
    from datacentric.train.checkpoints.checkpoint_verify import (
        read_trainer_record,
        verify_checkpoint,
    )

    read_trainer_record(path.parent)
    return checkpoint_position(verify_checkpoint(path.parent), path.parent)


def _read_manifest(path: Path) -> Any:
    from datacentric.train.checkpoints.checkpoint_verify import read_manifest

    return read_manifest(path.parent)


def _export_record(folder: Path) -> Path:
    out = folder / "exported"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()
    record = {"run": "r", "files": ["model.safetensors"], "sha256": {"model.safetensors": digest}}
    (out / "datacentric_export.json").write_text(json.dumps(record), encoding="utf-8")
    return out / "datacentric_export.json"


def _read_export_record(path: Path) -> Any:
    from datacentric.train.exporting.export_folders import _export_record_files

    return _export_record_files(path.parent)


def _drop_in_state(folder: Path) -> Path:
    run = folder / "out" / "run"
    run.mkdir(parents=True)
    logs = [{"loss": 5.7, "step": 1}, {"loss": 5.1, "step": 2}, {"eval_loss": 5.0, "step": 2}]
    record = {"num_input_tokens_seen": {"2": 64}, "log_history": logs}
    (run / "trainer_state.json").write_text(json.dumps(record), encoding="utf-8")
    return run / "trainer_state.json"


def _read_drop_in_state(path: Path) -> Any:
    from datacentric.integrations.outputs import kept_state

    return kept_state(path.parent.parent, 2)


# -- model and pipeline folders ------------------------------------------------------------


def _model_index(folder: Path) -> Path:
    pipe = folder / "pipe"
    pipe.mkdir()
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": "0.35.0",
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    (pipe / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    (pipe / "vae").mkdir()
    vae = {"_class_name": "AutoencoderKLWan", "scale_factor_temporal": 4}
    vae |= {"scale_factor_spatial": 8, "temperal_downsample": [False, True, True]}
    (pipe / "vae" / "config.json").write_text(json.dumps(vae), encoding="utf-8")
    return pipe / "model_index.json"


def _read_model_index(path: Path) -> Any:
    from datacentric.models.diffusers_encode import read_model_index

    return read_model_index(path.parent)


def _scheduler_config(folder: Path) -> Path:
    pipe = _model_index(folder).parent
    (pipe / "scheduler").mkdir()
    config = {"_class_name": "UniPCMultistepScheduler", "prediction_type": "flow_prediction"}
    config |= {"flow_shift": 3.0, "use_flow_sigmas": True}
    path = pipe / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _read_scheduler_config(path: Path) -> Any:
    from datacentric.models.model_args import check_pipeline_scheduler

    check_pipeline_scheduler("diffusers:pipe", path.parent.parent)
    return "flow"


def _vae_config(folder: Path) -> Path:
    return _model_index(folder).parent / "vae" / "config.json"


def _read_vae_config(path: Path) -> Any:
    from datacentric.models.diffusers_encode import pipeline_geometry

    return pipeline_geometry(path.parent.parent)


def _hf_config(folder: Path) -> Path:
    model = folder / "model"
    model.mkdir()
    config = {"model_type": "llama", "hidden_size": 16, "num_hidden_layers": 1}
    config |= {"num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 64}
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return model / "config.json"


def _read_hf_config(path: Path) -> Any:
    from datacentric.models.hf import folder_config
    from datacentric.models.source import resolve_model

    return folder_config(resolve_model(f"hf:{path.parent}")).to_dict()


def _tokenizer(folder: Path) -> Path:
    from chat_data import save_chat_tokenizer

    save_chat_tokenizer(folder / "tok")
    return folder / "tok" / "tokenizer.json"


def _chat_template(folder: Path) -> Path:
    """A tokenizer whose template is a ``chat_template.jinja`` file of its own."""
    path = _tokenizer(folder).parent
    config = json.loads((path / "tokenizer_config.json").read_text())
    template = config.pop("chat_template", None)
    if template is not None:
        (path / "chat_template.jinja").write_text(template, encoding="utf-8")
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path / "chat_template.jinja"


def _read_tokenizer(path: Path) -> Any:
    from datacentric.data.chat import ChatRenderer, load_tokenizer
    from datacentric.data.tokenizer_files import tokenizer_digest

    tokenizer_digest(path.parent)  # the token cache's key: reads every tokenizer file
    tokenizer = load_tokenizer(str(path.parent))
    renderer = ChatRenderer(tokenizer, str(path.parent))
    return tokenizer("a cat runs")["input_ids"], tokenizer.chat_template, renderer.unmarked


def _plain_text(folder: Path) -> Path:
    path = folder / "book.txt"
    path.write_text("a cat runs\nthe end\n", encoding="utf-8")
    return path


def _read_plain_text(path: Path) -> Any:
    from datacentric.data.documents import read_documents
    from datacentric.data.text_file import text_utf8

    texts = [(d.row, d.text) for d in read_documents("text", [str(path)], "text")]
    # the UTF-8 bytes tokenizer's read, in pieces: the same text
    assert bytes(text_utf8(str(path))) == texts[0][1].encode()
    return texts


def _latent_pt(folder: Path) -> Path:
    import torch

    path = folder / "clip.pt"
    torch.save({"latent": torch.arange(24, dtype=torch.float32).reshape(1, 4, 2, 3)}, path)
    return path


def _read_model_held(path: Path) -> Any:
    """What ``--model DIR`` without its prefix is told the folder holds."""
    from datacentric.models.model_args import model_held

    return model_held(path.parent)


def _hf_weights(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path = _hf_config(folder).parent / "model.safetensors"
    save_file({"lm_head.weight": torch.zeros(4, 2)}, str(path))
    return path


def _read_hf_weights(path: Path) -> Any:
    from datacentric.models.hf import check_weight_files
    from datacentric.models.source import resolve_model

    check_weight_files(resolve_model(f"hf:{path.parent}"))
    return True


def _hardware(folder: Path) -> Path:
    from dataclasses import asdict

    from datacentric.planning.hardware import get_hardware

    path = folder / "hardware.json"
    path.write_text(json.dumps({"hardware": asdict(get_hardware("h100-sxm"))}), encoding="utf-8")
    return path


def _read_hardware(path: Path) -> Any:
    from dataclasses import asdict

    from datacentric.planning.hardware import load_hardware_file

    return asdict(load_hardware_file(path))


def _lengths(folder: Path) -> Path:
    path = folder / "lengths.txt"
    path.write_text("# tokens, or frames height width\n512\n17 480 640\n", encoding="utf-8")
    return path


def _read_lengths(path: Path) -> Any:
    from datacentric.shapes import read_lengths_file

    return read_lengths_file(str(path))


def _diffusers_config(folder: Path) -> Path:
    from datacentric.models.diffusers_families import FAMILIES

    model = folder / "transformer"
    model.mkdir()
    family = FAMILIES["WanTransformer3DModel"]
    config = {"_class_name": family.transformer, **family.tiny_config}
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return model / "config.json"


def _read_diffusers_config(path: Path) -> Any:
    from datacentric.models.diffusers_build import read_model_config

    cls, config = read_model_config(path, str(path.parent), {})
    return cls.__name__, config


def _box(kind: bytes, body: bytes) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + kind + body


def _heif_boxes(folder: Path) -> Path:
    """An AVIF's container as phones write it, its pixels left out: the primary item's
    properties (a Display P3 ``nclx`` box, a quarter turn) in ``meta``, then ``mdat``."""
    nclx = _box(b"colr", b"nclx" + bytes([0, 12, 0, 13, 0, 1, 0x80]))
    ipco = _box(b"ipco", _box(b"ispe", bytes(12)) + nclx + _box(b"irot", b"\x03"))
    ipma = _box(b"ipma", bytes(4) + (1).to_bytes(4, "big") + b"\0\1\3\x01\x82\x83")
    pitm = _box(b"pitm", bytes(4) + b"\0\1")
    meta = _box(b"meta", bytes(4) + _box(b"hdlr", bytes(24)) + pitm + _box(b"iprp", ipco + ipma))
    path = folder / "photo.avif"
    path.write_bytes(_box(b"ftyp", b"avif\0\0\0\0avifmif1") + meta + _box(b"mdat", bytes(16)))
    return path


def _read_heif_boxes(path: Path) -> Any:
    from datacentric.data.media_boxes import container_turned, nclx_box

    return nclx_box(path), container_turned(path)


def _folder_names(path: Path) -> list[str]:
    """A reader of a folder may name the folder or the file."""
    return [path.name, path.parent.name]


TARGETS = [
    Target("text jsonl", _text_jsonl, _read_text_jsonl, jsonl=True, examples=300),
    Target("chat jsonl", _chat_jsonl, _read_chat_jsonl, jsonl=True, examples=300),
    Target("parquet", _parquet, _read_parquet, examples=200, text=False),
    Target("plain text", _plain_text, _read_plain_text, examples=200, crlf_same=False),
    Target("media csv", _media_csv, _read_media, examples=300, expect=CAPTIONS),
    Target("media jsonl", _media_jsonl, _read_media, jsonl=True, expect=JSONL_CAPTIONS),
    Target("caption txt", _caption_txt, _read_captions, examples=200, expect=CAPTIONS),
    Target("prompts", _prompts, _read_prompts, examples=300),
    Target("chat template", _chat_template, _read_chat_template, examples=100, crlf_same=False),
    Target("bucket config", _bucket_config, _read_bucket_config, json=True, examples=300),
    Target("latent npy", _latent_npy, _read_latent, examples=200, text=False),
    Target("latent safetensors", _latent_safetensors, _read_latent, examples=200, text=False),
    Target("latent pt", _latent_pt, _read_latent, examples=200, text=False),
    Target("latent manifest", _latent_manifest, _read_latent_manifest, jsonl=True),
    Target("earlier prepare", _earlier_prepare, _read_earlier_prepare, jsonl=True),
    Target("toml settings", _toml, _read_toml, examples=300),
    Target("config.json", _run_config, _read_run_config, json=True, examples=200),
    Target(
        "trainer.json",
        _in_checkpoint("trainer.json"),
        _read_trainer,
        json=True,
        refit=_refit_manifest,
        names=_folder_names,
    ),
    Target(
        "manifest.json",
        _in_checkpoint("manifest.json"),
        _read_manifest,
        json=True,
        names=_folder_names,
    ),
    Target(
        "datacentric_export.json",
        _export_record,
        _read_export_record,
        json=True,
        accepts_none=True,
    ),
    Target(
        "drop-in trainer_state.json",
        _drop_in_state,
        _read_drop_in_state,
        json=True,
        accepts_none=True,
    ),
    Target("model_index.json", _model_index, _read_model_index, json=True, names=_folder_names),
    Target("vae config.json", _vae_config, _read_vae_config, json=True, names=_folder_names),
    Target(
        "scheduler_config.json",
        _scheduler_config,
        _read_scheduler_config,
        json=True,
        names=_folder_names,
    ),
    Target("hf config.json", _hf_config, _read_hf_config, json=True, names=_folder_names),
    Target("unprefixed model folder", _hf_config, _read_model_held, json=True, examples=100),
    Target("hf weights", _hf_weights, _read_hf_weights, examples=200, text=False),
    Target(
        "checkpoint .metadata",
        _in_checkpoint(".metadata"),
        _read_trainer,
        text=False,
        refit=_refit_manifest,
    ),
    Target("hardware json", _hardware, _read_hardware, json=True, examples=200),
    Target("heif boxes", _heif_boxes, _read_heif_boxes, examples=300, text=False),
    Target("lengths file", _lengths, _read_lengths, examples=200),
    Target(
        "diffusers config.json",
        _diffusers_config,
        _read_diffusers_config,
        json=True,
        names=_folder_names,
    ),
    Target(
        "tokenizer.json", _tokenizer, _read_tokenizer, json=True, examples=200, names=_folder_names
    ),
    Target("chat template", _chat_template, _read_tokenizer, examples=200, names=_folder_names),
]
"""The fuzz targets, by file kind."""
