"""The formulas of one pass on one rank that the analytic cost model
(:class:`~datacentric.planning.analytic.AnalyticCostModel`) prices, as its module's
docstring describes them: the work its time formula charges (the repeated blocks, their
all-to-alls, what runs outside them), the pass's peak memory (the loss head's share
apart) and the floor its time and memory never go below. :class:`PassFormulas` is a base
of the cost model: its methods read the model's settings through ``self``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from datacentric.planning.hardware import Hardware
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.pass_work import Work, weight_traffic_bytes
from datacentric.shapes import SampleShape

ATTENTION_BACKWARD_FACTOR = 2.5  # FlashAttention-2 backward: 5 matmuls vs 2 in forward


@dataclass
class _PassSums:
    """Running sums of one pass's work while :meth:`AnalyticCostModel._work` adds it up."""

    mm: float = 0.0
    attn: float = 0.0
    attn_bwd: float = 0.0
    mem: float = 0.0
    nvl: float = 0.0
    ib: float = 0.0
    colls: int = 0
    passes: int = 0
    segment_passes: float = 0.0
    modulation: float = 0.0
    scattered: float = 0.0


class PassFormulas:
    """The time and memory formulas of the analytic cost model (a base of
    :class:`~datacentric.planning.analytic.AnalyticCostModel`)."""

    spec: ModelSpec
    hardware: Hardware
    dtype_bytes: int

    def work(self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]) -> Work:
        """The work the time formula charges for (used by hardware calibration)."""
        return self._work(tuple(shapes), sp_size, self._counts(recompute))

    def _work(
        self,
        shapes: tuple[SampleShape, ...],
        sp: int,
        counts: tuple[int, ...],
        ulysses: int | None = None,
        *,
        floor: bool = False,
    ) -> Work:
        """Work of one pass on ``sp`` ranks whose all-to-all runs over ``ulysses`` of
        them (default all: Ulysses only). ``floor``: the work :meth:`pass_floor` prices
        (no GEMM saturation, no serialised scatter; ``shapes`` may be empty)."""
        u = sp if ulysses is None else ulysses
        if not shapes and not floor:
            raise ValueError("a micro-batch needs at least one sample")
        if sp < 1:
            raise ValueError(f"sp_size must be >= 1, got {sp}")
        spec, hw, b = self.spec, self.hardware, self.dtype_bytes
        h = spec.hidden
        sums = self._sums(shapes)
        tokens, n = sums.tokens, sums.n
        local = tokens / sp
        cond = spec.cross_attn_tokens

        cast, grad = weight_traffic_bytes(b)
        trained = spec.weight_grad_share  # frozen weights: no weight-gradient matmul
        grad *= trained
        # token-weighted mean sample length: how long each serialised scatter runs
        serial = 0.0 if floor else sums.squares / tokens / sp
        w = _PassSums()
        self._add_blocks(w, shapes, sp, counts, u, serial=serial, cast=cast, grad=grad, floor=floor)
        # outside the blocks: LM head (forward + 2x backward) or DiT patch in/out and the
        # caption embedder (every rank of the group embeds the whole caption).
        outer = 0.0
        if spec.vocab_size:
            outer += 2.0 * h * spec.vocab_size * local
            w.mem += 3.0 * spec.vocab_size * local * 4  # softmax + loss over fp32 logits
        if spec.patch_channels:
            outer += 2.0 * 2 * spec.patch_channels * h * local
        if cond:
            outer += 2.0 * (spec.cross_attn_width * h + h * h) * cond * n
        w.mm += (2.0 + trained) * outer
        w.mem += spec.outer_params * (cast + grad)
        w.modulation += spec.outer_per_token_modulation * local * 3
        w.scattered += spec.outer_per_token_modulation * serial
        sat = 1.0
        if hw.half_efficiency_tokens and not floor:
            sat = local / (local + hw.half_efficiency_tokens)
        # the per-sample path's slice backward: one full-size q, k, v gradient per segment
        copy = n * local * (h + 2 * spec.kv_dim) * b * spec.num_blocks
        return Work(
            w.mm / sat,
            w.attn,
            w.mem,
            w.nvl,
            w.ib,
            w.colls,
            w.passes,
            attention_backward_flops=w.attn_bwd,
            segment_passes=w.segment_passes,
            segment_copy_bytes=copy,
            scattered_elements=w.scattered,
            modulation_elements=w.modulation,
            recomputed_blocks=sum(counts),
            outer_ops=spec.outer_ops,
        )

    def _add_blocks(
        self,
        w: _PassSums,
        shapes: tuple[SampleShape, ...],
        sp: int,
        counts: tuple[int, ...],
        u: int,
        *,
        serial: float,
        cast: float,
        grad: float,
        floor: bool = False,
    ) -> None:
        """Add the repeated blocks' work to ``w``: per kind, every block's forward (again
        when recomputed) and backward, its all-to-alls over ``u`` ranks and its weight
        traffic (``cast`` and ``grad`` bytes per parameter)."""
        spec, hw, b = self.spec, self.hardware, self.dtype_bytes
        sums = self._sums(shapes)
        h, cond, n = spec.hidden, spec.cross_attn_tokens, sums.n
        tokens = sums.tokens
        local = tokens / sp
        block_matmul = (
            2.0 * spec.token_matmul_params * local
            + 2.0 * spec.cond_matmul_params * cond * n
            + 2.0 * spec.per_sample_block_params * n
        )
        block_mem = 2.0 * self._saved_elems * local * b
        trained = spec.weight_grad_share
        for i, kind in enumerate(self._kinds):
            blocks = self._kind_counts[i]
            fwd_passes = blocks + counts[i]  # forward of every block, again if recomputed
            attn_fwd = 4.0 * h * (sums.pairs[i] + tokens * cond) / sp
            a2a_bytes, a2a_calls = self._alltoall(kind, shapes, u, local, floor=floor)
            w.mm += block_matmul * (fwd_passes + (1 + trained) * blocks)
            w.attn += attn_fwd * fwd_passes
            w.attn_bwd += attn_fwd * ATTENTION_BACKWARD_FACTOR * blocks
            w.mem += block_mem * (fwd_passes + 2 * blocks)
            w.mem += spec.block_params * (cast * fwd_passes + grad * blocks)
            w.segment_passes += n * (fwd_passes + 2 * blocks)
            w.modulation += spec.per_token_modulation * local * (fwd_passes + 2 * blocks)
            w.scattered += spec.per_token_modulation * serial * blocks
            total_a2a = a2a_bytes * (fwd_passes + blocks)
            w.colls += a2a_calls * (fwd_passes + blocks)
            w.passes += fwd_passes + 2 * blocks
            if u > hw.gpus_per_node:
                off = (u - hw.gpus_per_node) / (u - 1)
                w.ib += total_a2a * off
                w.nvl += total_a2a * (1 - off)
            else:
                w.nvl += total_a2a

    def _alltoall(
        self,
        kind: str,
        shapes: tuple[SampleShape, ...],
        sp: int,
        local: float,
        *,
        floor: bool = False,
    ) -> tuple[float, int]:
        """Bytes one rank sends and collective calls in one forward of one block, on an
        all-to-all over ``sp`` ranks (``local`` tokens per rank). ``floor``: the calls
        of the cheapest layout, whatever the samples (calls are shared by a pass)."""
        if sp == 1:
            return 0.0, 0
        spec, b = self.spec, self.dtype_bytes
        share = (sp - 1) / sp
        # q, k, v in (one stacked all-to-all when k and v have all heads, else three),
        # the attention output back
        calls = 2 if spec.kv_dim == spec.hidden else 4
        ulysses = (local * (2 * spec.hidden + 2 * spec.kv_dim) * b * share, calls)
        if spec.sp_layout == "ulysses":
            return ulysses
        frame_sharded = all(s.grid is not None and s.grid[0] % sp == 0 for s in shapes)
        calls = 0 if kind == "spatial" else 2  # frame-sharded
        if not frame_sharded:  # frames cannot be split evenly: fall back to Ulysses
            return ulysses[0], min(calls, ulysses[1]) if floor else ulysses[1]
        if kind == "spatial":
            return 0.0, 0
        return local * spec.hidden * b * share * 2, 2

    def _memory(self, shapes: tuple[SampleShape, ...], sp: int, counts: tuple[int, ...]) -> int:
        spec, b = self.spec, self.dtype_bytes
        h = spec.hidden
        sums = self._sums(shapes)
        local = sums.tokens / sp
        n = sums.n
        saved_block = self._saved_elems * local * b
        input_only = h * local * b
        cond_kv = 2 * h * spec.cross_attn_tokens * n * b
        saved = 0.0
        for i in range(len(self._kinds)):
            recomputed = counts[i]
            kept = self._kind_counts[i] - recomputed
            saved += kept * (saved_block + cond_kv) + recomputed * (input_only + cond_kv)
        # embeddings / caption embedder outputs kept for backward
        saved += 2 * h * local * b + spec.cross_attn_tokens * n * (spec.cross_attn_width + h) * b
        head = self._loss_head_bytes(local)
        grad_work = (2 * h + spec.ffn_hidden) * local * b
        recompute_peak = saved_block - input_only if any(counts) else 0.0
        transient = max(head, recompute_peak + grad_work)
        return int(self.model_state_bytes() + saved + transient)

    def _loss_head_bytes(self, local: float) -> float:
        """Bytes the LM loss head holds at its peak over ``local`` tokens of one rank (0
        without a vocabulary). The models upcast the logits and take ``cross_entropy`` in
        float32: backward's log_softmax holds its saved output, the gradient coming in and
        the gradient it writes, three float32 tokens x vocab tensors (12 bytes a logit);
        forward peaks at the float32 logits, their log_softmax and, while upcasting, the
        model-dtype logits (8 + b). Measured: 12 bytes a logit, fp32 and bf16
        (tests/runtime/models/test_loss_head_memory.py)."""
        return self.spec.vocab_size * local * max(3 * 4, 2 * 4 + self.dtype_bytes)

    def pass_floor(
        self,
        shapes: Sequence[SampleShape],
        sp_size: int,
        recompute: Sequence[bool],
        *,
        ring_size: int = 1,
        ring_linear: bool = False,
    ) -> tuple[float, float]:
        """Seconds and bytes of a pass of ``shapes`` (possibly none) that its time and
        memory are never below, and that grow at least by each sample's own share when
        samples join (the contract of :func:`~datacentric.planning.proved_price.proved_prices`):
        the time formula without GEMM saturation (``sat <= 1`` only divides), without
        the serialised modulation scatter (never negative, not additive over samples)
        and without a ring step's exposed transfer ``max(0, x)`` (not additive either),
        or with ``ring_linear`` charging ``x`` itself (additive, possibly negative);
        memory as priced, ring buffers included. Both are affine in the recomputed
        counts and, for one text sample, a polynomial of degree two in its length."""
        shapes = tuple(shapes)
        counts = self._counts(recompute)
        ring = int(ring_size)
        work = self._work(shapes, sp_size, counts, sp_size // ring, floor=True)
        seconds = float(work.as_array() @ self._rates)
        memory = float(self._memory(shapes, sp_size, counts))
        if ring > 1:
            seconds += self._ring_exposed_s(shapes, sp_size, ring, counts, ring_linear)
            local = sum(s.tokens for s in shapes) / sp_size
            chunk = self._ring_chunk_bytes(shapes, sp_size, ring)
            memory += 4 * chunk + 4 * local * self.spec.hidden
        return seconds, memory
