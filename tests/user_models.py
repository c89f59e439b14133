"""A user's own causal LM, written against the model contract only (docs/models.md), and
its factory: what ``datacentric train --model tests.user_models:tiny_gpt`` trains.

It has no ``config`` the library knows, so its cost is read from its parameter shapes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.batch import IGNORE_INDEX
from datacentric.models.attention import varlen_attention


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.attention = varlen_attention

    def forward(self, x_SD: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        s, d = x_SD.shape
        q, k, v = self.qkv(self.norm1(x_SD)).view(s, 3, self.heads, d // self.heads).unbind(1)
        x_SD = x_SD + self.out(self.attention(q, k, v, cu_seqlens, True).reshape(s, d))
        return x_SD + self.down(F.gelu(self.up(self.norm2(x_SD))))


class TinyGPT(nn.Module):
    """Learned positions read from the batch's global ``position_ids``."""

    loss_mode = "token"

    def __init__(self, width: int = 32, heads: int = 2, layers: int = 2, vocab: int = 256) -> None:
        super().__init__()
        self.num_heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(4096, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def set_attention(self, fn) -> None:  # noqa: ANN001
        for block in self.blocks:
            block.attention = fn

    def forward(self, batch) -> torch.Tensor:  # noqa: ANN001
        x = self.embed(batch.inputs.long()) + self.positions(batch.position_ids.long())
        for block in self.blocks:
            x = block(x, batch.cu_seqlens)
        logits = self.head(self.norm(x)).float()
        loss = F.cross_entropy(
            logits, batch.targets.long(), ignore_index=IGNORE_INDEX, reduction="none"
        )
        return torch.where(batch.loss_mask, loss, torch.zeros_like(loss))


def tiny_gpt(width: int = 32, heads: int = 2, layers: int = 2) -> TinyGPT:
    """The factory (keyword arguments come from ``--model-arg``)."""
    return TinyGPT(width=width, heads=heads, layers=layers)


class NanGradGPT(TinyGPT):
    """:class:`TinyGPT` whose loss is finite but whose gradient is not: the loss is scaled
    by ``1 + 0 * sqrt(gate)`` with ``gate`` 0, whose derivative there is ``0 * inf``."""

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, batch) -> torch.Tensor:  # noqa: ANN001
        return super().forward(batch) * (1 + 0 * torch.sqrt(self.gate))


def nan_grad_gpt(width: int = 32, heads: int = 2, layers: int = 2) -> NanGradGPT:
    """The factory of :class:`NanGradGPT`."""
    return NanGradGPT(width=width, heads=heads, layers=layers)
