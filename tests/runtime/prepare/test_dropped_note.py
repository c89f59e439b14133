"""prepare's note on the samples of the last run's manifest that a run of another
``--media`` no longer lists agrees with its count: ``1 sample ... is not`` (it said
``1 sample ... are not``), ``3 samples ... are not``."""

from __future__ import annotations

from datacentric.cli.prepare import dropped_note


def test_one_sample_no_longer_listed_is_said_in_the_singular():
    note = dropped_note({"no_longer_listed": 1, "earlier_media": "a b"}, "c", "out dir")
    assert note.startswith("note: 1 sample of the manifest the last run wrote (--media a b) is")
    assert " is not in --media c: out dir/manifest.jsonl lists" in note
    many = dropped_note({"no_longer_listed": 3, "earlier_media": "c"}, "c", "out")
    assert many.startswith("note: 3 samples of the manifest the last run wrote are not in")
    assert dropped_note({"no_longer_listed": 0}, "c", "out") is None
