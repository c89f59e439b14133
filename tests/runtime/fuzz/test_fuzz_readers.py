"""Every file kind the package reads, fuzzed: seeded mutants of a valid file (truncated,
bytes flipped, deep nesting, huge numbers, odd Unicode line breaks, a BOM, CRLF, JSON
values of another kind) and special files in its place (a FIFO, a folder, a symlink out of
its folder, nothing), each read by the package's own reader in this process: accepted
with the valid file's value (or any value, where the mutant changed the meaning), or
refused in one line naming the file (:mod:`fuzz_inputs`). ``DATACENTRIC_FUZZ_EXAMPLES=N``
runs N mutants a kind."""

from __future__ import annotations

import os

import pytest
from fuzz_inputs import fuzz, judge, read_once
from fuzz_targets import TARGETS


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_every_mutant_is_read_as_its_valid_form_or_refused_naming_the_file(target, tmp_path):
    if target.name == "parquet":
        pytest.importorskip("pyarrow")
    if target.name in ("tokenizer.json", "chat template", "hf config.json"):
        pytest.importorskip("transformers")
    problems = fuzz(target, tmp_path)
    assert not problems, f"{len(problems)} problems, the first ten:\n" + "\n".join(problems[:10])


def _replace(old: bytes, new: bytes):
    def change(data: bytes) -> bytes:
        assert old in data, (old, data[:200])
        return data.replace(old, new)

    return change


DEEP = b"[" * 100_000 + b"]" * 100_000
FIFO = "FIFO"
#: Every defect the fuzzing found, kept: (target, what, the change to the valid file or
#: FIFO, whether the change keeps the meaning).
KEPT = [
    ("parquet", "BOM (thrift error naming no file)", lambda b: b"\xef\xbb\xbf" + b, False),
    ("parquet", "FIFO (pyarrow's open waited)", FIFO, False),
    ("plain text", "FIFO", FIFO, False),
    ("plain text", "BOM", lambda b: b"\xef\xbb\xbf" + b, True),
    ("latent npy", "FIFO", FIFO, False),
    ("latent safetensors", "FIFO", FIFO, False),
    ("hf weights", "FIFO (safetensors' open waited)", FIFO, False),
    ("latent manifest", "text an object", _replace(b'"clip.text.npy"', b'{"n": 1}'), False),
    ("latent manifest", "deep nesting", lambda b: DEEP + b"\n" + b, False),
    ("bucket config", "a size of one number", _replace(b"[240, 426]", b"[240]"), False),
    ("bucket config", "aspect ratios a number", _replace(b'{"0.56"', b'7, "x": {"0.56"'), False),
    ("bucket config", "not UTF-8", lambda b: b"\xff" + b, False),
    (
        "datacentric_export.json",
        "a file name a list",
        _replace(b'["model.safetensors"]', b'[["model.safetensors"]]'),
        False,
    ),
    ("datacentric_export.json", "deep nesting", lambda b: DEEP, False),
    ("model_index.json", "one name", _replace(b'"transformers",\n    "UMT5', b'"UMT5'), False),
    ("model_index.json", "_class_name a list", _replace(b'"WanPipeline"', b'["a"]'), False),
    (
        "hf config.json",
        "heads a list",
        _replace(b'"num_attention_heads": 2', b'"num_attention_heads": [2]'),
        False,
    ),
    ("hf config.json", "model_type a list", _replace(b'"llama"', b'["llama"]'), False),
    ("toml settings", "lr inf (file not named)", _replace(b"lr = 0.001", b"lr = inf"), False),
    ("lengths file", "NaN in a shape", _replace(b"17 480", b"17 4NaN"), False),
    ("lengths file", "BOM", lambda b: b"\xef\xbb\xbf" + b, True),
    ("media jsonl", "deep nesting", lambda b: DEEP + b"\n" + b, False),
    (
        "prompts",
        "a huge number",
        lambda b: b + b'{"prompt": "x", "max_new_tokens": ' + b"9" * 5000 + b"}\n",
        False,
    ),
    ("chat template", "BOM (rendered into every record)", lambda b: b"\xef\xbb\xbf" + b, True),
    ("config.json", "a huge number", _replace(b'"lr": 0.001', b'"lr": ' + b"9" * 5000), False),
    ("manifest.json", "deep nesting", lambda b: DEEP, False),
    # found by runs of 1,500 and 4,000 mutants a kind
    (
        "bucket config",
        "no aspect ratio",
        _replace(b'{"0.56": [240, 426], "1.00": [320, 320]}', b"{}"),
        False,
    ),
    ("media jsonl", "a NUL in a path", _replace(b'"a.png"', b'"a\\u0000.png"'), False),
    (
        "latent manifest",
        "a name too long",
        _replace(b'"clip.npy"', b'"' + b"x" * 5000 + b'"'),
        False,
    ),
    ("latent manifest", "no line left", lambda b: b"\n", False),
    ("latent pt", "a tensor that requires grad", lambda b: _saved_requiring_grad(), False),
    (
        "toml settings",
        "deep nesting",
        lambda b: b + b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n",
        False,
    ),
    (
        "toml settings",
        "a huge number",
        _replace(b"iterations = 4", b"iterations = " + b"9" * 5000),
        False,
    ),
]


def _saved_requiring_grad() -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"latent": torch.ones(1, 4, 2, 3, requires_grad=True)}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "what", "change", "same"), KEPT, ids=[f"{k[0]}: {k[1]}" for k in KEPT]
)
def test_every_defect_found_is_kept_as_an_example(name, what, change, same, tmp_path):
    if name in ("parquet",):
        pytest.importorskip("pyarrow")
    target = next(t for t in TARGETS if t.name == name)
    path = target.seed(tmp_path)
    valid, err = read_once(target, path)
    assert err is None, err
    if change == FIFO:
        path.unlink()
        os.mkfifo(path)
    else:
        path.write_bytes(change(path.read_bytes()))
        if target.refit is not None:
            target.refit(path)
    assert judge(target, path, what, same, valid) is None
