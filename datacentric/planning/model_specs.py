"""Analytic descriptions of transformer models: enough to count FLOPs, bytes and params.

A :class:`ModelSpec` lists the repeated blocks by *kind* (which attention they run)
and the widths that set every matmul. The analytic cost model
(:mod:`datacentric.planning.analytic`) turns a spec plus a hardware preset into time
and memory; the planner groups blocks by kind for the recomputation knapsack.

Block kinds:

- ``full``: attention over all tokens of a sample (text encoder style or 3D DiT);
- ``causal``: attention over all earlier tokens of a sample (decoder LM; half the work);
- ``spatial``: attention within each frame (``height*width`` tokens, per frame);
- ``temporal``: attention across frames at each spatial location (``frames`` tokens).

Text samples have no grid; ``spatial``/``temporal`` blocks treat them as one frame.

Biases and norm weights are ignored in parameter counts (< 0.1% of any preset here).

This module holds the type only; every spec is derived in
:mod:`datacentric.planning.spec_derivation`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

BLOCK_KINDS = ("full", "causal", "spatial", "temporal")
SP_LAYOUTS = ("ulysses", "frame-sharded")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shapes of a transformer that decide its cost. (Derived counts are computed once:
    the cost model reads them in every formula.)"""

    name: str
    """Preset name."""
    hidden: int
    """Model width ``h``."""
    heads: int
    """Query heads; Ulysses SP needs ``heads % sp == 0``."""
    kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means ``heads``."""
    ffn_hidden: int
    """Feed-forward inner width ``f``."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three matrices (``gate``, ``up``, ``down``) instead of two."""
    block_kinds: tuple[str, ...]
    """Kind of every repeated block, in order (see module doc)."""
    cross_attn_tokens: int = 0
    """Conditioning tokens every block cross-attends to (0: no cross-attention)."""
    cross_attn_width: int = 0
    """Width of the conditioning encoder's output (projected to ``hidden`` once)."""
    vocab_size: int = 0
    """Vocabulary of a language model (embedding and output head); 0 for DiTs."""
    tie_embeddings: bool = False
    """The output head shares the embedding matrix."""
    patch_channels: int = 0
    """DiT: values per latent patch (channels x patch volume) in and out."""
    adaln_single: bool = False
    """DiT timestep modulation shared by all blocks (adaLN-single, PixArt-alpha)."""
    per_sample_block_params: int = 0
    """Block weights applied once per sample, not per token (per-block adaLN MLPs)."""
    extra_outer_params: int = 0
    """Parameters outside the blocks beyond the generic count (final norms, biases)."""
    extra_saved_per_token: int = 0
    """Activation elements per token a block saves beyond the generic count (see
    :meth:`saved_elements_per_token`)."""
    per_token_modulation: int = 0
    """Elements per token each block gathers from its sample's modulation row (DiT
    per-block adaLN: shift, scale, gate twice, ``6h``); backward scatter-adds them back
    into the row, serialised along the sample."""
    outer_per_token_modulation: int = 0
    """The same outside the blocks (DiT final adaLN: shift and scale, ``2h``)."""
    outer_ops: int = 0
    """Operators one forward + backward launches outside the blocks (embeddings, heads,
    losses; counted on the runnable presets): fixed launch cost of a pass."""
    max_ring_size: int = 0
    """Largest ring degree the model's training path runs (0: any the blocks allow; 1:
    Ulysses only, e.g. a path whose own context-parallel plan splits the sequence)."""
    sp_layout: str = "ulysses"
    """How SP shards a sample: ``ulysses`` (sequence shards, 4 all-to-alls of q, k, v,
    out per self-attention) or ``frame-sharded`` (Open-Sora: frames sharded, spatial
    attention local, temporal blocks switch layout with 2 all-to-alls of the
    hidden state)."""
    source: str = ""
    """Where the architecture numbers come from."""
    trainable_params: int | None = None
    """Parameters that train (LoRA: the adapters'); ``None``: every parameter. Only they
    have gradients, optimizer state, weight-gradient matmuls and a gradient sync."""

    def __post_init__(self) -> None:
        bad = [k for k in self.block_kinds if k not in BLOCK_KINDS]
        if bad or not self.block_kinds:
            raise ValueError(f"{self.name}: block kinds must be in {BLOCK_KINDS}, got {bad}")
        if self.hidden % self.heads:
            raise ValueError(f"{self.name}: hidden {self.hidden} not divisible by heads")
        if self.sp_layout not in SP_LAYOUTS:
            raise ValueError(f"{self.name}: sp_layout must be one of {SP_LAYOUTS}")

    # --- derived sizes ---------------------------------------------------------------------
    @cached_property
    def num_blocks(self) -> int:
        return len(self.block_kinds)

    @cached_property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @cached_property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * self.head_dim

    @cached_property
    def kinds(self) -> tuple[str, ...]:
        """Distinct block kinds in first-appearance order."""
        return tuple(dict.fromkeys(self.block_kinds))

    def kind_counts(self) -> dict[str, int]:
        return {k: self.block_kinds.count(k) for k in self.kinds}

    def saved_elements_per_token(self) -> int:
        """Activation elements one non-recomputed block saves per token for backward.

        Self-attention: norm input and output, q, k, v, attention output (``4h + 2kv``);
        cross-attention: its input, q and output (``3h``); MLP: norm input and output plus
        ``2f`` (up, activation) or ``4f`` gated (gate, up, activation, product);
        adaLN modulation: modulated inputs and gated outputs (``4h``). Approximate: it
        ignores small per-head statistics (softmax log-sum-exp) and norm statistics.
        """
        h, f = self.hidden, self.ffn_hidden
        attn = 4 * h + 2 * self.kv_dim
        cross = 3 * h if self.cross_attn_tokens else 0
        mlp = 2 * h + (4 if self.gated_mlp else 2) * f
        adaln = 4 * h if self.adaln_single else 0
        return attn + cross + mlp + adaln + self.extra_saved_per_token

    @cached_property
    def token_matmul_params(self) -> int:
        """Weights every token multiplies by in one block (self-attn, cross-attn q/o, MLP)."""
        h, f = self.hidden, self.ffn_hidden
        attn = 2 * h * h + 2 * h * self.kv_dim  # q, o and k, v
        cross = 2 * h * h if self.cross_attn_tokens else 0  # q and out of cross-attention
        mlp = (3 if self.gated_mlp else 2) * h * f
        return attn + cross + mlp

    @cached_property
    def cond_matmul_params(self) -> int:
        """Per-block weights applied to the conditioning tokens (cross-attention k, v)."""
        return 2 * self.hidden * self.hidden if self.cross_attn_tokens else 0

    @cached_property
    def block_params(self) -> int:
        return self.token_matmul_params + self.cond_matmul_params + self.per_sample_block_params

    @cached_property
    def outer_params(self) -> int:
        """Parameters outside the repeated blocks (embeddings, heads, embedders)."""
        h = self.hidden
        total = 0
        if self.vocab_size:
            total += self.vocab_size * h * (1 if self.tie_embeddings else 2)
        if self.patch_channels:
            total += 2 * self.patch_channels * h  # patch embedding in, final projection out
            total += 256 * h + h * h  # timestep embedder MLP (256 frequencies, DiT)
            total += 6 * h * h if self.adaln_single else 0  # shared modulation MLP
        if self.cross_attn_tokens:
            total += self.cross_attn_width * h + h * h  # caption embedder MLP
        return total + self.extra_outer_params

    @cached_property
    def num_params(self) -> int:
        return self.num_blocks * self.block_params + self.outer_params

    @cached_property
    def trained_params(self) -> int:
        """Parameters with a gradient (all of them unless ``trainable_params`` is set)."""
        if self.trainable_params is None:
            return self.num_params
        return max(0, min(int(self.trainable_params), self.num_params))

    @cached_property
    def weight_grad_share(self) -> float:
        """Share of the weights whose gradient a backward computes: a frozen weight's
        matmul needs only its input's gradient (one matmul of two). Applied to every
        layer alike (approximate: LoRA's own small matmuls are not counted)."""
        return self.trained_params / self.num_params if self.num_params else 1.0

    def truncated(self, num_blocks: int) -> ModelSpec:
        """The same model with only its first ``num_blocks`` blocks (dual-layer profiling)."""
        return replace(self, block_kinds=self.block_kinds[:num_blocks])
