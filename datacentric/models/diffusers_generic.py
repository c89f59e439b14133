"""Any diffusers video transformer with a context-parallel plan, under our model contract.

:class:`DiffusersVideoTransformer` wraps an unmodified diffusers video transformer
(``WanTransformer3DModel``, ``LTXVideoTransformer3DModel``, any class with a
``_cp_plan`` and a text-to-video ``forward``, and the families declared as data in
:mod:`~.diffusers_families`: SkyReels-V2, CogVideoX, HunyuanVideo, Flux) and trains it
on packed micro-batches of latent patch tokens, sharded by the runtime like any of our
models. Per micro-batch:

1. the rank's shard is completed: its tokens (noisy latents, velocity targets,
   positions) are gathered from the rest of its SP group through the injected
   attention's ``gather`` (nothing to gather without a group);
2. the clips are grouped by shape (video buckets already hold one shape, so a bucket's
   micro-batch is one group) and each group's clips are stacked into the model's own
   input layout: a ``(B, C, F, H, W)`` latent video, or, for a ``forward`` that takes
   ``num_frames``/``height``/``width``, the ``(B, S, C * patch volume)`` tokens of its
   pipeline; the model's own ``forward`` runs once per group with the timesteps
   (``1000 t``, one per clip) and the clips' text embeddings;
3. inside ``forward`` the model's ``_cp_plan`` (:mod:`~.diffusers_plan`) splits the
   sequence across the group and gathers it before the output, and every
   self-attention goes to our :data:`~datacentric.models.attention.AttentionFn` (under
   sequence parallelism, Ulysses on the group): each attention processor of the model
   runs unchanged, its one ``scaled_dot_product_attention`` call routed to the
   injected callable. Cross-attention (keys from the ``encoder_hidden_states`` alone)
   runs as the model wrote it, each rank holding the text; a joint attention over the
   text and video tokens (a family's ``text_first``) gathers the group's video keys and
   values (:func:`~.diffusers_families.joint_attention`);
4. the per-token loss is the mean squared error of the velocity over each token's
   values, in float32; the rank returns its shard's rows.

The runtime's loss weights then make one step exact: each loss token lives on one
rank; the model's gather sends each rank's gradient rows back to the rank that
computed them (a reduce-scatter), and the one gradient all-reduce sums the rest.

Refused in one line, naming what is missing (:class:`UnsupportedVideoModel`): a model
without a plan (:func:`~.diffusers_plan.check_supported`,
:func:`~.diffusers_plan.cp_plan_of`), an image model
(``*Transformer2DModel``: Flux.2, QwenImage) whose packed image tokens no family declares
(:mod:`~.diffusers_families`, layout ``"tokens"``), a ``forward`` that needs inputs the
latent files do not hold (LTX-2's audio), image conditioning, a self-attention with a
mask or dropout, an attention backend that does not call
``scaled_dot_product_attention`` (set diffusers' backend to ``native``).

Shape legend: S = tokens, B = clips of one shape, C = latent channels, L = text
tokens, H = heads, D = head dim.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from datacentric.batch import PackedBatch, segment_offsets
from datacentric.models.attention import AttentionFn, AttentionSlot, varlen_attention
from datacentric.models.diffusers_families import (
    Family,
    family_named,
    joint_attention,
    text_inputs,
)
from datacentric.models.diffusers_plan import (
    SequenceSplit,
    UnsupportedVideoModel,
    check_supported,
    install_plan,
)

TIMESTEP_SCALE = 1000.0
"""Rectified-flow time ``t`` in [0, 1) -> the timestep diffusers models take."""

DATA_PATCH: tuple[int, int, int] = (1, 2, 2)
"""Latent pixels per data token (frame, row, column), as ``docs/data.md``'s datasets pack."""

_GRID_ARGS = ("num_frames", "height", "width")


def to_tokens(video: torch.Tensor, patch: Sequence[int]) -> torch.Tensor:
    """``(B, C, F, H, W)`` -> ``(B, S, C * patch volume)``: patches row-major over (frame,
    row, column), values ordered (channel, frame, row, column), as our datasets and the
    diffusers pipelines pack them."""
    b, c, f, h, w = video.shape
    pf, ph, pw = patch
    x = video.reshape(b, c, f // pf, pf, h // ph, ph, w // pw, pw)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, -1, c * pf * ph * pw)


def from_tokens(
    tokens: torch.Tensor, grid: Sequence[int], patch: Sequence[int], channels: int
) -> torch.Tensor:
    """The inverse of :func:`to_tokens` for a ``grid`` of patches."""
    (f, h, w), (pf, ph, pw) = grid, patch
    x = tokens.reshape(tokens.shape[0], f, h, w, channels, pf, ph, pw)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(-1, channels, f * pf, h * ph, w * pw)


def model_patch(config: Any, family: Any = None) -> tuple[int, int, int]:
    """The model's patch (frame, row, column) from its config (Wan: a tuple; LTX:
    ``patch_size`` and ``patch_size_t``), or its family's (Flux's packed tokens)."""
    if family is not None and family.patch is not None:
        return family.patch
    patch = config.get("patch_size", 1)
    if isinstance(patch, (list, tuple)):
        return tuple(int(p) for p in patch)  # type: ignore[return-value]
    return int(config.get("patch_size_t", 1) or 1), int(patch), int(patch)


def transformer_blocks(model: nn.Module, family: Family | None) -> nn.ModuleList:
    """The model's repeated transformer blocks: the lists its ``family`` names
    (:mod:`~.diffusers_families`: HunyuanVideo's and Flux's two, in order), else the list
    of its ``_repeated_blocks`` classes (``blocks`` for Wan, ``transformer_blocks`` for
    LTX)."""
    if family is not None and family.blocks:
        return nn.ModuleList([b for name in family.blocks for b in getattr(model, name)])
    names = set(getattr(model, "_repeated_blocks", None) or ())
    lists = [m for m in model.children() if isinstance(m, nn.ModuleList) and len(m)]
    for candidate in lists:
        if all(type(block).__name__ in names for block in candidate):
            return candidate
    raise UnsupportedVideoModel(
        f"{type(model).__name__}: no list of its _repeated_blocks {sorted(names)} found, "
        "so recomputation has no blocks to wrap"
    )


class SdpaRoute(TorchFunctionMode):
    """Sends the ``scaled_dot_product_attention`` calls made inside it to ``run`` (counted
    in ``calls``): how a diffusers attention processor runs unchanged with our attention."""

    def __init__(self, run: Any) -> None:
        super().__init__()
        self.run, self.calls = run, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            return self.run(**(dict(zip(names, args)) | kwargs))
        return func(*args, **kwargs)


def run_routed(inner: Any, run: Any, *args: Any, **kwargs: Any) -> Any:
    """``inner(*args, **kwargs)`` (a diffusers attention processor, unchanged) with its
    one ``scaled_dot_product_attention`` call sent to ``run``; any other number of calls
    is refused (:class:`UnsupportedVideoModel`)."""
    route = SdpaRoute(run)
    with route:
        out = inner(*args, **kwargs)
    if route.calls != 1:
        raise UnsupportedVideoModel(
            f"{type(inner).__name__} made {route.calls} calls to torch's "
            "scaled_dot_product_attention, expected 1 (set diffusers' attention backend "
            "to 'native')"
        )
    return out


class _RoutedProcessor:
    """A model's attention processor, unchanged, with its self-attention routed to the
    adapter's :meth:`DiffusersVideoTransformer._self_attention`."""

    def __init__(self, inner: Any, owner: DiffusersVideoTransformer) -> None:
        self.inner, self.owner = inner, owner
        self.signature = inspect.signature(inner.__call__)
        # diffusers' Attention passes a processor the keyword arguments its __call__
        # names (CogVideoX's image_rotary_emb): it reads them here, the inner's
        self.__dict__["__call__"] = functools.wraps(inner.__call__)(
            lambda *args, **kwargs: self._route(*args, **kwargs)
        )

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any):  # noqa: ANN204
        return self._route(attn, hidden_states, *args, **kwargs)

    def _route(self, attn: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any):  # noqa: ANN202
        bound = self.signature.bind_partial(attn, hidden_states, *args, **kwargs).arguments
        text = bound.get("encoder_hidden_states")
        owner = self.owner

        def run(*a: Any, **k: Any) -> torch.Tensor:
            return owner._self_attention(*a, text_len=None if text is None else text.shape[1], **k)

        return run_routed(self.inner, run, attn, hidden_states, *args, **kwargs)


class DiffusersVideoTransformer(AttentionSlot, nn.Module):
    """An unmodified diffusers video transformer with a context-parallel plan, under our
    model contract (see the module docstring).

    ``transformer`` is the diffusers model (parameters under the prefix
    ``transformer.``; ``save_pretrained`` it, or :func:`~.diffusers_build.export_diffusers`),
    ``blocks`` its transformer blocks, ``num_heads`` its heads, ``loss_mode``
    ``"sample"``; ``forward(batch)`` returns the per-token loss ``(S_local,)``.
    ``cp_plan`` replaces the class's ``_cp_plan``; ``data_patch`` is the latent patch of
    one data token.
    """

    loss_mode = "sample"
    rebuilds_whole_samples = True
    """The adapter gathers a shard's clips whole from its SP group and runs the model's
    own ``forward`` (positions come from the model), so a shard without its group has
    no meaning: ``check_model_contract`` runs its boundary check only."""
    block_calls_vary = True
    """The model's ``forward`` runs once per clip shape of a micro-batch, so each block
    runs as many times as the micro-batch has shapes: FSDP2 reduces this model's
    gradients once per unit after the last micro-batch, not in its per-call backward
    hooks (``parallel.grad_sync``), and refuses ``reshard_after_forward``."""
    max_ring_size = 1
    """Ulysses only: the planner offers no ring split for this path (its spec's
    ``max_ring_size``) and the runtime and ``equivalence`` refuse one before any rank
    runs it (``max_ring_size_reason`` says why)."""
    max_ring_size_reason = (
        "the diffusers model's own context-parallel plan splits each clip into contiguous "
        "chunks and gathers them over the Ulysses group, while a ring needs the ring's "
        "zigzag layout and a gather around the ring"
    )

    def __init__(
        self,
        transformer: nn.Module,
        attention: AttentionFn = varlen_attention,
        *,
        cp_plan: dict[str, Any] | None = None,
        data_patch: Sequence[int] = DATA_PATCH,
    ) -> None:
        super().__init__()
        self.family = family_named(type(transformer).__name__)  # its one lookup
        plan = check_supported(type(transformer), transformer.config, cp_plan, self.family)
        config = transformer.config
        params = inspect.signature(type(transformer).forward).parameters
        self.transformer = transformer
        # a plain attribute: registered once, under transformer., so state_dict has no copy
        self.__dict__["blocks"] = transformer_blocks(transformer, self.family)
        self.num_heads = int(config.num_attention_heads)
        self.patch = model_patch(config, self.family)
        self.data_patch = tuple(int(p) for p in data_patch)
        self.layout = self.family.layout if self.family else "video"
        tokens = self.layout == "tokens"
        self.channels = int(config.in_channels) // (math.prod(self.patch) if tokens else 1)
        self.grid_input = all(a in params for a in _GRID_ARGS)
        """Whether ``forward`` takes patch tokens and their grid (LTX) or a latent video."""
        self.token_input = self.grid_input or tokens
        self.text_mask = "encoder_attention_mask" in params
        self._split: SequenceSplit | None = None
        self._padded_to_real: dict[int, int] = {}
        self._text_len = 0  # the text tokens of the micro-batch being run (joint attention)
        install_plan(transformer, plan, lambda: self._split)
        for module in self.blocks.modules():  # the text encoders' attention runs unchanged
            if callable(getattr(module, "set_processor", None)) and hasattr(module, "processor"):
                module.set_processor(_RoutedProcessor(module.processor, self))
        self.set_attention(attention)

    @property
    def config(self) -> Any:
        """The diffusers model's config."""
        return self.transformer.config

    def recompute_context(self) -> tuple[Any, Any]:
        """The contexts a recomputed block's forward and its recomputation run in (torch's
        checkpoint ``context_fn``): the recomputation runs with the clips' sequence split
        and text length the forward ran with, since the plan's hooks inside a block (Helios
        splits and gathers around each block's attention) read them, and by backward the
        adapter has moved on (``_split`` is unset after each group's forward)."""
        state = (self._split, self._text_len)

        @contextlib.contextmanager
        def replay() -> Iterator[None]:
            previous = (self._split, self._text_len)
            self._split, self._text_len = state
            try:
                yield
            finally:
                self._split, self._text_len = previous

        return contextlib.nullcontext(), replay()

    def _group(self) -> tuple[int, int]:
        attention = self.attention
        return int(getattr(attention, "sp_size", 1)), int(getattr(attention, "rank_in_group", 0))

    def _self_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        *,
        text_len: int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``(B, H, S_local, D)`` self-attention of one clip group through our callable.
        A cross-attention (keys of the ``text_len`` text tokens) runs as the model wrote
        it; a joint attention (a family's ``text_first`` is set) through
        :func:`~.diffusers_families.joint_attention` under sequence parallelism."""
        sp, rank = self._group()
        if text_len is not None and key.shape[2] == text_len:  # cross-attention: local
            return F.scaled_dot_product_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs
            )
        if self.family is not None and self.family.text_first is not None:
            text = self._text_len if text_len is None else text_len
            if sp == 1:
                return F.scaled_dot_product_attention(
                    query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs
                )
            if dropout_p or is_causal:
                raise UnsupportedVideoModel("a joint attention with dropout or causality")
            padded = (query.shape[2] - text) * sp
            real = self._padded_to_real.get(padded, padded)
            gather = self.attention.gather  # type: ignore[attr-defined]
            split = SequenceSplit(real, padded, sp, rank, gather)
            return joint_attention(
                query, key, value, attn_mask, scale, text_len=text,
                text_first=self.family.text_first, gather=lambda x: split.unsplit(x, 2),
            )  # fmt: skip
        if attn_mask is not None or dropout_p or is_causal:
            raise UnsupportedVideoModel("a self-attention with a mask, dropout or causality")
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (B, S_local, H, D)
        if scale is not None and not math.isclose(scale, q.shape[-1] ** -0.5):
            q = q * (scale * math.sqrt(q.shape[-1]))
        clips, local = q.shape[:2]
        padded = local * sp
        real = self._padded_to_real.get(padded, padded) if sp > 1 else local
        if sp == 1:  # every clip in one call, one segment each
            bounds = list(range(0, clips * local + 1, local))
            cu = _cu_seqlens(bounds, q.device)
            out = self.attention(*(t.flatten(0, 1) for t in (q, k, v)), cu, False)
            return out.unflatten(0, (clips, local)).transpose(1, 2)
        cu = _cu_seqlens([0, real, padded] if padded > real else [0, real], q.device)
        outs = [self.attention(q[b], k[b], v[b], cu, False) for b in range(clips)]
        return torch.stack(outs).transpose(1, 2)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Per-token mean squared error of the velocity ``(S_local,)`` (float32), 0 where
        ``loss_mask`` is False."""
        if batch.sample_cond is None or batch.sample_context is None:
            raise ValueError("a video batch needs sample_cond (times) and sample_context (text)")
        width = batch.inputs.shape[1]
        expected = self.channels * math.prod(self.data_patch)
        if width != expected:
            raise ValueError(
                f"tokens of {width} values; the model takes {self.channels} channels x "
                f"{self.data_patch} latent pixels = {expected}"
            )
        sp, rank = self._group()
        positions = batch.position_ids.to(batch.inputs.dtype)
        rows = torch.cat([batch.inputs, batch.targets, positions], dim=1)
        if sp > 1:
            rows = self.attention.gather(rows, 0)  # type: ignore[attr-defined]
        elif batch.num_tokens != batch.full_length:
            raise ValueError(
                f"a shard of {batch.num_tokens} of {batch.full_length} tokens without its SP "
                "group: this model gathers its clips whole (run it through the runtime)"
            )
        offsets = segment_offsets(batch.cu_seqlens)
        by_grid: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
        for i, sample_id in enumerate(batch.sample_ids):
            grid, order = _row_major(rows[offsets[i] : offsets[i + 1], 2 * width :], sample_id)
            by_grid.setdefault(grid, []).append((i, order + offsets[i]))
        self._padded_to_real = {}
        indices, values = [], []
        for grid, clips in by_grid.items():
            tokens = torch.stack([rows[order] for _, order in clips])  # (B, S, 2 W + 3)
            loss_BS = self._run_group(batch, tokens, grid, [i for i, _ in clips], sp, rank)
            indices += [order for _, order in clips]
            values.append(loss_BS.flatten())
        loss_S = rows.new_zeros(rows.shape[0], dtype=torch.float32)
        loss_S = loss_S.index_put((torch.cat(indices),), torch.cat(values))
        mine = loss_S[batch.token_offset : batch.token_offset + batch.num_tokens]
        return torch.where(batch.loss_mask, mine, torch.zeros_like(mine))

    def _run_group(
        self,
        batch: PackedBatch,
        tokens: torch.Tensor,
        grid: tuple[int, ...],
        clips: list[int],
        sp: int,
        rank: int,
    ) -> torch.Tensor:
        """The model's own forward on same-shape clips; their per-token losses ``(B, S)``."""
        width = batch.inputs.shape[1]
        dtype = next(self.transformer.parameters()).dtype
        video = from_tokens(tokens[..., :width], grid, self.data_patch, self.channels)
        target = from_tokens(tokens[..., width : 2 * width], grid, self.data_patch, self.channels)
        dims = video.shape[2:]
        if any(d % p for d, p in zip(dims, self.patch)):
            raise ValueError(
                f"samples {[batch.sample_ids[i] for i in clips]}: latents of {tuple(dims)} "
                f"(frames, height, width) are not whole patches of {self.patch}"
            )
        model_grid = [d // p for d, p in zip(dims, self.patch)]
        seq_len = math.prod(model_grid)
        padded = -(-seq_len // sp) * sp
        while self._padded_to_real.get(padded, seq_len) != seq_len:  # one length per padding
            padded += sp
        self._padded_to_real[padded] = seq_len
        gather = getattr(self.attention, "gather", None)
        self._split = SequenceSplit(seq_len, padded, sp, rank, gather)  # type: ignore[arg-type]
        scale = self.family.timestep_scale if self.family else TIMESTEP_SCALE
        kwargs: dict[str, Any] = {"timestep": batch.sample_cond[clips] * scale}
        if self.text_mask:
            kwargs["encoder_attention_mask"] = None
        context = batch.sample_context[clips].to(dtype)  # type: ignore[index]
        kwargs.update(text_inputs(self.family, self.config, context, self.text_mask))
        self._text_len = int(kwargs["encoder_hidden_states"].shape[1])
        if self.token_input:
            kwargs["hidden_states"] = to_tokens(video.to(dtype), self.patch)
            if self.grid_input:
                kwargs.update(zip(_GRID_ARGS, model_grid))
        else:
            layout = (0, 2, 1, 3, 4) if self.layout == "frames_first" else (0, 1, 2, 3, 4)
            kwargs["hidden_states"] = video.to(dtype).permute(layout)
        if self.family is not None and self.family.extra_inputs is not None:
            extra = self.family.extra_inputs(self.config, model_grid, len(clips), video.to(dtype))
            kwargs.update(extra)
        try:
            out = self.transformer(**kwargs)
        finally:
            self._split = None
        out = out.sample if hasattr(out, "sample") else out[0]
        if self.layout == "frames_first":
            out = out.transpose(1, 2)
        if self.token_input:
            out = from_tokens(out, model_grid, self.patch, out.shape[-1] // math.prod(self.patch))
        error = (out.float() - target.float()).pow(2)
        return to_tokens(error, self.data_patch).mean(dim=-1)


def _cu_seqlens(bounds: list[int], device: torch.device) -> torch.Tensor:
    """``cu_seqlens`` on ``device`` with its host copy (no device read to use it)."""
    cu = torch.tensor(bounds, dtype=torch.long, device=device)
    cu.host_offsets = tuple(bounds)
    return cu


def _row_major(positions: torch.Tensor, sample_id: int) -> tuple[tuple[int, ...], torch.Tensor]:
    """A clip's grid (frames, rows, columns, in data tokens) and the order of its rows
    that puts its tokens row-major, from their (frame, row, column) positions."""
    pos = positions.long()
    grid = tuple(int(n) + 1 for n in pos.max(dim=0).values)
    linear = (pos[:, 0] * grid[1] + pos[:, 1]) * grid[2] + pos[:, 2]
    if pos.shape[0] != math.prod(grid) or bool((torch.bincount(linear) != 1).any()):
        raise ValueError(
            f"sample {sample_id}: its {pos.shape[0]} tokens do not fill a "
            f"{grid} grid of (frame, row, column) positions once each"
        )
    order = torch.empty_like(linear)
    order[linear] = torch.arange(linear.shape[0], device=linear.device)
    return grid, order
