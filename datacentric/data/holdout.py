"""Held-out samples: a seeded split of a dataset's sample ids, and what it held out.

``[validation] dataset = "split=0.1"`` holds a tenth of the training set out:
:func:`split_ids` draws which sample ids (from the seed only, so every rank and a
rerun draw the same ones), and :class:`~datacentric.data.base.SampleSubset` (a view of
some samples of any dataset) shows each part as a dataset of its own, with ids
``0..len-1`` that map to the parent's: the training run plans, schedules and records the
training part's ids; the held-out part is never in it. Per-sample draws (diffusion noise
and time) stay the parent's, by its own sample id. :func:`held_out_records` lists what a
split held out.
"""

from __future__ import annotations

import random
from typing import Any

from datacentric.data.base import Dataset, SampleSubset
from datacentric.progress import counted


def split_ids(size: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """``(kept, held_out)`` sample ids of a dataset of ``size`` samples, each sorted and
    disjoint, together every id: ``round(fraction * size)`` (at least 1) held out by a
    draw seeded by ``seed`` only. Raises ``ValueError`` when no sample would be left
    to train on."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out fraction must be between 0 and 1, got {fraction}")
    held = max(1, round(fraction * size))
    if held >= size:
        raise ValueError(
            f"validation.dataset: split={fraction:g} of {counted(size, 'sample')} leaves none to "
            "train on; lower the fraction or give more data"
        )
    order = list(range(size))
    random.Random(f"datacentric-holdout:{int(seed)}").shuffle(order)
    out = sorted(order[:held])
    chosen = set(out)
    return [i for i in range(size) if i not in chosen], out


def held_out_records(training: Dataset, held_out: Dataset | None) -> list[dict[str, Any]] | None:
    """What a ``split=`` held out of ``training``: one record per parent sample id not
    trained on, in order: ``{"sample": id, "source": where it comes from (the
    dataset's ``sample_source``, else None), "validated": whether the held-out loss
    reads it (``[validation] limit`` keeps the first)}``; None when ``held_out`` is not
    a split of ``training``'s parent."""
    if not (
        isinstance(training, SampleSubset)
        and isinstance(held_out, SampleSubset)
        and held_out.dataset is training.dataset
    ):
        return None
    parent, kept, validated = training.dataset, set(training.ids), set(held_out.ids)
    source = getattr(parent, "sample_source", None)
    return [
        {
            "sample": i,
            "source": source(i) if callable(source) else None,
            "validated": i in validated,
        }
        for i in range(len(parent))
        if i not in kept
    ]
