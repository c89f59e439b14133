"""Per-block ``torch.compile`` (the ``compile`` setting).

Each block of ``model.blocks`` gets its ``forward`` compiled on its own, as
torchtitan does: the blocks are alike, so dynamo compiles one graph for all of
them, with dynamic shapes from the start (every micro-batch has its own token
count), and the model around them stays eager.

Order, the one :class:`~datacentric.train.data_centric.DataCentric` follows:
compile the blocks after the model-contract check (three eager passes) and
before wrapping or sharding (DDP wraps the root; FSDP2's hooks run around a
block's compiled forward, uncompiled), and before
:class:`~datacentric.parallel.recompute.BlockRecompute` routes each block's
forward through its switch. The switch therefore stays outside the compiled
code: flipping recomputation per micro-batch costs no recompilation, and a
recomputed block runs its compiled forward again in backward under
non-reentrant ``torch.utils.checkpoint``. (Compiling the whole module call,
``module.compile()``, would trace the switch too: dynamo would specialise on
each block's index and switch, compiling per block and falling back to eager
past its recompile limit.)

Inside a compiled block, Ulysses attention's all-to-all is traced into the graph
when it runs on the functional path (:func:`~datacentric.parallel.ulysses.
all_to_all_path`); data-dependent steps of the attention kernels (reading segment
bounds on the host) are graph breaks, which dynamo handles by compiling the
pieces between them.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from datacentric.parallel.recompute import has_recompute, model_blocks

#: the ``torch.compile`` backend of compiled blocks
DEFAULT_BACKEND = "inductor"
#: environment variable that picks another backend (e.g. ``aot_eager``, to check
#: tracing without code generation)
BACKEND_ENV = "DATACENTRIC_COMPILE_BACKEND"

_COMPILED = "_datacentric_compiled"


def compile_backend() -> str:
    """The backend blocks are compiled with: ``DATACENTRIC_COMPILE_BACKEND``, else
    :data:`DEFAULT_BACKEND` (inductor)."""
    return os.environ.get(BACKEND_ENV, "").strip() or DEFAULT_BACKEND


def compile_blocks(model: nn.Module, backend: str | None = None) -> int:
    """Compile the ``forward`` of every block of ``model.blocks`` with ``torch.compile``
    (``backend``, default :func:`compile_backend`); returns how many were compiled.

    Parameter names and the state dict do not change. Call it before wrapping the
    model and before :class:`~datacentric.parallel.recompute.BlockRecompute` is
    applied (a ``ValueError`` otherwise: the recomputation switch would be
    compiled into every block's graph).
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
