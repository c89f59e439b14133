"""A model that makes the wrong-positions mistake on purpose (the contract check's tests)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn


class LocalPositions(nn.Module):
    """Wraps a model and replaces the batch's positions by ``arange`` over the rows it
    sees, as a hand-written adapter that keeps the model's own positions would."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.blocks = model.blocks
        self.loss_mode = model.loss_mode

    def set_attention(self, fn) -> None:  # noqa: ANN001
        self.inner.set_attention(fn)

    def forward(self, batch):  # noqa: ANN001, ANN201
        rows = torch.arange(batch.position_ids.shape[0], device=batch.position_ids.device)
        return self.inner(replace(batch, position_ids=rows.to(batch.position_ids.dtype)))
