"""Which tokens of a packed sequence each position of an attention ring holds.

Ring attention splits a packed sequence of ``S`` tokens over ``r`` ring positions.
Under a causal mask a contiguous split is unbalanced (the last position attends to
everything before it, the first to almost nothing), so every segment (sample) is cut
**zigzag**: into ``2r`` chunks, position ``j`` holding chunk ``j`` (its *front*) and
chunk ``2r - 1 - j`` (its *back*). Every position then does about the same causal work
on every segment, whatever the segment lengths.

Segments need not divide ``2r``: each position gets ``2 * (L // 2r)`` tokens of a
segment of length ``L``, and the ``L % 2r`` tokens left over go one by one to the
positions in turn, the turn carried on from segment to segment, so that every position
ends with exactly ``S / r`` tokens when ``r`` divides ``S`` (the packer pads ``S`` to a
multiple of the SP size). A position's count on a segment is split into a front of
``ceil(n / 2)`` and a back of ``floor(n / 2)`` tokens. Short segments leave some
chunks empty; nothing else changes.

A position's local order is, segment after segment, its front then its back chunk,
so the local order follows the global one. :meth:`RingLayout.block_pairs` says, for
the queries of one position and the keys of another, which (query range, key range)
pairs may attend: under a causal mask a pair is either wholly visible or, on the
diagonal (a position's own chunks), causal, which is how a varlen kernel runs it.

Everything here is host arithmetic on the segment offsets (``batch.segment_offsets``);
the runtime shards with it and ring attention attends with it: one authority.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

Range = tuple[int, int]
"""``[start, end)`` of tokens."""


@dataclass(frozen=True)
class BlockPair:
    """Queries ``q`` (local range of the query position) that may see keys ``k`` (local
    range of the key position) of one segment; ``causal`` on the diagonal, else all."""

    q: Range
    k: Range
    causal: bool


@dataclass(frozen=True)
class RingLayout:
    """The zigzag split of one packed layout over ``ring`` positions (see the module doc)."""

    ring: int
    offsets: tuple[int, ...]
    #: ``chunks[j][d]``: the global (front, back) ranges of segment ``d`` on position ``j``
    chunks: tuple[tuple[tuple[Range, Range], ...], ...]

    @property
    def num_segments(self) -> int:
        return len(self.offsets) - 1

    def num_local(self, position: int) -> int:
        """Tokens position ``position`` holds."""
        return sum(f[1] - f[0] + b[1] - b[0] for f, b in self.chunks[position])

    @functools.cached_property
    def _token_lists(self) -> tuple[tuple[int, ...], ...]:
        out = []
        for per_segment in self.chunks:
            tokens: list[int] = []
            for front, back in per_segment:
                tokens += range(*front)
                tokens += range(*back)
            out.append(tuple(tokens))
        return tuple(out)

    def tokens(self, position: int) -> torch.Tensor:
        """Global token indices of position ``position``, in its local order (int64)."""
        return torch.tensor(self._token_lists[position], dtype=torch.long)

    def segment_ids(self, position: int) -> torch.Tensor:
        """Segment index of each local token of ``position`` (int64)."""
        ids: list[int] = []
        for d, (front, back) in enumerate(self.chunks[position]):
            ids += [d] * (front[1] - front[0] + back[1] - back[0])
        return torch.tensor(ids, dtype=torch.long)

    def _local_chunks(self, position: int) -> list[tuple[Range, Range]]:
        """Local (front, back) ranges of every segment of ``position``."""
        at, out = 0, []
        for front, back in self.chunks[position]:
            nf, nb = front[1] - front[0], back[1] - back[0]
            out.append(((at, at + nf), (at + nf, at + nf + nb)))
            at += nf + nb
        return out

    @functools.cache  # noqa: B019 - layouts are cached and few; pairs are asked per layer
    def block_pairs(self, q_position: int, k_position: int, causal: bool) -> tuple[BlockPair, ...]:
        """The pairs of local ranges through which queries of ``q_position`` see keys of
        ``k_position`` (empty ranges left out).

        Without a causal mask every segment is one wholly visible pair. With it, on the
        diagonal (``q_position == k_position``) a segment's front and back are one causal
        pair (the local order follows the global one); the queries of an earlier position
        see the later position's front only from their back; a later position sees the
        earlier position's front with all its tokens (fronts come first, backs last and
        in reverse order).
        """
        q_local, k_local = self._local_chunks(q_position), self._local_chunks(k_position)
        pairs = []
        for (qf, qb), (kf, kb) in zip(q_local, k_local):
            q_all, k_all = (qf[0], qb[1]), (kf[0], kb[1])
            if not causal or q_position == k_position:
                pair = BlockPair(q_all, k_all, causal)
            elif k_position < q_position:  # its front precedes both our chunks; its back follows
                pair = BlockPair(q_all, kf, False)
            else:  # a later position: both its chunks lie between our front and our back
                pair = BlockPair(qb, k_all, False)
            if pair.q[1] > pair.q[0] and pair.k[1] > pair.k[0]:
                pairs.append(pair)
        return tuple(pairs)


@functools.lru_cache(maxsize=64)
def ring_layout(offsets: tuple[int, ...], ring: int) -> RingLayout:
    """The zigzag split of the packed layout ``offsets`` (``cu_seqlens`` as host ints)
    over ``ring`` positions; raises ``ValueError`` unless ``ring`` divides the tokens."""
    if ring < 1:
        raise ValueError(f"a ring needs at least one position, got {ring}")
    total = offsets[-1]
    if total % ring:
        raise ValueError(
            f"a packed sequence of {total} tokens cannot be split over a ring of {ring}; "
            f"pack it with pad_to_multiple a multiple of {ring}"
        )
    turn = 0  # the next position to take a left-over token, carried across segments
    per_position: list[list[tuple[Range, Range]]] = [[] for _ in range(ring)]
    for start, end in zip(offsets[:-1], offsets[1:]):
        length = end - start
        base, left = divmod(length, 2 * ring)
        counts = [2 * base] * ring
        for k in range(left):
            counts[(turn + k) % ring] += 1
        turn = (turn + left) % ring
        fronts = [(n + 1) // 2 for n in counts]
        at = start
        front_ranges = []
        for n in fronts:
            front_ranges.append((at, at + n))
            at += n
        back_ranges: list[Range] = [(0, 0)] * ring
        for j in reversed(range(ring)):
            n = counts[j] - fronts[j]
            back_ranges[j] = (at, at + n)
            at += n
        for j in range(ring):
            per_position[j].append((front_ranges[j], back_ranges[j]))
    return RingLayout(ring, tuple(offsets), tuple(tuple(p) for p in per_position))
