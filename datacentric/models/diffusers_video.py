"""The packed fast path for diffusers' Wan: one adapter written for one family.

Any diffusers video transformer with a context-parallel plan, Wan included, trains
through the generic path (:mod:`datacentric.models.diffusers_generic`, what
``diffusers:wan`` builds). This module stays as a fast path for Wan alone: it packs
clips of different shapes into one sequence instead of one model call per shape, and
measured 17-19% faster on CPU (``benchmarks/diffusers_paths.md``).

:class:`DiffusersVideoModel` trains a ``diffusers`` ``WanTransformer3DModel`` (built
from a config with random weights, nothing downloaded) on packed micro-batches of
patch tokens, sharded by the runtime like any of our models. The diffusers model is
not edited or subclassed; the adapter runs its own submodules, in the order of its
``forward``, on the packed layout:

1. patch embedding: the model's ``Conv3d`` has stride equal to its kernel, so it is
   a linear map of each patch; it is applied as one (``F.linear`` with the same
   weights) to the batch's patch tokens, row-major over (frame, row, column) as
   ``forward`` flattens them;
2. rotary angles: the model's ``rope`` for a grid that holds every position of the
   shard, indexed by each token's global (frame, row, column): the rows ``forward``
   would give the token in its own sample;
3. conditioning: the model's ``condition_embedder`` per sample (timestep ``t * 1000``
   of rectified flow, the sample's text embedding), then gathered per token; the
   blocks take per-token modulation (their ``(B, S, 6, D)`` path);
4. the blocks, unmodified: their attention processors are wrapped so that the one
   ``scaled_dot_product_attention`` call inside becomes, for self-attention, our
   :data:`~datacentric.models.attention.AttentionFn` over the packed sequence (each
   sample attends to itself; under sequence parallelism, Ulysses), and for
   cross-attention a block-diagonal mask (each token reads its own sample's text);
5. output: the model's final modulation, ``norm_out`` and ``proj_out``, per token
   (each patch's values reordered as ``forward``'s unpatchify reads them); the loss
   is the per-token mean squared error against the velocity target.

``tests/runtime/models/test_diffusers.py`` checks the adapter against the model's own ``forward``
on each sample (loss and every gradient), and ``datacentric equivalence --model
diffusers:wan`` checks a mixed-SP step against one process.

Refused at construction (never silently wrong): image conditioning
(``added_kv_proj_dim``/``image_dim``), a patch size other than a frame-wise 1,
and, at run time, positions beyond ``rope_max_seq_len`` and micro-batches whose
cross-attention would read another sample's text.

Shape legend: S = tokens of the packed batch or shard, n = samples, L = text tokens,
D = model width, H = heads, Dh = head dim, P = values per patch token.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.batch import PackedBatch
from datacentric.models.attention import AttentionFn, AttentionSlot, varlen_attention
from datacentric.models.diffusers_families import family_of_tiny
from datacentric.models.diffusers_generic import TIMESTEP_SCALE, run_routed
from datacentric.models.diffusers_plan import UnsupportedVideoModel

try:
    from diffusers import WanTransformer3DModel
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "datacentric.models.diffusers_video needs diffusers: pip install 'datacentric[video]'"
    ) from _error

__all__ = [
    "TIMESTEP_SCALE",
    "TINY_WAN",
    "DiffusersVideoModel",
    "UnsupportedVideoModel",
    "build_wan",
]

TINY_WAN: dict[str, Any] = family_of_tiny("wan").tiny_config  # type: ignore[union-attr]
"""The tiny random-weight config of ``diffusers:wan`` (tests and ``equivalence``)."""


class _Layout:
    """What the attention processors need to know about the batch being run."""

    def __init__(self) -> None:
        self.cu_seqlens: torch.Tensor | None = None
        self.cross_mask: torch.Tensor | None = None  # (1, 1, S, n * L) bool


class _PackedProcessor:
    """Wraps a diffusers attention processor: runs it unchanged, with its attention
    call routed to the packed self-attention or the masked cross-attention."""

    def __init__(self, inner: Any, owner: DiffusersVideoModel, cross: bool) -> None:
        self.inner, self.owner, self.cross = inner, owner, cross

    def __call__(self, attn: nn.Module, hidden_states, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN204
        run = self._cross if self.cross else self._self
        return run_routed(self.inner, run, attn, hidden_states, *args, **kwargs)

    def _self(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_
    ):  # noqa: ANN001, ANN003, ANN202, E501
        layout = self.owner._layout
        if attn_mask is not None or dropout_p or is_causal or layout.cu_seqlens is None:
            raise UnsupportedVideoModel("self-attention with a mask, dropout or causality")
        q_SHD, k_SHD, v_SHD = (t[0].transpose(0, 1) for t in (query, key, value))
        if scale is not None and not math.isclose(scale, q_SHD.shape[-1] ** -0.5):
            q_SHD = q_SHD * (scale * math.sqrt(q_SHD.shape[-1]))
        out_SHD = self.owner.attention(q_SHD, k_SHD, v_SHD, layout.cu_seqlens, False)
        return out_SHD.transpose(0, 1).unsqueeze(0)

    def _cross(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_
    ):  # noqa: ANN001, ANN003, ANN202, E501
        layout = self.owner._layout
        if attn_mask is not None or dropout_p or is_causal:
            raise UnsupportedVideoModel("cross-attention with a mask, dropout or causality")
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=layout.cross_mask, scale=scale
        )


class DiffusersVideoModel(AttentionSlot, nn.Module):
    """An unmodified diffusers ``WanTransformer3DModel`` with our model contract.

    ``blocks`` are the model's transformer blocks, ``num_heads`` its heads,
    ``loss_mode`` is ``"sample"`` (each sample's mean squared error weighs the same),
    ``set_attention(fn)`` routes every self-attention through ``fn``, and
    ``forward(batch)`` returns the per-token loss ``(S,)``. Parameters live under the
    prefix ``transformer.``.
    """

    loss_mode = "sample"

    def __init__(
        self, transformer: WanTransformer3DModel, attention: AttentionFn = varlen_attention
    ) -> None:
        super().__init__()
        config = transformer.config
        if config.added_kv_proj_dim is not None or config.image_dim is not None:
            raise UnsupportedVideoModel(
                "image conditioning (added_kv_proj_dim / image_dim) is not supported: "
                "use a text-to-video config"
            )
        if tuple(config.patch_size)[0] != 1:
            raise UnsupportedVideoModel(
                f"patch_size {tuple(config.patch_size)}: only frame patches of 1 are supported"
            )
        self.transformer = transformer
        self.config = config
        self.blocks = transformer.blocks
        self.num_heads = int(config.num_attention_heads)
        self.patch = tuple(int(p) for p in config.patch_size)
        self._layout = _Layout()
        for block in self.blocks:
            block.attn1.set_processor(_PackedProcessor(block.attn1.processor, self, False))
            block.attn2.set_processor(_PackedProcessor(block.attn2.processor, self, True))
        self.set_attention(attention)

    def _rotary(self, positions_S3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's rotary rows for each token's (frame, row, column), gathered per
        axis from the rotary tables (the rows ``rope`` builds for a whole grid), so no
        grid size is read back from the device."""
        rope = self.transformer.rope
        limit = int(rope.max_seq_len)
        if positions_S3.device.type == "cpu":  # a host check costs nothing here
            top = int(positions_S3.max()) if positions_S3.numel() else 0
            if top >= limit:
                raise UnsupportedVideoModel(
                    f"a position of {top} patches along one axis is beyond the model's "
                    f"rope_max_seq_len of {limit}"
                )
        else:  # checked on the device, without waiting for it
            torch._assert_async(positions_S3.max() < limit, "position beyond rope_max_seq_len")
        split = [rope.t_dim, rope.h_dim, rope.w_dim]
        tables = []
        for table in (rope.freqs_cos, rope.freqs_sin):
            axes = table.split(split, dim=1)
            rows = [axis[positions_S3[:, i]] for i, axis in enumerate(axes)]
            tables.append(torch.cat(rows, dim=-1)[None, :, None, :])
        return tables[0], tables[1]

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Per-token mean squared error of the velocity ``(S,)`` (float32), 0 where
        ``loss_mask`` is False."""
        model = self.transformer
        if batch.sample_cond is None or batch.sample_context is None:
            raise ValueError("a video batch needs sample_cond (times) and sample_context (text)")
        segment_S = batch.segment_ids.clamp(min=0)  # padding reads sample 0 (loss masked)
        conv = model.patch_embedding
        weight = conv.weight.flatten(1)
        if batch.inputs.shape[-1] != weight.shape[1]:
            raise ValueError(
                f"tokens of {batch.inputs.shape[-1]} values, the patch embedding takes "
                f"{weight.shape[1]} (channels x patch volume)"
            )
        x_SD = F.linear(batch.inputs.to(weight.dtype), weight, conv.bias)
        rotary = self._rotary(batch.position_ids)
        timesteps = batch.sample_cond * TIMESTEP_SCALE
        temb_nD, proj_n6D, context_nLD, _ = model.condition_embedder(
            timesteps, batch.sample_context.to(x_SD.dtype)
        )
        n, text_len = context_nLD.shape[:2]
        proj_1S6D = proj_n6D.unflatten(1, (6, -1))[segment_S].unsqueeze(0)
        keys_sample = torch.arange(n, device=x_SD.device).repeat_interleave(text_len)
        self._layout.cu_seqlens = batch.cu_seqlens
        self._layout.cross_mask = (segment_S[:, None] == keys_sample[None, :])[None, None]
        context_1XD = context_nLD.reshape(1, n * text_len, -1)
        h_1SD = x_SD.unsqueeze(0)
        for block in self.blocks:
            h_1SD = block(h_1SD, context_1XD, proj_1S6D, rotary)
        shift_SD, scale_SD = (model.scale_shift_table + temb_nD[segment_S].unsqueeze(1)).unbind(1)
        h_SD = h_1SD[0]
        h_SD = (model.norm_out(h_SD.float()) * (1 + scale_SD) + shift_SD).type_as(h_SD)
        # proj_out emits each patch as (frame, row, column, channel), as forward's
        # unpatchify reads it; our tokens are (channel, frame, row, column)
        pt, ph, pw = self.patch
        out_SP = model.proj_out(h_SD).unflatten(-1, (pt, ph, pw, -1))
        out_SP = out_SP.permute(0, 4, 1, 2, 3).flatten(1)
        loss_S = (out_SP.float() - batch.targets.float()).pow(2).mean(dim=-1)
        return torch.where(batch.loss_mask, loss_S, torch.zeros_like(loss_S))


def build_wan(
    *,
    attention: AttentionFn = varlen_attention,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    **config_overrides: Any,
) -> DiffusersVideoModel:
    """A tiny random-weight ``WanTransformer3DModel`` (:data:`TINY_WAN` updated with
    ``config_overrides``) under :class:`DiffusersVideoModel`. Weights come from the
    global torch RNG: seed it for the same model on every rank."""
    transformer = WanTransformer3DModel(**{**TINY_WAN, **config_overrides})
    model = DiffusersVideoModel(transformer, attention=attention)
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model
