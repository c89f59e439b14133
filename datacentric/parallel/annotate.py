"""Named ranges in ``torch.profiler`` traces: what the schedule ran, and where.

While a profiler records (``--trace-steps``, or a user's own ``torch.profiler.profile``),
the runtime marks its work with ``torch.profiler.record_function`` ranges named
``datacentric: ...``, so a trace in Perfetto shows the schedule beside the kernels:

- ``datacentric: micro-batch K/N sp S (ulysses U x ring R) | B samples, T tokens (L on
  this rank) | recompute C/D blocks``: one micro-batch's forward and backward on this rank;
  the rank's last one adds how the gradient sync runs (``grad sync in backward``: DDP's
  all-reduce or FSDP2's reduce-scatter, which FSDP2 marks with its own ranges);
- ``datacentric: all-to-all sp S [shape]``: one Ulysses all-to-all (forward or backward);
- ``datacentric: ring step I/R forward`` (and ``backward``): one step of ring attention;
- ``datacentric: gradient sync ...``: the step's one gradient all-reduce (a plain module),
  or one DDP bucket's;
- ``datacentric: gather losses and timings``: the step's closing all-gather.

Outside a profiler (and inside code ``torch.compile`` traces) a range is a no-op.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

#: How every range of ours begins (a trace's reader finds them by it).
PREFIX = "datacentric: "


def annotate(name: str) -> AbstractContextManager[Any]:
    """The range ``datacentric: name`` while a profiler records, else nothing."""
    if not recording():
        return nullcontext()
    return torch.profiler.record_function(PREFIX + name)


def recording() -> bool:
    """Whether a profiler records now, outside code ``torch.compile`` traces (build a
    range's name only then)."""
    return not torch.compiler.is_compiling() and bool(torch._C._autograd._profiler_enabled())


def micro_batch_name(
    index: int,
    count: int,
    *,
    sp_size: int,
    ring_size: int,
    samples: int,
    tokens: int,
    local_tokens: int,
    recomputed: int,
    blocks: int,
    sync: str = "",
) -> str:
    """The range name of micro-batch ``index`` (0-based) of this rank's ``count``."""
    name = (
        f"micro-batch {index + 1}/{count} sp {sp_size} (ulysses {sp_size // ring_size} x ring "
        f"{ring_size}) | {samples} samples, {tokens} tokens ({local_tokens} on this rank) | "
        f"recompute {recomputed}/{blocks} blocks"
    )
    return f"{name} | {sync}" if sync else name
