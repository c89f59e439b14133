"""A Llama-style causal language model over packed byte sequences.

RMSNorm, rotary position embeddings from ``position_ids`` (restarting at every
sample), SwiGLU feed-forward, causal attention within each sample through an
injected :data:`~datacentric.models.attention.AttentionFn`. The forward pass
returns the unreduced per-token cross-entropy; normalisation happens outside.

Shape legend: S = tokens of the (possibly sharded) packed batch, D = width,
V = vocabulary, P = rotary pairs per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.batch import IGNORE_INDEX, PackedBatch  # IGNORE_INDEX: deprecated alias here
from datacentric.models.attention import AttentionFn, varlen_attention
from datacentric.models.configs import LlamaConfig
from datacentric.models.layers import (
    PackedSelfAttention,
    RMSNorm,
    SwiGLU,
    rope_angles,
    set_attention_everywhere,
)

"""Target value of tokens that carry no loss (each sample's last token, padding)."""


class LlamaBlock(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + ffn(norm(x))``."""

    def __init__(self, config: LlamaConfig, attention: AttentionFn) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.attn = PackedSelfAttention(
            config.hidden_size, config.num_heads, causal=True, bias=False, attention=attention
        )
        self.ffn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.ffn = SwiGLU(config.hidden_size, config.ffn_hidden_size)

    def forward(
        self, x_SD: torch.Tensor, angles_SP: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        x_SD = x_SD + self.attn(self.attn_norm(x_SD), angles_SP, cu_seqlens)
        return x_SD + self.ffn(self.ffn_norm(x_SD))


class Llama(nn.Module):
    """Causal LM; ``forward(batch)`` is the per-token loss ``(S,)`` in float32."""

    loss_mode = "token"

    def __init__(self, config: LlamaConfig, attention: AttentionFn = varlen_attention) -> None:
        super().__init__()
        self.config = config
        self.num_heads = config.num_heads
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(LlamaBlock(config, attention) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Normal(0, init_std) weights, unit norm scales (uses the global torch RNG)."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=self.config.init_std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def set_attention(self, attention: AttentionFn) -> None:
        """Use ``attention`` in every attention layer."""
        set_attention_everywhere(self, attention)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Unreduced next-token cross-entropy ``(S,)`` (float32), 0 where ``loss_mask`` is False."""
        if batch.inputs.dim() != 1:
            raise ValueError(
                f"Llama expects token ids of shape (S,), got inputs {tuple(batch.inputs.shape)}"
            )
        x_SD = self.embed(batch.inputs)
        angles_SP = rope_angles(
            batch.position_ids, self.config.head_dim // 2, self.config.rope_theta
        )
        for block in self.blocks:
            x_SD = block(x_SD, angles_SP, batch.cu_seqlens)
        logits_SV = self.head(self.norm(x_SD)).float()
        loss_S = F.cross_entropy(
            logits_SV, batch.targets.long(), ignore_index=IGNORE_INDEX, reduction="none"
        )
        return torch.where(batch.loss_mask, loss_S, torch.zeros_like(loss_S))
