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


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"input_ids": [1, 2.5]}, r"input_ids\[1\] is 2.5, not a token id"),
        ({"input_ids": [1, True]}, r"input_ids\[1\] is true, not a token id"),
        ({"input_ids": [1, "2"]}, r"input_ids\[1\] is \"2\", not a token id"),
        ({"input_ids": [1, None]}, r"input_ids\[1\] is null, not a token id"),
        ({"input_ids": [[1, 2], [3, 4]]}, r"input_ids\[0\] is \[1, 2\], not a token id"),
        ({"input_ids": [[1, 2], [3]]}, r"input_ids\[0\] is \[1, 2\], not a token id"),
        ({"input_ids": "abc"}, r"input_ids is \"abc\", not a list of token ids"),
        ({"input_ids": {"a": 1}}, r"input_ids is \{\"a\": 1\}, not a list of token ids"),
        ({"input_ids": 7}, "input_ids is 7, not a list of token ids"),
        ({"input_ids": [1, 10**30]}, r"input_ids\[1\] is 1000000000000000000000000000000, not a"),
        # past a float's range too: float() of it raised OverflowError, a traceback
        ({"input_ids": [1, 10**400]}, r"input_ids\[1\] is 10{59}, not a token id"),
        ({"input_ids": [1, 2], "labels": [-100, -(10**400)]}, r"labels\[1\] is -10{58}, not a"),
        (
            {"input_ids": [1, 2], "labels": [-100, 2.7]},
            r"labels\[1\] is 2.7, not a token id or -100; write each as a JSON integer",
        ),
        (
            {"input_ids": [1, 2], "completion_mask": [0, 0.5]},
            r"completion_mask\[1\] is 0.5, not 0 or 1",
        ),
        (
            {"input_ids": [1, 2], "assistant_masks": "01"},
            'assistant_masks is "01", not a list of 0s',
        ),
    ],
)
def test_ids_and_masks_that_are_not_whole_numbers_are_refused_by_record(
    tmp_path, monkeypatch, record, says
) -> None:
    """Such values were read through numpy: 2.5 trained as 2, true as 1, '2' as 2, a list
    of lists flattened, ``labels`` 2.7 taken as 2; text, a mapping, a ragged list or an
    integer past 64 bits ended in a traceback."""
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    path = _write(tmp_path / "t.jsonl", [{"input_ids": [1, 2, 3]}, record])
    with pytest.raises(DataError, match=rf"^{path}:2: {says}"):
        TokenizedTextDataset("jsonl", str(path), max_tokens=16)


def test_whole_numbers_written_as_floats_and_boolean_masks_are_read(tmp_path, monkeypatch):
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    record = {"input_ids": [1.0, 2, 3], "labels": [-100.0, 2, 3], "completion_mask": [0, 1, 1]}
    record["assistant_masks"] = [False, True, True]
    path = _write(tmp_path / "t.jsonl", [record])
    data = TokenizedTextDataset("jsonl", str(path), max_tokens=16)
    assert data.sample(0).tolist() == [1, 2, 3] and data.loss_tokens(0) == 2


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"text": "hello"}, r"no input_ids \(found: text\), though the first record"),
        ({"input_id": [1, 2]}, r"no input_ids \(found: input_id\), though the first record"),
        ({"input_ids": None}, "input_ids is null, not a list of token ids"),
    ],
)
def test_a_record_without_token_ids_is_named_not_counted_empty(
    tmp_path, monkeypatch, record, says
) -> None:
    """A text record among token records, a misspelt ``input_ids`` or a null one was
    counted as an empty document (``skipped_empty``) and its record dropped."""
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    path = _write(tmp_path / "t.jsonl", [{"input_ids": [1, 2, 3]}, record])
    with pytest.raises(DataError, match=rf"^{path}:2: {says}"):
        TokenizedTextDataset("jsonl", str(path), max_tokens=16)
