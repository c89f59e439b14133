"""A video diffusion transformer with full 3D attention over latent patches.

Tokens are latent patches of (frames, rows, columns); every token of a sample
attends to every other token of the same sample (non-causal). Positions enter as
3D rotary embeddings from ``position_ids (S, 3)``; the diffusion time of each
sample (``batch.sample_cond``) conditions every block through adaLN modulation
gathered per token by ``segment_ids`` (padding gets a zero conditioning vector).
The loss is the unreduced per-token MSE: mean over channels of
``(prediction - target) ** 2``. Noise and time are drawn by the dataset from the
sample id, so they never depend on the rank that runs a sample.

Shape legend: S = tokens of the (possibly sharded) packed batch, D = width,
C = channels per token, N = samples in the micro-batch (plus one padding row),
P = rotary pairs per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.batch import PackedBatch
from datacentric.models.attention import AttentionFn, varlen_attention
from datacentric.models.configs import DiTConfig
from datacentric.models.layers import (
    PackedSelfAttention,
    rope_angles_3d,
    set_attention_everywhere,
    timestep_embedding,
)


def modulate(x_SD: torch.Tensor, shift_SD: torch.Tensor, scale_SD: torch.Tensor) -> torch.Tensor:
    return x_SD * (1 + scale_SD) + shift_SD


class DiTBlock(nn.Module):
    """adaLN block: modulated attention and feed-forward, each with a gate."""

    def __init__(self, config: DiTConfig, attention: AttentionFn) -> None:
        super().__init__()
        D = config.hidden_size
        self.norm1 = nn.LayerNorm(D, eps=config.norm_eps, elementwise_affine=False)
        self.attn = PackedSelfAttention(
            D, config.num_heads, causal=False, bias=True, attention=attention
        )
        self.norm2 = nn.LayerNorm(D, eps=config.norm_eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(D, config.ffn_hidden_size),
            nn.GELU(approximate="tanh"),
            nn.Linear(config.ffn_hidden_size, D),
        )
        self.adaLN = nn.Linear(D, 6 * D)

    def forward(
        self,
        x_SD: torch.Tensor,
        cond_ND: torch.Tensor,
        row_S: torch.Tensor,
        angles_SP: torch.Tensor,
        cu_seqlens: torch.Tensor,
    ) -> torch.Tensor:
        """``cond_ND`` is per sample (last row: padding); ``row_S`` picks each token's row."""
        mod_SD = self.adaLN(F.silu(cond_ND))[row_S]
        shift1, scale1, gate1, shift2, scale2, gate2 = mod_SD.chunk(6, dim=-1)
        h_SD = self.attn(modulate(self.norm1(x_SD), shift1, scale1), angles_SP, cu_seqlens)
        x_SD = x_SD + gate1 * h_SD
        return x_SD + gate2 * self.ffn(modulate(self.norm2(x_SD), shift2, scale2))


class VideoDiT(nn.Module):
    """Diffusion transformer; ``forward(batch)`` is the per-token MSE ``(S,)`` in float32."""

    loss_mode = "sample"

    def __init__(self, config: DiTConfig, attention: AttentionFn = varlen_attention) -> None:
        super().__init__()
        self.config = config
        self.num_heads = config.num_heads
        D = config.hidden_size
        self.patch_embed = nn.Linear(config.in_channels, D)
        self.time_embed = nn.Sequential(
            nn.Linear(config.timestep_freq_dim, D), nn.SiLU(), nn.Linear(D, D)
        )
        self.blocks = nn.ModuleList(DiTBlock(config, attention) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(D, eps=config.norm_eps, elementwise_affine=False)
        self.final_adaLN = nn.Linear(D, 2 * D)
        self.out = nn.Linear(D, config.in_channels)
        self.init_weights()

    def init_weights(self) -> None:
        """Normal(0, init_std) weights, zero biases (uses the global torch RNG)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=self.config.init_std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def set_attention(self, attention: AttentionFn) -> None:
        """Use ``attention`` in every attention layer."""
        set_attention_everywhere(self, attention)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Unreduced per-token MSE ``(S,)`` (float32), 0 where ``loss_mask`` is False."""
        cfg = self.config
        if batch.inputs.dim() != 2 or batch.inputs.shape[1] != cfg.in_channels:
            raise ValueError(
                f"VideoDiT expects latents of shape (S, {cfg.in_channels}), "
                f"got inputs {tuple(batch.inputs.shape)}"
            )
        if batch.sample_cond is None:
            raise ValueError("VideoDiT needs batch.sample_cond (the diffusion time of each sample)")
        if batch.position_ids.dim() != 2 or batch.position_ids.shape[1] != 3:
            raise ValueError(
                f"VideoDiT expects position_ids (S, 3), got {tuple(batch.position_ids.shape)}"
            )
        dtype = self.patch_embed.weight.dtype
        x_SD = self.patch_embed(batch.inputs.to(dtype))
        num_samples = batch.sample_cond.shape[0]
        t_features = timestep_embedding(batch.sample_cond, cfg.timestep_freq_dim).to(dtype)
        cond_ND = self.time_embed(t_features)
        cond_ND = torch.cat((cond_ND, cond_ND.new_zeros(1, cond_ND.shape[1])), dim=0)
        # Padding (segment -1) reads the extra zero row; real tokens read their sample's row.
        segment_ids = batch.segment_ids.long()
        row_S = torch.where(segment_ids < 0, num_samples, segment_ids)
        angles_SP = rope_angles_3d(batch.position_ids, cfg.head_dim, cfg.rope_theta)
        for block in self.blocks:
            x_SD = block(x_SD, cond_ND, row_S, angles_SP, batch.cu_seqlens)
        shift_SD, scale_SD = self.final_adaLN(F.silu(cond_ND))[row_S].chunk(2, dim=-1)
        pred_SC = self.out(modulate(self.final_norm(x_SD), shift_SD, scale_SD))
        loss_S = (pred_SC.float() - batch.targets.float()).pow(2).mean(dim=-1)
        return torch.where(batch.loss_mask, loss_S, torch.zeros_like(loss_S))
