"""The data order: which samples every optimizer step trains on.

One sampler for every policy. The epoch's active samples are interleaved by bucket
(every stretch holds each bucket in proportion to its size) with a generator derived
from ``(seed, epoch)`` only, and cut into ``ceil(total / bound)`` global batches of
nearly equal tokens (or samples), the bound being the global batch
(``SchedulingConfig.global_batch_tokens`` / ``global_batch_samples``). Step ``k``'s
samples therefore depend on the seed, the epoch and the global batch, never on the
policy or the world size; a policy only decides how to run each step (groups, SP
sizes, micro-batches, accumulation, recomputation). With ``reorder_window = K > 1``
the samples of each window of ``K`` consecutive steps are dealt again among those
steps (longest first, each to the step with the least attention work so far), the
paper's sampler: steps then carry similar work, at the price of a data order that
depends on the window.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from datacentric.progress import counted
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.settings.sections import TrainingConfig
from datacentric.shapes import SampleShape, stable_order

#: Mixed into the seed of the data-order generator (policies use another stream).
ORDER_STREAM = 0x0D47A


class BatchBelowLongest(ValueError):
    """A global batch of ``bound`` tokens below the ``longest`` sample, which no step can
    then hold; the message names ``--global-batch-tokens`` (a command that sets the batch
    itself names its own fix from ``bound`` and ``longest``)."""

    def __init__(self, bound: int, longest: int) -> None:
        super().__init__(
            f"--global-batch-tokens: a global batch of {bound:,} tokens is smaller than the "
            f"longest sample ({longest:,} tokens); give at least {longest:,}"
        )
        self.bound, self.longest = bound, longest


def order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The data order's generator for ``(seed, epoch)``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), ORDER_STREAM]))


def default_tokens_per_iteration(view: DatasetView, active: np.ndarray, world_size: int) -> int:
    """``world * max(2**18, longest sample)`` tokens: each rank gets at least one
    longest sample's worth of work, and a quarter-million tokens otherwise. (Give the
    global batch explicitly for a data order that does not depend on the world.)"""
    longest = int(view.tokens[active].max())
    return world_size * max(2**18, longest)


#: A dataset too small for this many default global batches gets a global batch sized
#: from its tokens (:func:`data_sized_tokens`), so that an epoch has this many steps.
SMALL_DATA_STEPS = 8


def data_sized_tokens(tokens: Sequence[int]) -> int | None:
    """The global batch (tokens) of a dataset of samples of ``tokens`` tokens each when
    none is given, or ``None`` to keep the default: a dataset holding fewer tokens than
    :data:`SMALL_DATA_STEPS` global batches of ``max(2**18, longest sample)`` (one
    rank's default) would train one step per epoch, so its global batch is
    ``ceil(total / SMALL_DATA_STEPS)`` tokens (never below the longest sample): an epoch
    of up to that many steps (``None`` too when that is one step, as the default's). A
    function of the samples only (not of the world or the
    policy), so every rank, world size and resume computes the same."""
    if not len(tokens):
        return None
    total, longest = int(sum(tokens)), int(max(tokens))
    bound = max(longest, -(-total // SMALL_DATA_STEPS))
    if total >= SMALL_DATA_STEPS * max(2**18, longest) or bound >= total:
        return None  # large enough for the default, or one step whatever the bound
    return bound


def samples_per_step(world_size: int, largest_sp: int) -> int:
    """Samples every global batch needs so that its micro-batches (one sample at least
    each) can fill groups of at most ``largest_sp`` ranks covering ``world_size`` ranks."""
    return -(-int(world_size) // max(1, int(largest_sp)))


@dataclass(frozen=True)
class GroupCap:
    """The largest group a step's samples fill, and where that limit comes from."""

    size: int
    """The largest SP size: the setting's when it is below the model's, else the model's."""
    set_by_user: bool
    """``True``: the ``[scheduling] max_sp_size`` setting (``--max-sp-size``) set it."""

    @classmethod
    def of(cls, options: SchedulingConfig, world_size: int, largest_sp: int | None) -> GroupCap:
        """The cap of ``world_size`` ranks whose model allows groups of ``largest_sp``."""
        model = largest_sp or world_size
        setting = options.max_sp_size
        if setting is not None and setting < model:
            return cls(setting, True)
        return cls(model, False)

    @property
    def source(self) -> str:
        """Where the limit comes from, as a message says it."""
        if self.set_by_user:
            return f"--max-sp-size {self.size}, [scheduling] max_sp_size"
        return "the model's largest SP size"


def covering_tokens(tokens: Sequence[int], needed: int, drop_remainder: bool = False) -> int:
    """A global batch (tokens) whose every global batch, in any data order, holds
    ``needed`` samples or more, and at least the longest sample: the smallest the bound
    below guarantees (the dataset's total when only one step of every sample does).

    Why: :func:`chunk_even` cuts ``K = ceil(total / bound)`` batches, each holding more
    than ``total / K - longest`` tokens, so more than ``total / (K * longest) - 1``
    samples; ``K <= total // (needed * longest)`` batches therefore hold ``needed``
    each. Dropping the remainder keeps ``floor(total / bound)`` batches of a prefix one
    sample short of ``K * bound`` tokens: one more sample's worth covers it."""
    total, longest = int(sum(tokens)), int(max(tokens))
    if needed <= 1:
        return longest
    most = total // ((needed + int(drop_remainder)) * longest)
    if most <= 1:
        return total
    return max(longest, -(-total // most))


def covering_samples(count: int, needed: int) -> int:
    """The smallest global batch (samples) of ``count`` samples whose every global batch
    holds ``needed`` or more: at most ``count // needed`` near-equal batches."""
    if needed <= 1:
        return 1
    return count if count < 2 * needed else -(-count // (count // needed))


@dataclass(frozen=True)
class GlobalBatchSize:
    """The global-batch step of a run's start-up (:func:`size_global_batch`): the
    global batch the data sized, and the note that says so."""

    tokens: int | None = None
    """The data-sized global batch in tokens; ``None``: the settings' own (given, or the
    default)."""
    note: str | None = None
    """One line saying what was sized and why (``None`` when nothing was)."""

    def applied(self, scheduling: SchedulingConfig) -> SchedulingConfig:
        """The ``[scheduling]`` section with the sized global batch: a copy, unchanged
        when nothing was sized."""
        if self.tokens is None:
            return scheduling
        return scheduling.updated(global_batch_tokens=self.tokens)


def size_global_batch(
    options: SchedulingConfig,
    tokens: Sequence[int],
    *,
    world_size: int = 1,
    largest_sp: int | None = None,
) -> GlobalBatchSize:
    """The global batch of a run on samples of ``tokens`` tokens each: when ``options``
    give none, a small dataset's is sized from its samples (:func:`data_sized_tokens`),
    and never below the bound that lets every step cover ``world_size`` ranks with
    groups of at most ``largest_sp`` ranks (the model's largest SP size;
    :func:`covering_tokens`); the run records it in its settings (``config.toml``,
    checkpoints), so a resume trains the same batches. A pure function of the options,
    the samples and the group layout: the check before the ranks start computes it once
    and hands it to every rank."""
    if options.global_batch_tokens is not None or options.global_batch_samples is not None:
        return GlobalBatchSize()
    if not len(tokens):
        return GlobalBatchSize()
    cap = GroupCap.of(options, world_size, largest_sp)
    needed = samples_per_step(world_size, cap.size)
    check_enough_samples(len(tokens), needed, world_size, cap)
    need = covering_tokens(tokens, needed, options.drop_remainder)
    bound = data_sized_tokens(tokens)
    chosen = world_size * max(2**18, max(tokens)) if bound is None else bound
    if chosen >= need:
        if bound is None:
            return GlobalBatchSize()
        note = (
            f"the dataset holds {sum(tokens):,} tokens, fewer than {SMALL_DATA_STEPS} default "
            f"global batches; global batch sized to {bound:,} tokens, "
            f"{epoch_steps(tokens, bound, options.drop_remainder)} (--global-batch-tokens sets it)"
        )
        return GlobalBatchSize(bound, note)
    note = (
        f"global batch sized to {need:,} tokens, "
        f"{epoch_steps(tokens, need, options.drop_remainder)}, so "
        f"that every step holds {counted(needed, 'sample')} in any data order (one a group: "
        f"{counted(world_size, 'rank')} in groups of at most {cap.size}, {cap.source}) and the "
        f"longest sample ({counted(max(tokens), 'token', ',')}) (--global-batch-tokens sets it)"
    )
    return GlobalBatchSize(need, note)


def epoch_steps(tokens: Sequence[int], bound: int, drop_remainder: bool) -> str:
    """How many steps an epoch of samples of ``tokens`` tokens takes under a global batch
    of ``bound`` tokens, as a note says it: ``ceil(total / bound)`` near-equal batches, or
    with ``drop_remainder`` the ``floor(total / bound)`` that :func:`chunk_even` keeps and
    the tokens it leaves out (a batch sized from few samples may leave out a third)."""
    total = int(sum(tokens))
    if not drop_remainder:
        return f"about {counted(-(-total // bound), 'step')} an epoch"
    kept = total // bound
    return (
        f"about {counted(kept, 'step')} an epoch, --drop-remainder leaving out at least "
        f"{total - kept * bound:,} of its {total:,} tokens"
    )


def run_global_batch(
    scheduling: SchedulingConfig,
    training: TrainingConfig,
    seed: int,
    shapes: list[SampleShape],
    sp_sizes: list[int],
    world_size: int,
) -> GlobalBatchSize:
    """The global-batch step: the batch :func:`size_global_batch` sizes when the
    ``[scheduling]`` section gives none, never below what covers ``world_size`` ranks with
    groups of the model's largest SP size (of ``sp_sizes``), then the batch the run
    trains checked on its epochs (the ``[training]`` section's; :func:`check_global_batch`):
    ``ValueError`` naming the fix, before any rank starts when the check runs it."""
    largest = max(sp_sizes, default=1)
    tokens = [shape.tokens for shape in shapes]
    batch = size_global_batch(scheduling, tokens, world_size=world_size, largest_sp=largest)
    check_global_batch(
        batch.applied(scheduling),
        shapes,
        world_size=world_size,
        largest_sp=largest,
        seed=seed,
        epochs=training.epochs,
        iterations=training.iterations,
    )
    return batch


def held_out_batch(
    options: SchedulingConfig,
    tokens: Sequence[int],
    *,
    world_size: int,
    largest_sp: int | None,
) -> SchedulingConfig:
    """The ``[scheduling]`` section a held-out set's one pass is cut by (samples of
    ``tokens`` tokens each): the run's, no remainder dropped, its global batch (given or
    sized from the training set) raised where it is below what covers ``world_size``
    ranks in groups of at most ``largest_sp`` in any order and the longest held-out
    sample (:func:`covering_tokens`, :func:`covering_samples`). Why a held-out batch may
    differ from training's: the held-out loss weighs the whole set at once, so how its
    pass is cut moves no value, and a held-out sample longer than the training set's
    batch is no reason to refuse the run or to change its training steps."""
    options = options.updated(drop_remainder=False)
    if not len(tokens):
        return options
    needed = samples_per_step(world_size, GroupCap.of(options, world_size, largest_sp).size)
    if options.global_batch_samples is not None:
        least = covering_samples(len(tokens), needed)
        return options.updated(global_batch_samples=max(options.global_batch_samples, least))
    if options.global_batch_tokens is not None:
        least = covering_tokens(tokens, needed)
        return options.updated(global_batch_tokens=max(options.global_batch_tokens, least))
    return options


def check_enough_samples(count: int, needed: int, world_size: int, cap: GroupCap) -> None:
    """Raise ``ValueError`` when ``count`` samples cannot give one step the ``needed``
    micro-batches that cover ``world_size`` ranks in groups of at most ``cap.size``."""
    if count < needed:
        wider = ", or a larger --max-sp-size" if cap.set_by_user else ""
        raise ValueError(
            f"the dataset has {counted(count, 'sample')}, and a step on "
            f"{counted(world_size, 'rank')} in groups of at most {counted(cap.size, 'rank')} "
            f"({cap.source}) needs {needed}: give more samples, or at most --world "
            f"{count * cap.size}{wider}"
        )


def check_global_batch(
    options: SchedulingConfig,
    shapes: Sequence[SampleShape],
    *,
    world_size: int,
    largest_sp: int,
    seed: int,
    epochs: int,
    iterations: int | None = None,
) -> None:
    """Raise ``ValueError`` naming the fix when a given global batch
    (``options.global_batch_tokens`` / ``global_batch_samples``) would fail inside the
    ranks: a token bound below the longest sample, or a step of the run's epochs
    (``epochs``, or as many as ``iterations`` steps take) with fewer samples than the
    groups covering ``world_size`` ranks (groups of at most ``largest_sp`` ranks) need.
    Pure: the steps are the sampler's own (:func:`epoch_batches`)."""
    tokens = [shape.tokens for shape in shapes]
    bound_tokens, bound_samples = options.global_batch_tokens, options.global_batch_samples
    if not len(tokens) or (bound_tokens is None and bound_samples is None):
        return
    cap = GroupCap.of(options, world_size, largest_sp)
    needed = samples_per_step(world_size, cap.size)
    check_enough_samples(len(tokens), needed, world_size, cap)
    longest, flag = int(max(tokens)), "--global-batch-tokens"
    if bound_samples is None and bound_tokens < longest:
        raise BatchBelowLongest(bound_tokens, longest)
    if bound_samples is not None:
        fix, flag = covering_samples(len(tokens), needed), "--global-batch-samples"
    else:
        fix = covering_tokens(tokens, needed, options.drop_remainder)
        if bound_tokens >= fix:
            return  # every data order covers the groups
    view = DatasetView(shapes)
    epoch = 0
    while epoch < min(epochs, 1000):
        batches, short = short_step(
            view, options, seed, epoch, (bound_tokens, bound_samples), world_size, needed
        )
        if short is not None:
            given = bound_samples if bound_samples is not None else bound_tokens
            raise ValueError(
                f"{flag} {given}: step {short + 1} of epoch {epoch} holds "
                f"{counted(len(batches[short]), 'sample')}, and {counted(world_size, 'rank')} "
                f"in groups of at most {cap.size} ({cap.source}) need {needed} a step; give "
                f"{flag} {fix} or more, or fewer ranks (--world)"
            )
        if bound_samples is not None:
            return  # the same counts in every order
        if epoch == 0 and iterations is not None:
            epochs = -(-iterations // len(batches))
        epoch += 1


def short_step(
    view: DatasetView,
    options: SchedulingConfig,
    seed: int,
    epoch: int,
    bounds: tuple[int | None, int | None],
    world_size: int,
    needed: int,
) -> tuple[list[np.ndarray], int | None]:
    """The epoch's global batches of every sample of ``view`` under ``bounds`` (tokens,
    samples; ``None``: the default) and ``options``' window and remainder (the sampler's
    own, :func:`epoch_batches`), and the index of the first holding fewer than ``needed``
    samples (``None``: none does)."""
    batches, _ = epoch_batches(
        view,
        np.arange(len(view.tokens)),
        seed=seed,
        epoch=epoch,
        tokens_bound=bounds[0],
        samples_bound=bounds[1],
        world_size=world_size,
        reorder_window=options.reorder_window,
        drop_remainder=options.drop_remainder,
    )
    return batches, next((k for k, batch in enumerate(batches) if len(batch) < needed), None)


def stratified_order(view: DatasetView, active: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``active`` interleaved so that every stretch holds each bucket in proportion
    to its size (each bucket shuffled; bucket ``b``'s ``i``-th sample sits at
    ``(i + u_b) / n_b`` with a random offset ``u_b``)."""
    buckets = view.bucket_of[active]
    counts = np.bincount(buckets, minlength=len(view.buckets))
    perm = rng.permutation(len(active))
    shuffled, bshuf = active[perm], buckets[perm]
    by_bucket = stable_order(bshuf, len(view.buckets))
    rank = np.empty(len(active), dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(counts)])[:-1]
    rank[by_bucket] = np.arange(len(active)) - starts[bshuf[by_bucket]]
    offset = rng.random(len(view.buckets))
    key = (rank + offset[bshuf]) / counts[bshuf]
    return shuffled[np.argsort(key, kind="stable")]


def chunk_even(
    order: np.ndarray, weights: np.ndarray, bound: int, drop_remainder: bool
) -> tuple[list[np.ndarray], list[int]]:
    """``ceil(total / bound)`` consecutive global batches of ``order`` of nearly equal
    weight (so no tiny last one); with ``drop_remainder``, ``floor(total / bound)``
    full batches and the rest of ``order`` dropped."""
    cum = np.cumsum(weights)
    total = int(cum[-1])
    dropped: list[int] = []
    if drop_remainder and total >= bound:
        k = total // bound
        keep = int(np.searchsorted(cum, k * bound, side="right"))
        dropped = order[keep:].tolist()
        order, cum, total = order[:keep], cum[:keep], int(cum[keep - 1])
    else:
        k = max(1, -(-total // bound))
    cuts = np.searchsorted(cum, total * np.arange(1, k) / k, side="left") + 1
    if k <= len(order):
        # a sample longer than a batch's share can hold two targets (or the last one): the
        # cuts then fall together and the epoch had fewer than k steps, one of them twice a
        # batch; kept apart (one sample at least a batch), every epoch has k steps
        offsets = np.arange(k - 1)
        cuts = np.minimum(np.maximum.accumulate(cuts - offsets), len(order) - k + 1) + offsets
    chunks = [c for c in np.split(order, cuts) if len(c)]
    return chunks, dropped


def reorder_windows(view: DatasetView, chunks: list[np.ndarray], window: int) -> list[np.ndarray]:
    """Deal each window of ``window`` consecutive batches' samples again among its
    batches: longest first, each to the batch with the least ``sum L**2`` so far among
    those still below their original sample count (so batch sizes are kept)."""
    if window <= 1:
        return chunks
    out: list[np.ndarray] = []
    for start in range(0, len(chunks), window):
        part = chunks[start : start + window]
        pool = np.concatenate(part)
        lengths = view.tokens[pool].astype(float)
        room = [len(c) for c in part]
        heap = [(0.0, k) for k in range(len(part))]
        dealt: list[list[int]] = [[] for _ in part]
        for j in np.argsort(-lengths, kind="stable").tolist():
            work, k = heapq.heappop(heap)
            dealt[k].append(int(pool[j]))
            room[k] -= 1
            if room[k]:
                heapq.heappush(heap, (work + lengths[j] ** 2, k))
        out += [np.asarray(sorted(d), dtype=np.int64) for d in dealt]
    return out


def epoch_batches(
    view: DatasetView,
    active: np.ndarray,
    *,
    seed: int,
    epoch: int,
    tokens_bound: int | None,
    samples_bound: int | None,
    world_size: int,
    reorder_window: int = 1,
    drop_remainder: bool = False,
) -> tuple[list[np.ndarray], list[int]]:
    """The epoch's global batches (sample ids per step) and the ids dropped with
    ``drop_remainder``: a pure function of the dataset, ``(seed, epoch)`` and the global
    batch (``world_size`` only for the default token bound). See the module doc."""
    order = stratified_order(view, active, order_rng(seed, epoch))
    if samples_bound is not None:
        weights, bound = np.ones(len(order), dtype=np.int64), int(samples_bound)
    else:
        weights = view.tokens[order]
        bound = int(tokens_bound or default_tokens_per_iteration(view, active, world_size))
        longest = int(weights.max())
        if bound < longest:
            raise BatchBelowLongest(bound, longest)
    chunks, dropped = chunk_even(order, weights, bound, drop_remainder)
    return reorder_windows(view, chunks, reorder_window), dropped


def order_change(base: list[np.ndarray], other: list[np.ndarray]) -> dict[str, float]:
    """How the data order ``other`` differs from ``base`` (both: sample ids per step, the
    same samples): ``moved_share``, the share of samples trained at another step;
    ``mean_shift`` and ``max_shift``, in steps, over all samples (a window of ``K``
    moves a sample by at most ``K - 1``)."""
    step_of = {int(i): k for k, chunk in enumerate(base) for i in chunk.tolist()}
    moved = [(int(i), k) for k, chunk in enumerate(other) for i in chunk.tolist()]
    if len(moved) != len(step_of) or any(i not in step_of for i, _ in moved):
        raise ValueError(f"the orders hold different samples ({len(step_of)} and {len(moved)})")
    shifts = np.asarray([abs(k - step_of[i]) for i, k in moved], dtype=np.int64)
    return {
        "moved_share": float((shifts > 0).mean()),
        "mean_shift": float(shifts.mean()),
        "max_shift": int(shifts.max()),
    }


def steps_per_epoch(
    shapes: Sequence[SampleShape], options: SchedulingConfig, *, seed: int, world_size: int
) -> int:
    """Optimizer steps of an epoch over every sample of ``shapes`` (its global batches,
    :func:`epoch_batches`: the same for every epoch, policy and, with an explicit global
    batch, world size); commands check settings against a run's length with it."""
    view = DatasetView(shapes)
    batches, _ = epoch_batches(
        view,
        np.arange(len(shapes)),
        seed=seed,
        epoch=0,
        tokens_bound=options.global_batch_tokens,
        samples_bound=options.global_batch_samples,
        world_size=world_size,
        reorder_window=options.reorder_window,
        drop_remainder=options.drop_remainder,
    )
    return len(batches)
