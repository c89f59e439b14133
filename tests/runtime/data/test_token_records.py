"""Pre-tokenized records (``input_ids`` with optional ``labels``, ``completion_mask``,
``assistant_masks``): the ids as given, the loss on the tokens every mask marks."""

from __future__ import annotations

import json

import pytest
import torch

from datacentric.batch import IGNORE_INDEX
from datacentric.data.base import DataError
from datacentric.data.tokenized import TokenizedTextDataset


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_masks_choose_the_targets_as_a_causal_lm_reads_labels(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    records = [
        {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, -100, 7, 8, 9]},
        {"input_ids": [10, 11, 12], "completion_mask": [0, 1, 1]},
        {"input_ids": [3, 4, 5, 6], "assistant_masks": [0, 1, 0, 1], "labels": [3, 4, 5, -100]},
        {"input_ids": [1, 2]},
    ]
    path = _write(tmp_path / "t.jsonl", records)
    data = TokenizedTextDataset("jsonl", str(path), max_tokens=16)
    assert [s.tokens for s in data.shapes()] == [5, 3, 4, 2]
    batch = data.pack([0, 1, 2, 3])
    # HF shifts labels: the target of token t is label t + 1, kept where it is not -100
    want = []
    for r in records:
        ids = r["input_ids"]
        keep = [True] * len(ids)
        for name in ("labels", "completion_mask", "assistant_masks"):
            if name in r:
                marks = r[name]
                keep = [
                    k and (m != -100 if name == "labels" else m != 0) for k, m in zip(keep, marks)
                ]
        want += [ids[t + 1] if keep[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]
        want.append(IGNORE_INDEX)
    assert batch.targets.tolist() == want
    assert torch.equal(batch.inputs, torch.tensor(sum((r["input_ids"] for r in records), [])))
    assert [data.loss_tokens(i) for i in range(4)] == [3, 2, 1, 1]


def test_labels_that_differ_from_the_ids_are_refused_by_record(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    path = _write(tmp_path / "t.jsonl", [{"input_ids": [1, 2, 3], "labels": [1, 9, 3]}])
    with pytest.raises(DataError, match=r"t\.jsonl:\d+: labels differ from input_ids"):
        TokenizedTextDataset("jsonl", str(path), max_tokens=16)
