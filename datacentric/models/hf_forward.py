"""How :class:`~datacentric.models.hf.HFCausalLM` runs a packed batch: the wrapped
model's forward on one row of the batch's tokens, with the attention callable and the
packed layout as keyword arguments, its logits, its unreduced next-token loss, and the
router's auxiliary loss of each sample (:class:`PackedCausalLM`, a base of the wrapper:
its methods read the wrapper's ``hf``, ``attention``, ``router_aux_coef`` and
``token_sums``).

Shape legend: B = batch rows (always 1 here), H = query heads, Hkv = key/value
heads, S = tokens of the (possibly sharded) packed batch, D = head dim, V = vocab.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.batch import IGNORE_INDEX, PackedBatch, segment_offsets
from datacentric.models.hf_attention import _PACKED_CALL, UnsupportedModelFeature
from datacentric.models.token_metrics import loss_token_sums


class PackedCausalLM:
    """The forward of a wrapped transformers causal LM on a packed batch (a base of
    :class:`~datacentric.models.hf.HFCausalLM`, which sets what it reads)."""

    hf: nn.Module
    router_aux_coef: float | None
    token_sums: torch.Tensor | None

    def logits(self, batch: PackedBatch) -> torch.Tensor:
        """Next-token logits ``(S, V)`` of a packed batch or shard (model dtype)."""
        return self._run(batch).logits[0]

    def _run(self, batch: PackedBatch, **extra: Any) -> Any:
        """The wrapped model's output on a packed batch or shard (one row)."""
        if batch.inputs.dim() != 1:
            raise ValueError(
                f"a causal LM expects token ids of shape (S,), got {tuple(batch.inputs.shape)}"
            )
        token = _PACKED_CALL.set(True)
        try:
            out = self.hf(
                input_ids=batch.inputs.long().unsqueeze(0),
                position_ids=batch.position_ids.long().unsqueeze(0),
                use_cache=False,
                cu_seqlens=batch.cu_seqlens,
                datacentric_attention=self.attention,
                **extra,
            )
        finally:
            _PACKED_CALL.reset(token)
        return out

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Unreduced next-token cross-entropy ``(S,)`` (float32), 0 where ``loss_mask`` is
        False; with ``output_router_logits=True``, each loss token of a sample also
        carries the router's auxiliary loss of that sample (:meth:`router_aux_loss`)."""
        if self.router_aux_coef is None:
            out = self._run(batch)
        elif batch.num_tokens != batch.full_length:
            raise UnsupportedModelFeature(
                f"{type(self.hf).__name__}: output_router_logits=True on a sequence shard (the "
                "router's auxiliary loss of a sample needs all of its tokens); run it with "
                "SP size 1"
            )
        else:
            out = self._run(batch, output_router_logits=True)
        loss_S = F.cross_entropy(
            out.logits[0].float(), batch.targets.long(), ignore_index=IGNORE_INDEX, reduction="none"
        )
        if self.router_aux_coef is not None:
            loss_S = loss_S + self.router_aux_coef * self.router_aux_loss(batch, out.router_logits)
        if self.token_sums is not None:
            self.token_sums += loss_token_sums(out.logits[0], batch.targets, batch.loss_mask)
        return torch.where(batch.loss_mask, loss_S, torch.zeros_like(loss_S))

    def router_aux_loss(
        self, batch: PackedBatch, router_logits: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """``(S,)``: on every token of a sample, the router's load-balancing loss of that
        sample alone, as the model's own loss computes it (its own
        ``load_balancing_loss_func`` on the sample's rows of every layer's router logits,
        as it runs on the sample alone with no attention mask); 0 on padding.

        Each loss token carrying its sample's term weights the term like the sample's
        cross-entropy (by its loss tokens), so the global loss is the loss-token-weighted
        mean of the model's own per-sample loss, whatever the packing or world size. It
        needs whole samples: :meth:`forward` refuses a sequence shard (``max_sp_size``
        is 1, so no plan makes one)."""
        balance = sys.modules[type(self.hf).__module__].load_balancing_loss_func
        experts, top_k = int(self.hf.num_experts), int(self.hf.num_experts_per_tok)
        bounds = segment_offsets(batch.cu_seqlens)
        pieces = []
        for segment, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            if segment >= len(batch.sample_ids) or end == start:  # padding carries none
                pieces.append(router_logits[0].new_zeros(end - start, dtype=torch.float32))
                continue
            rows = tuple(layer[start:end].float() for layer in router_logits)
            pieces.append(balance(rows, experts, top_k, None).expand(end - start))
        return torch.cat(pieces)
