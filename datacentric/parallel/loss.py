"""Loss normalisation: the one place where per-token losses get their weights.

Models return an unreduced loss per local token, ``loss_S`` of shape
``(S_local,)``. A token ``t`` of sample ``s`` in the iteration gets the weight

- per token (language models): ``w_t = 1 / N_tok``, where ``N_tok`` is the number
  of loss-carrying tokens of the *whole iteration* (all groups, all micro-batches);
- per sample (diffusion): ``w_t = 1 / (n_s * N_smp)``, where ``n_s`` is the number
  of loss tokens of sample ``s`` and ``N_smp`` the number of samples of the
  iteration that carry loss;

and zero on padding and on tokens outside ``loss_mask``.

Why this is right: every loss token of the global batch lives on exactly one
rank, in exactly one micro-batch (SP shards are disjoint, padding carries no
weight). Each rank backpropagates ``sum_t w_t * loss_t`` over its own tokens, so
the sum over all ranks and micro-batches of these scalars is
``sum_{t in batch} w_t * loss_t``: for per-token weights the mean over all loss
tokens, for per-sample weights the mean over samples of each sample's mean
token loss -- exactly the loss a single process computes on the whole global
batch. Gradients are linear in the loss, so summing parameter gradients over
micro-steps (accumulation) and over ranks (one all-reduce SUM per iteration,
see ``grad_sync``) yields the single-process gradient, whatever the SP sizes,
micro-batch sizes and accumulation counts of the groups. The denominators
depend only on the iteration's sample ids and their loss-token counts, which
every rank knows from the schedule and the dataset, so no communication is
needed to agree on them. Dividing per rank or per micro-batch instead (as the
reference implementation does) would weight a sample by the SP size and the
accumulation count of the group it happened to land on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from datacentric.batch import PackedBatch, host_to_device
from datacentric.schedule import Iteration

LossMode = Literal["token", "sample"]
LOSS_MODES: tuple[str, ...] = ("token", "sample")


@dataclass(frozen=True)
class LossWeights:
    """Per-token loss weights of one iteration (see the module docstring).

    ``loss_tokens`` maps every sample id of the iteration to its number of
    loss-carrying tokens.
    """

    mode: LossMode
    loss_tokens: Mapping[int, int]

    def __post_init__(self) -> None:
        if self.mode not in LOSS_MODES:
            raise ValueError(f"loss mode must be one of {LOSS_MODES}, got {self.mode!r}")
        negative = [s for s, n in self.loss_tokens.items() if n < 0]
        if negative:
            raise ValueError(f"samples {negative[:5]} have a negative loss-token count")
        if self.total_loss_tokens == 0:
            raise ValueError("the iteration has no loss-carrying token; nothing to train on")

    @classmethod
    def for_samples(
        cls, mode: LossMode, sample_ids: Iterable[int], loss_tokens_of: Callable[[int], int]
    ) -> LossWeights:
        """Weights for a global batch of ``sample_ids`` (each counted once)."""
        return cls(mode=mode, loss_tokens={int(s): int(loss_tokens_of(s)) for s in sample_ids})

    @classmethod
    def for_iteration(
        cls, mode: LossMode, iteration: Iteration, loss_tokens_of: Callable[[int], int]
    ) -> LossWeights:
        """Weights for every sample of ``iteration``, over all of its groups."""
        return cls.for_samples(mode, iteration.sample_ids(), loss_tokens_of)

    @property
    def total_loss_tokens(self) -> int:
        """``N_tok``: loss-carrying tokens of the whole iteration."""
        return sum(self.loss_tokens.values())

    @property
    def num_loss_samples(self) -> int:
        """``N_smp``: samples of the iteration with at least one loss token."""
        return sum(1 for n in self.loss_tokens.values() if n > 0)

    def sample_weights(self, sample_ids: Iterable[int]) -> list[float]:
        """The weight of one loss token of each sample."""
        out = []
        for s in sample_ids:
            if s not in self.loss_tokens:
                raise KeyError(f"sample {s} is not part of this iteration's loss weights")
            n = self.loss_tokens[s]
            if self.mode == "token":
                out.append(1.0 / self.total_loss_tokens)
            else:
                out.append(0.0 if n == 0 else 1.0 / (n * self.num_loss_samples))
        return out

    def token_weights(self, batch: PackedBatch, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``(S_local,)`` weights of a (sharded) packed batch; zero off ``loss_mask``."""
        per_segment = host_to_device(
            torch.tensor(self.sample_weights(batch.sample_ids) + [0.0], dtype=torch.float64),
            batch.segment_ids.device,
        )
        # segment_ids == -1 (padding) picks the trailing 0.0.
        weights = per_segment[batch.segment_ids.long()]
        return torch.where(batch.loss_mask, weights, torch.zeros_like(weights)).to(dtype)

    def weighted_sum(self, loss_S: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """``sum_t w_t * loss_t`` over the local tokens (a scalar to backpropagate).

        Masked tokens contribute exactly zero, even when their loss is not finite.
        """
        if loss_S.shape != (batch.num_tokens,):
            raise ValueError(
                f"the model returned a loss of shape {tuple(loss_S.shape)}; expected one "
                f"unreduced loss per local token, ({batch.num_tokens},)"
            )
        weights = self.token_weights(batch, dtype=loss_S.dtype)
        masked = torch.where(batch.loss_mask, loss_S * weights, torch.zeros_like(loss_S))
        return masked.sum()

    def check_batch(self, batch: PackedBatch) -> None:
        """Check a whole (unsharded) micro-batch against the loss-token counts.

        Catches a ``loss_tokens_of`` that disagrees with what the packer produced.
        """
        counts = torch.bincount(
            batch.segment_ids[batch.loss_mask].long(), minlength=len(batch.sample_ids)
        ).tolist()
        for s, got in zip(batch.sample_ids, counts):
            if self.loss_tokens.get(s) != got:
                raise ValueError(
                    f"sample {s}: the packed batch has {got} loss tokens but loss_tokens_of "
                    f"said {self.loss_tokens.get(s)}"
                )


def loss_tokens_function(dataset: object) -> Callable[[int], int]:
    """``sample_id -> loss tokens`` for a dataset.

    Uses ``dataset.loss_tokens(sample_id)`` when the dataset has it; otherwise
    packs the sample alone and counts its ``loss_mask`` (cached per sample id).
    """
    direct = getattr(dataset, "loss_tokens", None)
    if callable(direct):
        return lambda sample_id: int(direct(sample_id))
    pack = dataset.pack  # type: ignore[attr-defined]
    cache: dict[int, int] = {}

    def count(sample_id: int) -> int:
        if sample_id not in cache:
            cache[sample_id] = int(pack([sample_id], 1).loss_mask.sum())
        return cache[sample_id]

    return count
