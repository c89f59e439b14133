"""A count said with its unit takes the unit's plural: ``2 epochs`` (it said ``2 epoches``
in train's first line and the validation.every refusal), ``2 batches``, ``2 policies``."""

from __future__ import annotations

from datacentric.progress import counted


def test_epochs_take_an_s_where_other_units_ending_in_ch_take_es():
    assert counted(2, "epoch") == "2 epochs" and counted(1, "epoch") == "1 epoch"
    assert counted(0, "epoch") == "0 epochs"
    assert counted(2, "micro-batch") == "2 micro-batches" and counted(2, "batch") == "2 batches"
    assert counted(3, "policy") == "3 policies" and counted(3, "key") == "3 keys"
