"""What LoRA adapts and how, from the ``[lora]`` section: torch-free, so the commands
that only price a model (``plan``, ``schedule``, ``simulate``) read the section without
importing torch. :mod:`datacentric.models.lora` injects the adapters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALL_LINEAR = "all-linear"
"""peft's shorthand target: every linear layer but a transformers model's output head,
chosen by peft itself."""


class LoraError(ValueError):
    """A LoRA setting that cannot apply to the model (no such module, no peft)."""


@dataclass(frozen=True)
class LoraSpec:
    """What LoRA adapts and how (``[lora]`` settings)."""

    rank: int
    """Rank ``r`` of every adapter (``B A`` with ``A: r x in``, ``B: out x r``)."""
    alpha: float | None = None
    """Scale numerator: an adapter adds ``alpha / rank * B A x`` (None: ``alpha = rank``)."""
    dropout: float = 0.0
    """Dropout on each adapter's input (training mode only)."""
    targets: tuple[str, ...] | None = None
    """Module names to adapt (None: :data:`DEFAULT_TARGETS` of the model's family;
    ``("all-linear",)``: the layers peft's shorthand adapts, resolved to their full names
    once injected)."""

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "targets": list(self.targets) if self.targets is not None else None,
        }


def lora_spec(
    rank: int, alpha: float | None = None, dropout: float = 0.0, targets: str | None = None
) -> LoraSpec | None:
    """The spec of ``[lora]`` settings; ``None`` when ``rank`` is 0 (LoRA off)."""
    if rank < 0:
        raise LoraError(f"lora.rank {rank}: give 0 (off) or a positive rank")
    if not rank:
        return None
    if not 0 <= dropout < 1:
        raise LoraError(f"lora.dropout {dropout}: give a probability in [0, 1)")
    names = None
    if targets:
        names = tuple(t.strip() for t in targets.split(",") if t.strip())
        if not names:
            raise LoraError(f"lora.targets {targets!r}: name at least one module")
        if ALL_LINEAR in (n.lower() for n in names) and len(names) > 1:
            raise LoraError(
                f"lora.targets {targets!r}: {ALL_LINEAR} stands alone (peft's shorthand for "
                "every linear layer but the output head); drop the other names"
            )
        if names[0].lower() == ALL_LINEAR:
            names = (ALL_LINEAR,)
    return LoraSpec(int(rank), alpha, float(dropout), names)


def lora_of(lora: Any) -> LoraSpec | None:
    """The ``[lora]`` section (``rank``, ``alpha``, ``dropout``, ``targets``: a
    :class:`~datacentric.settings.sections.LoraConfig`) as a spec (``None``: LoRA off):
    the one conversion, whether the section comes from a command's settings, its flags
    or a run's record."""
    return lora_spec(lora.rank, lora.alpha, lora.dropout, lora.targets)
