"""The data-centric runtime: execute this rank's part of one ``Iteration``.

For every iteration a rank finds its :class:`~datacentric.schedule.Assignment`
(its SP group and ordered micro-batches; one per phase, run in phase order, when
the step changes its group layout between phases) and, for each micro-batch:

1. packs the micro-batch's samples into one sequence padded to a multiple of
   the group size (``pack(sample_ids, pad_to_multiple)``, from the data module);
2. takes its shard (``sharding.shard_batch``: contiguous, or the ring layout's piece
   when the micro-batch's ``ring_size`` is above 1);
3. points the injected attention at the group (its Ulysses group and ring,
   ``ProcessGroups.split``) and switches per-block
   recomputation to the micro-batch's setting;
4. runs forward (per-token loss), weights it (``loss.LossWeights``) and runs
   backward, accumulating into ``.grad``.

After its last micro-batch the rank joins the one world-wide gradient SUM
(``grad_sync``: after backward for a plain module and for FSDP2 holding a model whose
block calls vary per micro-batch, inside the last backward for DDP and FSDP2).

Nothing inside the micro-batch loop waits for the device: losses stay on it and
passes are timed with CUDA events on CUDA (wall clock on the CPU, where work is
synchronous anyway); :meth:`DataCentricRuntime.finish_iteration` reads every loss
and time of the step in one host read (:func:`host_read`). The gradient is the one
a single process computes on the iteration's whole global batch. The training
command, the profiler and the equivalence check all run iterations through
:class:`DataCentricRuntime`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from datacentric.batch import PackedBatch
from datacentric.models.attention import AttentionFn, varlen_attention
from datacentric.parallel.annotate import annotate, micro_batch_name, recording
from datacentric.parallel.grad_sync import (
    is_fsdp2,
    micro_step_context,
    needs_equal_passes,
    reduce_after_backward,
    share_held_gradients,
    syncs_itself,
)
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.loss import LossMode, LossWeights
from datacentric.parallel.recompute import BlockRecompute
from datacentric.parallel.sequence_shards import shard_batch
from datacentric.parallel.ulysses import SequenceParallelAttention
from datacentric.planning.heads import check_max_ring_size, check_max_sp_size, check_sp_sizes
from datacentric.schedule import Iteration
from datacentric.timing import COMPUTE, SYNC, Span, micro_batch_id

Pack = Callable[[Sequence[int], int], PackedBatch]
"""``pack(sample_ids, pad_to_multiple) -> PackedBatch``: the whole micro-batch."""


@dataclass
class MicroBatchStats:
    """What one micro-batch pass did on this rank (its timing is ``span``)."""

    sample_ids: tuple[int, ...]
    #: tokens of the full padded micro-batch (all shards)
    tokens: int
    #: tokens of this rank's shard
    local_tokens: int
    sp_size: int
    #: ring degree of the pass (its Ulysses degree is ``sp_size / ring_size``)
    ring_size: int
    num_recomputed: int
    #: this rank's weighted loss, ``sum_t w_t * loss_t`` over its shard (read at the
    #: iteration's end; NaN until then)
    weighted_loss: float
    #: the pass (forward + backward), from the iteration's start (read at its end)
    span: Span

    @property
    def time_s(self) -> float:
        """Wall time of forward + backward."""
        return self.span.duration_s


@dataclass
class IterationStats:
    """What this rank did in one iteration."""

    index: int
    rank: int
    rank_start: int
    sp_size: int
    micro_batches: list[MicroBatchStats] = field(default_factory=list)
    #: the gradient synchronisation (zero long when the model syncs itself); None until done
    sync: Span | None = None
    total_time_s: float = 0.0
    #: ``time.perf_counter()`` when the iteration started
    started_at: float = 0.0
    #: the iteration's clock and, per micro-batch, its loss tensor and start/end marks
    #: (resolved by ``finish_iteration``)
    clock: StepClock | None = field(default=None, repr=False)
    pending: list[tuple[torch.Tensor, object, object]] = field(default_factory=list, repr=False)
    #: this rank's loss tokens, those predicted right (argmax) and their summed entropy,
    #: on the device (``DataCentricRuntime.token_metrics``; None: not counted)
    token_sums: torch.Tensor | None = field(default=None, repr=False)

    @property
    def weighted_loss(self) -> float:
        """This rank's share of the global-batch loss (sum over ranks = the loss)."""
        return sum(mb.weighted_loss for mb in self.micro_batches)

    @property
    def local_tokens(self) -> int:
        return sum(mb.local_tokens for mb in self.micro_batches)

    @property
    def accumulation_steps(self) -> int:
        return len(self.micro_batches)

    @property
    def sync_time_s(self) -> float:
        """Wall time of the gradient synchronisation (0 when the model syncs itself)."""
        return self.sync.duration_s if self.sync is not None else 0.0

    def spans(self) -> list[Span]:
        """This rank's timing records of the iteration (passes, then the sync), in
        seconds from the iteration's start."""
        return [mb.span for mb in self.micro_batches] + ([self.sync] if self.sync else [])


@dataclass
class MicroStep:
    """One micro-batch handed to the caller: run the model on ``batch`` (this rank's
    shard) and pass the per-token loss to :meth:`backward`."""

    batch: PackedBatch
    weights: LossWeights
    #: this rank's weighted loss once :meth:`backward` ran (a 0-d tensor on the device)
    weighted: torch.Tensor | None = None

    def backward(self, loss_S: torch.Tensor) -> torch.Tensor:
        """Weight the per-token loss (see ``parallel.loss``) and backpropagate it;
        returns this rank's weighted share of the iteration's loss as a detached 0-d
        tensor on the device (reading it, e.g. ``float(...)``, waits for the device)."""
        weighted = self.weights.weighted_sum(loss_S, self.batch)
        # A pass through frozen weights only (a LoRA model the profiler cut to no block)
        # has nothing to differentiate; it is the same on every rank (never data-driven).
        if weighted.requires_grad:
            weighted.backward()
        self.weighted = weighted.detach()
        return self.weighted


def host_read(values: list[torch.Tensor]) -> list[float]:
    """The one host read of a step: every 0-d tensor of ``values`` as floats."""
    if not values:
        return []
    return torch.stack([v.reshape(()).to(torch.float64) for v in values]).tolist()


class StepClock:
    """Marks times within an iteration without waiting for the device: CUDA events on
    CUDA, ``time.perf_counter()`` elsewhere. :meth:`seconds` resolves marks once the
    iteration is over (one event synchronisation on CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.origin = self.mark()

    def mark(self) -> object:
        """A point in time on the device's stream (recorded, not waited for)."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, marks: list[object]) -> list[float]:
        """Seconds from the origin to each mark (waits for the last mark on CUDA)."""
        if not self.cuda:
            return [float(m) - float(self.origin) for m in marks]  # type: ignore[arg-type]
        if marks:
            marks[-1].synchronize()  # type: ignore[attr-defined]
        return [self.origin.elapsed_time(m) / 1e3 for m in marks]  # type: ignore[attr-defined]


@contextmanager
def counting_tokens(module: nn.Module, sums: torch.Tensor | None) -> Iterator[None]:
    """The model's forwards add their loss-token sums to ``sums`` (None: nothing)."""
    if sums is None:
        yield
        return
    module.token_sums = sums
    try:
        yield
    finally:
        module.token_sums = None


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 modules are their own)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


class DataCentricRuntime:
    """Runs iterations of a data-centric schedule on this rank.

    ``model`` is a plain module, or one wrapped with ``grad_sync.wrap_ddp`` or
    sharded with FSDP2; the module must have ``blocks``, ``set_attention(fn)``,
    ``num_heads`` and ``loss_mode`` (``"token"`` or ``"sample"``; override with
    ``loss_mode``), and ``forward(batch) -> (S_local,)`` per-token losses.
    ``pack`` builds a whole micro-batch; ``loss_tokens_of(sample_id)`` says how
    many loss tokens a sample has (the same numbers on every rank, so loss
    weights need no communication). ``sp_sizes`` are checked against the head
    count now (default: checked per assignment when it runs). ``attention`` is
    the single-process kernel used inside each group.

    Gradients accumulate into ``.grad`` as in one process: each iteration reduces its
    own gradient over the world and adds it to what ``.grad`` held before (zero them
    before an iteration that should not add).
    """

    def __init__(
        self,
        model: nn.Module,
        groups: ProcessGroups,
        pack: Pack,
        loss_tokens_of: Callable[[int], int],
        *,
        loss_mode: LossMode | None = None,
        sp_sizes: Sequence[int] | None = None,
        attention: AttentionFn = varlen_attention,
        check_batches: bool = True,
    ) -> None:
        self.model = model
        self.groups = groups
        self.pack = pack
        self.loss_tokens_of = loss_tokens_of
        self.check_batches = check_batches
        self.token_metrics = False
        """Count each iteration's loss-token sums (``IterationStats.token_sums``) on a
        model that has ``token_sums``
        (:func:`~datacentric.models.token_metrics.loss_token_sums`)."""
        module = unwrap(model)
        self.module = module
        self.loss_mode: LossMode = loss_mode or module.loss_mode
        self.num_heads = int(module.num_heads)
        self.num_kv_heads = int(getattr(module, "num_kv_heads", self.num_heads))
        if sp_sizes is not None:  # plain Ulysses groups (ring degree 1)
            self.check_splits([(size, 1) for size in sp_sizes])
        # how the model syncs its gradients, fixed by its wrapper: read once here
        self.fsdp2 = is_fsdp2(model)
        """``model`` is sharded with FSDP2 (:func:`~datacentric.parallel.grad_sync.is_fsdp2`)."""
        self.syncs_in_backward = syncs_itself(model)
        """``model`` reduces its gradients inside its last backward (DDP, FSDP2 whose block
        calls do not vary: :func:`~datacentric.parallel.grad_sync.syncs_itself`); else the
        runtime reduces them after it (:meth:`finish_iteration`)."""
        self.equal_passes = needs_equal_passes(model)
        """``model`` communicates on every pass (FSDP2 resharding after forward), so every
        rank must run as many micro-batches
        (:func:`~datacentric.parallel.grad_sync.needs_equal_passes`)."""
        self.attention = SequenceParallelAttention(attention)
        module.set_attention(self.attention)
        self.recompute = BlockRecompute.apply(module)

    def check_sp_sizes(self, sp_sizes: Sequence[int]) -> None:
        """Raise ``ValueError`` if the model's heads do not allow an SP size
        (:func:`datacentric.planning.heads.check_sp_sizes`: query heads split, key/value
        heads repeated as far as a group needs), or one above the model's ``max_sp_size``."""
        check_sp_sizes(self.num_heads, self.num_kv_heads, sp_sizes, "attention")
        check_max_sp_size(self.module, sp_sizes)

    def check_splits(self, splits: Iterable[tuple[int, int]]) -> None:
        """Raise ``ValueError`` if the model cannot run a split of ``splits`` (``(Ulysses
        degree, ring degree)`` pairs, :attr:`~datacentric.schedule.Assignment.splits`): its
        heads must allow the Ulysses degree (:meth:`check_sp_sizes`) and its
        ``max_ring_size`` the ring degree."""
        pairs = list(splits)
        self.check_sp_sizes([ulysses for ulysses, _ in pairs])
        check_max_ring_size(self.module, [ring for _, ring in pairs])

    def check_schedule(self, iterations: Iterable[Iteration]) -> None:
        """Fail at setup, not mid-epoch: SP sizes against heads, ring degrees against the
        model's ``max_ring_size``, recompute lengths against blocks.

        Pass ``schedule.iterations``; raises ``ValueError`` naming the offending setting.
        """
        splits: set[tuple[int, int]] = set()
        for iteration in iterations:
            iteration.validate(self.groups.world_size)
            for assignment in iteration.assignments:
                splits.update(assignment.splits)
                for micro_batch in assignment.micro_batches:
                    n = len(micro_batch.recompute)
                    if n and n != self.recompute.num_blocks:
                        raise ValueError(
                            f"iteration {iteration.index}, group at rank "
                            f"{assignment.rank_start}: a recompute setting of {n} entries for "
                            f"a model of {self.recompute.num_blocks} blocks"
                        )
        self.check_splits(sorted(splits))

    def start_iteration(self, iteration: Iteration) -> IterationStats:
        """Validate ``iteration`` for this world and open its statistics."""
        iteration.validate(self.groups.world_size)
        mine = iteration.assignments_for_rank(self.groups.rank)
        self.check_splits([split for a in mine for split in a.splits])
        if self.equal_passes:
            counts = {
                len(iteration.micro_batches_of_rank(r)) for r in range(self.groups.world_size)
            }
            if len(counts) > 1:
                raise ValueError(
                    f"iteration {iteration.index}: groups run {sorted(counts)} micro-batches; "
                    "FSDP2 with reshard_after_forward communicates on every pass and needs "
                    "the same count on every rank (turn reshard_after_forward off)"
                )
        counted = self.token_metrics and hasattr(self.module, "token_sums")
        return IterationStats(
            index=iteration.index,
            rank=self.groups.rank,
            rank_start=mine[0].rank_start,
            sp_size=mine[0].sp_size,
            started_at=time.perf_counter(),
            clock=StepClock(self.groups.device),
            token_sums=(
                torch.zeros(3, dtype=torch.float64, device=self.groups.device) if counted else None
            ),
        )

    def micro_steps(self, iteration: Iteration, stats: IterationStats) -> Iterator[MicroStep]:
        """Yield this rank's micro-batches of ``iteration``, each ready to run.

        While a :class:`MicroStep` is out, the injected attention uses the
        micro-batch's SP group and the blocks recompute as its plan says; the
        caller runs ``micro.backward(model(micro.batch))`` before asking for the next.
        """
        groups = self.groups
        weights = LossWeights.for_iteration(self.loss_mode, iteration, self.loss_tokens_of)
        mine = iteration.micro_batches_of_rank(groups.rank)
        if groups.distributed and groups.world_size > 1:  # what .grad holds when the
            share_held_gradients(self.model, groups.rank)  # caller starts the step
        last = len(mine) - 1
        for step, (assignment, micro_batch) in enumerate(mine):
            sp = assignment.sp_size
            ring = micro_batch.ring_size
            group, ring_group = groups.split(assignment.rank_start, sp, ring)
            rank_in_group = groups.rank - assignment.rank_start
            full = self.pack(micro_batch.sample_ids, sp)
            if self.check_batches:
                weights.check_batch(full)
            shard = shard_batch(full, rank_in_group, sp, ring).to(groups.device)
            micro = MicroStep(batch=shard, weights=weights)
            pass_start = stats.clock.mark()
            with (
                micro_step_context(self.model, is_last=step == last),
                self.attention.use(group, ring_group),
                self.recompute.use(micro_batch.recompute),
                annotate(self._range_name(step, len(mine), micro_batch, sp, full, shard)),
                counting_tokens(self.module, stats.token_sums),
            ):
                yield micro
            if micro.weighted is None:
                raise RuntimeError(
                    f"iteration {iteration.index}: micro-batch {step} of rank {groups.rank} "
                    "was not run; call micro.backward(model(micro.batch)) for every micro-batch"
                )
            stats.pending.append((micro.weighted, pass_start, stats.clock.mark()))
            stats.micro_batches.append(
                MicroBatchStats(
                    sample_ids=micro_batch.sample_ids,
                    tokens=full.num_tokens,
                    local_tokens=shard.num_tokens,
                    sp_size=sp,
                    ring_size=ring,
                    num_recomputed=micro_batch.num_recomputed,
                    weighted_loss=float("nan"),
                    span=Span(
                        rank=groups.rank,
                        iteration=iteration.index,
                        kind=COMPUTE,
                        start_s=0.0,
                        duration_s=0.0,
                        micro_batch=micro_batch_id(micro_batch),
                    ),
                )
            )

    def _range_name(self, k: int, count: int, micro_batch, sp: int, full, shard) -> str:
        """The trace range of micro-batch ``k`` of ``count`` (built only while profiling)."""
        if not recording():
            return ""
        last = k == count - 1 and self.syncs_in_backward
        how = "FSDP2" if self.fsdp2 else "DDP"
        return micro_batch_name(
            k,
            count,
            sp_size=sp,
            ring_size=micro_batch.ring_size,
            samples=len(micro_batch.sample_ids),
            tokens=full.num_tokens,
            local_tokens=shard.num_tokens,
            recomputed=micro_batch.num_recomputed,
            blocks=self.recompute.num_blocks,
            sync=f"grad sync in backward ({how})" if last else "",
        )

    def finish_iteration(self, stats: IterationStats) -> None:
        """The iteration's one world-wide gradient sum (collective), then the step's
        one host read of its losses and times."""
        groups = self.groups
        clock = stats.clock or StepClock(groups.device)
        sync_start = done = clock.mark()
        if groups.distributed and groups.world_size > 1 and not self.syncs_in_backward:
            how = "FSDP2 reduce-scatter per unit" if self.fsdp2 else "all-reduce"
            with annotate(f"gradient sync: {how} over {groups.world_size} ranks"):
                reduce_after_backward(self.model, groups.world)
            done = clock.mark()
        marks: list[object] = []
        for _, start, end in stats.pending:
            marks += [start, end]
        seconds = clock.seconds([*marks, sync_start, done])
        losses = host_read([loss for loss, _, _ in stats.pending])
        for k, mb in enumerate(stats.micro_batches):
            mb.weighted_loss = losses[k]
            start_s, end_s = seconds[2 * k], seconds[2 * k + 1]
            mb.span = replace(mb.span, start_s=start_s, duration_s=end_s - start_s)
        stats.pending.clear()
        sync_s, done_s = seconds[-2], seconds[-1]
        stats.sync = Span(
            rank=groups.rank,
            iteration=stats.index,
            kind=SYNC,
            start_s=sync_s,
            duration_s=done_s - sync_s,
        )
        stats.total_time_s = done_s

    def global_loss(self, stats: IterationStats) -> float:
        """The global-batch loss of an iteration: the SUM of every rank's weighted loss.

        Collective over the world (one scalar all-reduce).
        """
        total = torch.tensor([stats.weighted_loss], dtype=torch.float64, device=self.groups.device)
        if self.groups.distributed and self.groups.world_size > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.groups.world)
        return float(total.item())
