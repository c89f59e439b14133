"""The work of one micro-batch pass, as the analytic cost model
(:mod:`~datacentric.planning.analytic`) counts it, and what its formulas read of the
micro-batch's shapes.

- :class:`Work`: one pass's work on one rank in the units the hardware constants divide
  (:meth:`~datacentric.planning.hardware.Hardware.seconds_per_unit`), and the weight
  traffic per parameter that is not a matmul operand (:func:`weight_traffic_bytes`);
- the query-key pairs one self-attention layer scores for a sample
  (:func:`attention_pairs`), and the sums of a micro-batch's shapes the formulas read,
  made once: samples, tokens, squared lengths and pairs per block kind
  (:func:`shape_sums`; a text micro-batch's from its lengths' sums alone,
  :func:`text_shape_sums`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter, mul

import numpy as np

from datacentric.shapes import SampleShape


@dataclass(frozen=True)
class Work:
    """Work of one pass on one rank, in the units the hardware constants divide."""

    matmul_flops: float
    """Linear-layer FLOPs already divided by the GEMM saturation factor."""
    attention_flops: float
    """Attention forward FLOPs (recomputed forwards included)."""
    memory_bytes: float
    nvlink_bytes: float
    ib_bytes: float
    collectives: int
    block_passes: int
    attention_backward_flops: float = 0.0
    segment_passes: float = 0.0
    """Attention segments times attention passes (backward counts twice)."""
    segment_copy_bytes: float = 0.0
    """Per-sample path: bytes of the full-size gradients the segments' slices write."""
    scattered_elements: float = 0.0
    """Modulation backward scatter-add, serialised along each sample."""
    modulation_elements: float = 0.0
    recomputed_blocks: int = 0
    outer_ops: int = 0

    @property
    def all_attention_flops(self) -> float:
        """Attention FLOPs of forward and backward (one rate: ``calibrate_hardware``)."""
        return self.attention_flops + self.attention_backward_flops

    def as_array(self) -> np.ndarray:
        """The work in the order of :meth:`Hardware.seconds_per_unit`."""
        return np.array(_work_values(self), dtype=float)


#: A :class:`Work`'s fields in order, as one tuple.
_work_values = attrgetter(*(f.name for f in fields(Work)))


def weight_traffic_bytes(dtype_bytes: int) -> tuple[int, int]:
    """Bytes per parameter of weight traffic that is not a matmul operand: in each
    forward (recomputed ones too), and in each backward of a block.

    Mixed precision (``dtype_bytes < 4``: fp32 weights under autocast, as the runtime
    trains): every forward reads each fp32 weight and writes its 16-bit copy
    (``4 + dtype``); the backward writes and reads the 16-bit weight gradient and reads
    and writes the fp32 gradient it accumulates into (``2 * dtype + 8``). Full fp32
    training casts nothing; its gradient accumulation is left out (0, 0), as before.
    Approximate: fused optimizers and gradient buckets are not counted.
    """
    if dtype_bytes >= 4:
        return 0, 0
    return 4 + dtype_bytes, 2 * dtype_bytes + 8


def attention_pairs(kind: str, shape: SampleShape) -> float:
    """Query-key pairs one self-attention layer of ``kind`` scores for one sample."""
    s = shape.tokens
    frames, height, width = shape.grid if shape.grid is not None else (1, s, 1)
    if kind == "full":
        return float(s) * s
    if kind == "causal":
        return s * (s + 1) / 2.0
    if kind == "spatial":
        return float(frames) * (height * width) ** 2
    if kind == "temporal":
        return float(height * width) * frames**2
    raise ValueError(f"unknown block kind {kind!r}")


@dataclass(frozen=True)
class _ShapeSums:
    """What the formulas read of a micro-batch's shapes, summed once: the samples, the
    tokens, the sum of squared lengths and the attention pairs per block kind."""

    n: int
    tokens: int
    squares: float
    pairs: tuple[float, ...]


def shape_sums(kinds: Sequence[str], shapes: Sequence[SampleShape]) -> _ShapeSums:
    """:class:`_ShapeSums` of ``shapes`` for blocks of ``kinds`` (text samples' pairs
    from their lengths' sums, video samples' one by one)."""
    lengths = [s.tokens for s in shapes]
    tokens = sum(lengths)
    squares = sum(map(mul, lengths, lengths))
    video = [s for s in shapes if s.grid is not None]
    found = None if video else text_shape_sums(kinds, len(lengths), tokens, squares)
    if found is not None:
        return found
    pairs = tuple(sum(attention_pairs(kind, s) for s in shapes) for kind in kinds)
    return _ShapeSums(len(lengths), tokens, float(squares), pairs)


#: Where a text sample's attention pairs of each block kind come from, as an index into
#: (summed squared tokens, causal pairs, summed tokens): ``text_shape_sums``'s values.
_TEXT_PAIRS = {"full": 0, "causal": 1, "spatial": 0, "temporal": 2}


@functools.lru_cache(maxsize=64)
def _text_pair_slots(kinds: tuple[str, ...]) -> tuple[int, ...] | None:
    """Per block kind, its ``_TEXT_PAIRS`` index (None where a kind's pairs need
    each sample): worked out once per model's kinds, not per pass."""
    if not all(kind in _TEXT_PAIRS for kind in kinds):
        return None
    return tuple(_TEXT_PAIRS[kind] for kind in kinds)


def text_shape_sums(kinds: Sequence[str], n: int, tokens: int, squares: int) -> _ShapeSums | None:
    """:func:`shape_sums` of ``n`` text samples of ``tokens`` summed tokens and
    ``squares`` summed squared tokens (None where a kind's pairs need each sample)."""
    slots = _text_pair_slots(tuple(kinds))
    if slots is None:
        return None
    values = (float(squares), (squares + tokens) / 2, float(tokens))
    return _ShapeSums(n, tokens, values[0], tuple(map(values.__getitem__, slots)))
