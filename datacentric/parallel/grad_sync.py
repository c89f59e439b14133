"""Gradient synchronisation: once per iteration, over the whole world, as a SUM.

Ranks of one iteration run different numbers of forward/backward passes (their
groups have different accumulation counts), so a collective issued on every
pass over the whole world (a DDP reduction on each backward, a ZeRO-3/FSDP
parameter all-gather on each forward) would pair up different passes on
different ranks and deadlock. Gradients are therefore accumulated locally over
a rank's micro-steps and reduced once, after its last one.

The reduction is a SUM, not a mean: ``loss.LossWeights`` already divides by the
global batch, so the sum over ranks of the local gradients is the global-batch
mean gradient (dividing by the world size again would be wrong whenever SP
groups hold more than one rank or groups hold different amounts of data).

Three ways to hold the model, one rule (see docs/runtime.md):
- a plain module: :func:`allreduce_gradients` after the last micro-step;
- DDP: :func:`wrap_ddp` (SUM comm hook, no buffer broadcast), and every
  micro-step but the last under ``no_sync()`` -- :func:`micro_step_context`;
- FSDP2 (``fully_shard``): gradient sync and resharding after backward off for
  every micro-step but the last -- also :func:`micro_step_context`.

FSDP2 reduces a unit's gradients in the post-backward hook of *each call* of the unit:
a block run twice in one forward reduce-scatters twice (and, resharded after the first,
all-gathers again). A model whose forward runs its blocks a number of times that depends
on the micro-batch (``block_calls_vary = True``: the generic diffusers path runs the
model once per clip shape) would issue a rank-dependent number of collectives and
deadlock. For such a model every micro-step runs without FSDP's reduction, and
:func:`reduce_after_backward` issues it once per unit, in the same order on every rank,
after the last micro-step (not overlapped with backward). Any other model keeps the
reduction inside its last backward; :class:`_BlockCalls` checks in that forward that
every block ran exactly once and raises a named error before a mismatched collective
could be issued. Every unit reduces every parameter (zeros where a rank's data left one
unused: ``set_reduce_scatter_unused_params``), so the reduce-scatters have the same
sizes on every rank.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from datacentric.parallel.annotate import annotate
from datacentric.parallel.groups import ProcessGroups
from datacentric.planning.sharding import ShardingSpec

try:
    from torch.distributed.fsdp import FSDPModule, fully_shard
except ImportError:  # torch < 2.6 kept FSDP2 in a private module
    try:
        from torch.distributed._composable.fsdp import FSDPModule, fully_shard
    except ImportError:
        FSDPModule = fully_shard = None  # type: ignore[assignment,misc]

DEFAULT_BUCKET_BYTES = 25 * 2**20


def allreduce_gradients(
    params: Iterable[nn.Parameter],
    group: dist.ProcessGroup | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> int:
    """Sum ``.grad`` of ``params`` over the ranks of ``group`` (default: world), in place.

    Gradients are flattened into buckets of about ``bucket_bytes`` per dtype and
    device, one all-reduce each. A parameter without a gradient on this rank
    gets a zero one, so every rank reduces the same layout. Returns the number
    of all-reduce calls issued.
    """
    trainable = [p for p in params if p.requires_grad]
    for p in trainable:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    buckets: list[list[nn.Parameter]] = []
    by_kind: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
    for p in trainable:
        by_kind.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for members in by_kind.values():
        current: list[nn.Parameter] = []
        size = 0
        for p in members:
            current.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= bucket_bytes:
                buckets.append(current)
                current, size = [], 0
        if current:
            buckets.append(current)
    for bucket in buckets:
        grads = [p.grad for p in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
    return len(buckets)


def sum_allreduce_hook(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-reduce SUM (DDP's default divides by the world size)."""
    group = process_group if process_group is not None else dist.group.WORLD
    with annotate(f"gradient sync: DDP bucket {bucket.index()} all-reduce"):
        work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP checks the hook's annotations as objects; this module's are strings.
sum_allreduce_hook.__annotations__.update(
    bucket=dist.GradBucket, process_group=dist.ProcessGroup | None
)
sum_allreduce_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def wrap_ddp(model: nn.Module, **ddp_kwargs: Any) -> DistributedDataParallel:
    """Wrap ``model`` in DDP for data-centric runs.

    Buffers are not broadcast (that is a world collective on every forward,
    which deadlocks when ranks run different numbers of passes), and the
    reduction sums instead of averaging. Run micro-steps through
    :func:`micro_step_context` so only the last one reduces.
    """
    # Newer torch spells "no buffer sync in forward" forward_sync_buffers=False.
    key = "forward_sync_buffers" if _ddp_accepts("forward_sync_buffers") else "broadcast_buffers"
    for name in ("forward_sync_buffers", "broadcast_buffers"):
        if ddp_kwargs.get(name):
            raise ValueError(
                f"{name}=True issues a world collective on every forward; ranks run different "
                "numbers of forwards per iteration, so it would deadlock"
            )
        ddp_kwargs.pop(name, None)
    ddp_kwargs[key] = False
    ddp = DistributedDataParallel(model, **ddp_kwargs)
    ddp.register_comm_hook(None, sum_allreduce_hook)
    return ddp


def _ddp_accepts(argument: str) -> bool:
    return argument in inspect.signature(DistributedDataParallel.__init__).parameters


def shard_fsdp2(
    model: nn.Module, groups: ProcessGroups, *, reshard_after_forward: bool = False
) -> nn.Module:
    """Shard ``model`` with FSDP2 over the whole world, for data-centric runs.

    Every block of ``model.blocks`` and the root become FSDP units; with
    :func:`micro_step_context` the parameters are all-gathered in a rank's first
    forward of the iteration and stay gathered until its last backward, which
    reduce-scatters once, overlapped with that backward (a SUM: the divide factor
    is 1); for a model with ``block_calls_vary`` the reduce-scatter is issued once per
    unit after the last micro-step instead (:func:`reduce_after_backward`; module
    doc). Parameters and optimizer state stay sharded between iterations.
    ``reshard_after_forward=True`` frees the blocks' gathered parameters after each
    forward and gathers them again in backward: a world collective on every pass,
    so every rank must run the same number of micro-batches per iteration
    (:func:`needs_equal_passes`; the runtime checks it), and the blocks must run once
    per forward (refused for ``block_calls_vary``: :func:`check_fsdp2`).
    Returns ``model`` (now an ``FSDPModule``); gradients are sharded DTensors.
    """
    if fully_shard is None:
        raise RuntimeError("this torch has no FSDP2 (fully_shard); upgrade to torch>=2.6")
    from torch.distributed.device_mesh import init_device_mesh

    check_fsdp2(model, reshard_after_forward)
    mesh = init_device_mesh(groups.device.type, (groups.world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    model._datacentric_equal_passes = reshard_after_forward
    model._datacentric_deferred = block_calls_vary(model)
    for unit in model.modules():  # the settings below do not recurse
        if not isinstance(unit, FSDPModule):
            continue
        if hasattr(unit, "set_gradient_divide_factor"):
            unit.set_gradient_divide_factor(1.0)
        else:  # torch 2.6-2.7
            unit.set_reduce_scatter_divide_factor(1.0)
        if hasattr(unit, "set_force_sum_reduction_for_comms"):
            # A plain SUM (gloo has no pre-multiplied sum; NCCL sums zero-copy).
            unit.set_force_sum_reduction_for_comms(True)
        if hasattr(unit, "set_reduce_scatter_unused_params"):
            # the same reduce-scatter on every rank, whichever parameters its data used
            unit.set_reduce_scatter_unused_params(True, recurse=False)
    if not model._datacentric_deferred:
        model._datacentric_block_calls = _BlockCalls(model, every_pass=reshard_after_forward)
    return model


def block_calls_vary(model: nn.Module) -> bool:
    """Whether ``model`` declares that its forward may run a block a number of times that
    depends on the micro-batch (``block_calls_vary = True``; the generic diffusers path
    runs its model once per clip shape)."""
    module = model.module if isinstance(model, DistributedDataParallel) else model
    return bool(getattr(module, "block_calls_vary", False))


def check_fsdp2(model: nn.Module, reshard_after_forward: bool) -> None:
    """Raise ``ValueError`` (one line naming the setting) if FSDP2 cannot hold ``model``
    exactly: ``reshard_after_forward`` gathers a block on each of its calls, so a model
    whose block calls vary per micro-batch would issue a rank-dependent number of
    all-gathers. Collective-free: run it before ranks start."""
    if reshard_after_forward and block_calls_vary(model):
        raise ValueError(
            f"reshard_after_forward: {type(model).__name__} runs its blocks once per clip "
            "shape of a micro-batch, so FSDP2 would gather them a different number of times "
            "on different ranks; turn reshard_after_forward off (or use shard 'ddp')"
        )


class _BlockCalls:
    """Counts each block's calls in one forward of the root; where FSDP2 communicates per
    call (the last micro-step's backward, or every pass with ``every_pass``), raises a
    named error unless every block ran exactly once: before a mismatched collective."""

    def __init__(self, model: nn.Module, *, every_pass: bool) -> None:
        self.counts = [0] * len(model.blocks)
        self.every_pass = every_pass
        self.checking = every_pass
        self.in_forward = False
        self.name = type(model).__name__.removeprefix("FSDP")
        model.register_forward_pre_hook(self._start)
        model.register_forward_hook(self._finish)
        for index, block in enumerate(model.blocks):
            block.register_forward_pre_hook(partial(self._count, index), prepend=True)

    def _start(self, *_: Any) -> None:
        self.counts = [0] * len(self.counts)
        self.in_forward = torch.is_grad_enabled()

    def _count(self, index: int, *_: Any) -> None:
        if not self.in_forward:  # recomputation in backward, or no_grad
            return
        self.counts[index] += 1
        if self.checking and self.counts[index] > 1:
            self._refuse(index)

    def _finish(self, *_: Any) -> None:
        in_forward, self.in_forward = self.in_forward, False
        if in_forward and self.checking:
            for index, count in enumerate(self.counts):
                if count != 1:
                    self._refuse(index)

    def _refuse(self, index: int) -> None:
        raise RuntimeError(
            f"FSDP2: block {index} of {self.name} ran {self.counts[index]} times in one "
            "forward; FSDP2 communicates once per block call, so ranks would issue "
            "different collectives and deadlock. Declare `block_calls_vary = True` on the "
            "model (its gradients are then reduced once after the last micro-batch), or "
            "use shard 'ddp' or 'none'"
        )


def share_held_gradients(model: nn.Module, rank: int) -> None:
    """Keep on rank 0 only the gradients ``model``'s trainable parameters hold when a
    step starts (a caller's own accumulation over steps: reduced already, the same on
    every rank); the other ranks zero theirs in place. The step's SUM over the world
    reduces the whole ``.grad`` of the trainable parameters (:func:`allreduce_gradients`,
    DDP's bucket), which gives every rank the held gradient once beside the step's own,
    as one process adds them (held on every rank, it would count ``world`` times; divided
    by the world, it would be rounded on a world that is not a power of two). A frozen
    parameter's gradient is not reduced, so it is left as it is. FSDP2 reduces only the
    step's own gradient into its shards: nothing to do."""
    if is_fsdp2(model) or rank == 0:
        return
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None and p.requires_grad:
                p.grad.zero_()


def reduce_after_backward(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """The step's one gradient SUM after the rank's last micro-step, where the model does
    not reduce inside backward (``not syncs_itself(model)``; collective over the world):
    :func:`allreduce_gradients` for a plain module; for FSDP2, FSDP's own post-backward of
    every unit once, in the same order on every rank (the root, then the blocks), which
    reduce-scatters its accumulated gradients and reshards."""
    if not is_fsdp2(model):
        allreduce_gradients(model.parameters(), group)
        return
    model.set_requires_gradient_sync(True)
    model.set_reshard_after_backward(True)
    # FSDP's end-of-backward callback runs the post-backward of every unit whose hook did
    # not run (here: all of them, each once) and waits for the reductions (a private
    # method FSDP2 has had since torch 2.4)
    finish = getattr(model._get_fsdp_state(), "_root_post_backward_final_callback", None)
    if finish is None:
        raise RuntimeError(
            f"this torch's FSDP2 cannot reduce {type(model).__name__} after backward; "
            "use shard 'ddp' or 'none' for a model with block_calls_vary"
        )
    finish()


def _sums(t: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
    """The sum and the sum of squares of ``t`` in float64, a chunk at a time (no float64
    copy of a large tensor)."""
    total = torch.zeros(2, dtype=torch.float64, device=t.device)
    for part in t.reshape(-1).split(chunk):
        part = part.double()
        total += torch.stack([part.sum(), (part * part).sum()])
    return total


def take_rank_zero_weights(model: nn.Module, group: dist.ProcessGroup | None = None) -> bool:
    """Give every rank of ``group`` rank 0's parameters and buffers where any differ (a
    model built otherwise on each rank: a seed per rank), as DDP does at its start; held
    as is, each rank would train its own model, and FSDP2 would shard a mix of them.
    One all-gather of two sums per tensor; the broadcasts only when some differ.
    Returns whether they differed (collective)."""
    tensors = [t.detach() for t in [*model.parameters(), *model.buffers()]]
    if not tensors:
        return False
    sums = torch.stack([_sums(t) for t in tensors])
    table = [torch.empty_like(sums) for _ in range(dist.get_world_size(group))]
    dist.all_gather(table, sums, group=group)
    if all(torch.equal(other, table[0]) for other in table[1:]):
        return False
    source = dist.get_global_rank(group, 0) if group is not None else 0
    for t in tensors:
        held = t if t.is_contiguous() else t.contiguous()
        dist.broadcast(held, src=source, group=group)
        if held is not t:
            t.copy_(held)
    return True


def wrap_model(model: nn.Module, groups: ProcessGroups, sharding: ShardingSpec) -> nn.Module:
    """``model`` held as ``sharding`` says on ``groups``' world (the one place the
    trainer and ``DataCentric`` wrap a model): as is (``none``, or one rank),
    :func:`wrap_ddp` or :func:`shard_fsdp2`, with rank 0's weights on every rank
    (:func:`take_rank_zero_weights`; DDP takes them itself). Create the optimizer
    afterwards, from the returned module's parameters (FSDP2 replaces them with sharded
    ones)."""
    spec = sharding.effective(groups.world_size if groups.distributed else 1)
    if groups.distributed and groups.world_size > 1 and spec.mode != "ddp":
        take_rank_zero_weights(model, groups.world)
    if spec.mode == "ddp":
        ids = [groups.device.index] if groups.device.type == "cuda" else None
        ddp = wrap_ddp(model, device_ids=ids)
        _refuse_calls_around(ddp)
        return ddp
    if spec.mode == "fsdp2":
        return shard_fsdp2(model, groups, reshard_after_forward=spec.reshard_after_forward)
    return model


def _refuse_calls_around(ddp: DistributedDataParallel) -> None:
    """Make calling the module inside ``ddp`` directly an error: DDP would not reduce
    its gradients, and training would silently diverge across ranks."""
    inside = [0]

    def enter(*_: Any) -> None:
        inside[0] += 1

    def leave(*_: Any) -> None:
        inside[0] -= 1

    def check(*_: Any) -> None:
        if not inside[0]:
            raise RuntimeError(
                "the model is wrapped in DDP (shard 'ddp'): call the wrapper (DataCentric's "
                "`dc.model`), not the module inside it, or DDP never reduces gradients"
            )

    ddp.register_forward_pre_hook(enter)
    ddp.register_forward_hook(leave)
    ddp.module.register_forward_pre_hook(check)


def needs_equal_passes(model: nn.Module) -> bool:
    """Whether ``model`` communicates on every pass (FSDP2 resharding after forward),
    so every rank must run the same number of micro-batches per iteration."""
    return bool(getattr(model, "_datacentric_equal_passes", False))


def is_fsdp2(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2 ``fully_shard``."""
    return FSDPModule is not None and isinstance(model, FSDPModule)


def syncs_itself(model: nn.Module) -> bool:
    """Whether ``model`` (DDP, or FSDP2 without ``block_calls_vary``) reduces its
    gradients inside its last backward."""
    if isinstance(model, DistributedDataParallel):
        return True
    return is_fsdp2(model) and not getattr(model, "_datacentric_deferred", False)


def micro_step_context(model: nn.Module, is_last: bool) -> AbstractContextManager[Any]:
    """The context to run one micro-step's forward and backward in.

    For DDP: ``no_sync()`` unless it is the rank's last micro-step of the
    iteration. For FSDP2: gradient reduction and resharding after backward only
    on the last micro-step (parameters stay gathered in between, so FSDP
    communicates once per iteration), and never for a model with
    ``block_calls_vary`` (:func:`reduce_after_backward` reduces it after the last
    micro-step). For a plain module: nothing (call :func:`reduce_after_backward`
    after the last micro-step).
    """
    if isinstance(model, DistributedDataParallel):
        return nullcontext() if is_last else model.no_sync()
    if is_fsdp2(model):
        in_backward = is_last and syncs_itself(model)
        model.set_requires_gradient_sync(in_backward)
        model.set_reshard_after_backward(in_backward)
        calls = getattr(model, "_datacentric_block_calls", None)
        if calls is not None:
            calls.checking = in_backward or calls.every_pass
    return nullcontext()
