"""What runs each block of ``model.blocks``: its compiled forward (the ``compile``
setting), then per-block activation recomputation, switched per micro-batch.

**Compilation** (:func:`compile_blocks`). Each block gets its ``forward`` compiled on
its own, as torchtitan does: the blocks are alike, so dynamo compiles one graph for all
of them, with dynamic shapes from the start (every micro-batch has its own token
count), and the model around them stays eager. Order, the one
:class:`~datacentric.train.data_centric.DataCentric` follows: compile the blocks after
the model-contract check (three eager passes) and before wrapping or sharding (DDP
wraps the root; FSDP2's hooks run around a block's compiled forward, uncompiled), and
before :class:`BlockRecompute` routes each block's forward through its switch. The
switch therefore stays outside the compiled code: flipping recomputation per
micro-batch costs no recompilation, and a recomputed block runs its compiled forward
again in backward under non-reentrant ``torch.utils.checkpoint``. (Compiling the whole
module call, ``module.compile()``, would trace the switch too: dynamo would specialise
on each block's index and switch, compiling per block and falling back to eager past
its recompile limit.) Inside a compiled block, Ulysses attention's all-to-all is traced
into the graph when it runs on the functional path
(:func:`~datacentric.parallel.ulysses.all_to_all_path`); data-dependent steps of the
attention kernels (reading segment bounds on the host) are graph breaks, which dynamo
handles by compiling the pieces between them.

**Recomputation** (:class:`BlockRecompute`). Pyramid activation checkpointing decides,
for every micro-batch, which transformer blocks recompute their activations in backward
(``MicroBatch.recompute``): long sequences recompute many blocks to fit in memory, short
ones few or none to save time. :class:`BlockRecompute` is applied from outside to a
model's ``blocks`` (the model is not modified otherwise and parameter names do not
change): each block's ``forward`` is routed through non-reentrant
``torch.utils.checkpoint`` when its switch is on. The switches are read at forward time,
so flipping them between micro-batches is free.

A model whose blocks read state of the call that runs them (the diffusers adapter's
sequence split, which hooks inside a block read: Helios's plan splits and gathers
around each block's attention) declares ``recompute_context()``: called when a block's
forward is checkpointed, it returns torch's ``context_fn`` pair, the context the forward
runs in and the one its recomputation in backward runs in, so the recomputation sees the
state the forward saw.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

_ORIGINAL_FORWARD = "_datacentric_original_forward"

#: the ``torch.compile`` backend of compiled blocks
DEFAULT_BACKEND = "inductor"
#: environment variable that picks another backend (e.g. ``aot_eager``, to check
#: tracing without code generation)
BACKEND_ENV = "DATACENTRIC_COMPILE_BACKEND"

_COMPILED = "_datacentric_compiled"


def model_blocks(model: nn.Module, what: str) -> Sequence[nn.Module]:
    """``model.blocks``, the repeated transformer blocks that recomputation and
    compilation act on one by one (``what`` names the feature in the error)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(
            f"{type(model).__name__} has no `blocks` attribute; {what} is applied per "
            "transformer block"
        )
    return blocks


def has_recompute(block: nn.Module) -> bool:
    """Whether :class:`BlockRecompute` routes ``block``'s forward."""
    return _ORIGINAL_FORWARD in block.__dict__


def compile_backend() -> str:
    """The backend blocks are compiled with: ``DATACENTRIC_COMPILE_BACKEND``, else
    :data:`DEFAULT_BACKEND` (inductor)."""
    return os.environ.get(BACKEND_ENV, "").strip() or DEFAULT_BACKEND


def compile_blocks(model: nn.Module, backend: str | None = None) -> int:
    """Compile the ``forward`` of every block of ``model.blocks`` with ``torch.compile``
    (``backend``, default :func:`compile_backend`); returns how many were compiled.

    Parameter names and the state dict do not change. Call it before wrapping the
    model and before :class:`BlockRecompute` is applied (a ``ValueError`` otherwise:
    the recomputation switch would be compiled into every block's graph).
    """
    blocks = model_blocks(model, "compilation")
    backend = backend or compile_backend()
    for index, block in enumerate(blocks):
        if has_recompute(block):
            raise ValueError(
                f"block {index} already has switchable recomputation applied; compile the "
                "blocks before the runtime applies it"
            )
        if _COMPILED in block.__dict__:
            raise ValueError(f"block {index} is already compiled")
        block.forward = torch.compile(block.forward, backend=backend, dynamic=True)
        setattr(block, _COMPILED, backend)
    return len(blocks)


def is_compiled(block: nn.Module) -> bool:
    """Whether :func:`compile_blocks` compiled ``block``."""
    return _COMPILED in block.__dict__


class BlockRecompute:
    """Switchable activation checkpointing of every block in ``blocks``.

    ``set(recompute)`` takes one bool per block (an empty sequence means none
    recompute); ``use(recompute)`` does the same for a ``with`` block.
    """

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        context_fn: Callable[[], tuple[Any, Any]] | None = None,
    ) -> None:
        self.blocks = list(blocks)
        self.context_fn = context_fn or noop_context_fn
        self.enabled = [False] * len(self.blocks)
        for index, block in enumerate(self.blocks):
            if has_recompute(block):
                raise ValueError(f"block {index} already has switchable recomputation applied")
            original = block.forward
            setattr(block, _ORIGINAL_FORWARD, original)
            block.forward = self._switchable(index, original)

    @classmethod
    def apply(cls, model: nn.Module) -> BlockRecompute:
        """Apply to ``model.blocks`` (the repeated transformer blocks), with the model's
        ``recompute_context`` when it declares one (see the module docstring)."""
        return cls(model_blocks(model, "recomputation"), getattr(model, "recompute_context", None))

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def _switchable(self, index: int, original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            if self.enabled[index] and torch.is_grad_enabled():
                return checkpoint(
                    original, *args, use_reentrant=False, context_fn=self.context_fn, **kwargs
                )
            return original(*args, **kwargs)

        return forward

    def set(self, recompute: Sequence[bool]) -> None:
        """Switch recomputation per block (``()``: no block recomputes)."""
        if recompute and len(recompute) != self.num_blocks:
            raise ValueError(
                f"the recompute setting has {len(recompute)} entries but the model has "
                f"{self.num_blocks} blocks"
            )
        self.enabled = [bool(r) for r in recompute] if recompute else [False] * self.num_blocks

    @contextmanager
    def use(self, recompute: Sequence[bool]) -> Iterator[BlockRecompute]:
        """Recompute per ``recompute`` inside the block; restore the previous switches after."""
        previous = list(self.enabled)
        self.set(recompute)
        try:
            yield self
        finally:
            self.enabled = previous

    def remove(self) -> None:
        """Restore every block's original forward (a compiled one stays compiled)."""
        for block in self.blocks:
            original = block.__dict__.pop(_ORIGINAL_FORWARD)
            if getattr(original, "__func__", None) is type(block).forward:
                del block.__dict__["forward"]  # back to the class's forward
            else:
                block.forward = original
        self.blocks = []
        self.enabled = []
