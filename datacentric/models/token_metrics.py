"""What a forward counts of its loss tokens for the token metrics: the loss tokens,
those whose target is the logits' first argmax, and the entropy of their predicted
distribution, as sums that add up over any split of tokens (:func:`loss_token_sums`).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def loss_token_sums(
    logits_SV: torch.Tensor,
    targets_S: torch.Tensor,
    loss_mask_S: torch.Tensor,
    rows: int | None = None,
) -> torch.Tensor:
    """``(3,)`` float64: the loss tokens, those whose target is the logits' first argmax,
    and the summed entropy (nats) of their predicted distribution, in float32 -- sums,
    so that any split of tokens over micro-batches and ranks adds up to the same totals
    (TRL's ``mean_token_accuracy`` and ``entropy`` are the last two over the first).
    ``rows`` tokens at a time (default: 2**25 logits, 128 MiB a float32 copy) bound the
    copies; no host sync."""
    rows = rows or max(1, 2**25 // max(1, logits_SV.shape[-1]))
    sums = torch.zeros(3, dtype=torch.float64, device=logits_SV.device)
    for start in range(0, logits_SV.shape[0], rows):
        logits = logits_SV[start : start + rows].float()
        mask = loss_mask_S[start : start + rows]
        # a -inf logit's log-probability clamped to the most negative float: p log p = 0
        log_p = logits.log_softmax(-1).clamp_(min=torch.finfo(torch.float32).min)
        entropy = -(log_p.exp() * log_p).sum(-1)
        correct = logits.argmax(-1) == targets_S[start : start + rows].long()
        sums[0] += mask.sum()
        sums[1] += (correct & mask).sum()
        sums[2] += torch.where(mask, entropy, torch.zeros_like(entropy)).sum()
    return sums
