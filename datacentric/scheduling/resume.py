"""Where a run stands in its data, and the schedule that continues from there.

One state type, :class:`Position`, serves every resume: the trainer's checkpoints,
``DataCentric.state_dict()`` in a user's loop, and the per-rank sampler.

An epoch runs in *segments*: a segment is one schedule built for one world size
over the samples the epoch had not run when the segment began. A run that never
changes world size has one segment per epoch. Continuing on a different number of
ranks ends the segment: where the epoch's global batches do not depend on the world (an
explicit global batch, ``same_batches``), the new segment is the whole epoch's schedule
for the new world, continued at the step the epoch stands at, so the run trains the
steps an uninterrupted run would; otherwise the remaining samples are planned for the new
world (:func:`continue_schedule`). Either way every sample runs exactly once per epoch.
A run given no global batch is cut by the default of the world it started on (which
grows with the world): its checkpoints and positions record it
(:func:`batch_tokens_to_record`, :attr:`Position.global_batch_tokens`) and a resume on
another world keeps it (:func:`kept_global_batch`, :func:`resumed_global_batch`), so that
its batches do not depend on the world either.

A segment's schedule is a pure function of (shapes, policy, world size, cost model,
seed, epoch, excluded samples), so the position needs only those numbers and ids; a
fingerprint of the rebuilt schedule guards against a changed dataset, cost model or
option (a clear error, not a silent skip).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from datacentric.progress import counted
from datacentric.schedule import Iteration, Schedule
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.global_batches import (
    GlobalBatchSize,
    GroupCap,
    check_global_batch,
    default_tokens_per_iteration,
    samples_per_step,
)
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.shapes import SampleShape

MakeSchedule = Callable[[int, Sequence[int] | None], Schedule]
"""``make_schedule(epoch, sample_ids)``: an epoch's schedule, restricted to
``sample_ids`` unless ``None`` (for example ``DataCentric.schedule``)."""


def schedule_fingerprint(schedule: Schedule) -> str:
    """A hash of who runs which samples where: policy, world, seed, epoch and every
    group's ranks, phase and sample ids in order (estimates and meta excluded)."""
    digest = hashlib.sha256()
    head = (schedule.policy, schedule.world_size, schedule.seed, schedule.epoch)
    digest.update(repr((*head, schedule.num_samples)).encode())
    _hash_steps(digest, schedule.iterations)
    digest.update(np.asarray(schedule.dropped_sample_ids, dtype=np.int64).tobytes())
    return digest.hexdigest()[:32]


def steps_fingerprint(iterations: Sequence[Iteration]) -> str:
    """A hash of who runs which samples where in ``iterations``, a segment's first steps
    (hashed as :func:`schedule_fingerprint` hashes every step): what a position saved
    before its segment's whole schedule was known holds of it."""
    digest = hashlib.sha256()
    _hash_steps(digest, iterations)
    return digest.hexdigest()[:32]


def _hash_steps(digest: Any, iterations: Sequence[Iteration]) -> None:
    """Add each step's groups (ranks, phase) and their micro-batches' sample ids to ``digest``."""
    for it in iterations:
        for a in it.assignments:
            where = [-1, it.index, a.rank_start, a.sp_size] + ([-3, a.phase] if a.phase else [])
            digest.update(np.asarray(where, np.int64).tobytes())
            for mb in a.micro_batches:
                digest.update(np.asarray((-2, *mb.sample_ids), dtype=np.int64).tobytes())


@dataclass
class Position:
    """A run's progress through its data; JSON-able (:meth:`to_json`)."""

    epoch: int = 0
    iterations_done: int = 0
    """Optimizer steps since the run's start (across epochs and restarts)."""
    samples_seen: int = 0
    """Samples trained since the run's start."""
    segment_world: int | None = None
    """World size the current segment's schedule was built for (None: no segment yet)."""
    segment_excluded: list[int] = field(default_factory=list)
    """Sample ids the epoch had already run when the segment began."""
    segment_iteration: int = 0
    """Next iteration of the current segment's schedule."""
    segment_fingerprint: str = ""
    """Fingerprint of the segment's schedule (checked when it is rebuilt); empty where
    it was not yet known when the position was saved (a stop on a signal early in the
    segment): :attr:`segment_steps_known` then says how much of it was."""
    segment_steps_known: int = 0
    """Where :attr:`segment_fingerprint` is empty: how many of the segment's first steps
    were built when the position was saved (0: none known, or the whole is)."""
    segment_steps_fingerprint: str = ""
    """:func:`steps_fingerprint` of those first :attr:`segment_steps_known` steps (checked
    when the rebuilt segment has built them)."""
    consumed: list[int] = field(default_factory=list)
    """Sample ids of this epoch that have run (in order)."""
    global_batch_tokens: int | None = None
    """The global batch (tokens) the run trains, its default included, as
    ``DataCentric.state_dict()`` records it (:func:`batch_tokens_to_record`): a resume
    given none keeps it (:func:`resumed_global_batch`). ``None``: given in samples, or a
    state saved before positions held it, which loads as before (a reader that predates
    the field passes over its key)."""

    @classmethod
    def at(cls, schedule: Schedule, next_iteration: int) -> Position:
        """The position once iterations ``0..next_iteration-1`` of a whole epoch's
        ``schedule`` have run (counters start at the epoch)."""
        if not 0 <= next_iteration <= len(schedule.iterations):
            raise ValueError(
                f"next_iteration {next_iteration} is outside 0..{len(schedule.iterations)}"
            )
        consumed = [i for it in schedule.iterations[:next_iteration] for i in it.sample_ids()]
        return cls(
            epoch=schedule.epoch,
            iterations_done=int(next_iteration),
            samples_seen=len(consumed),
            segment_world=schedule.world_size,
            segment_iteration=int(next_iteration),
            segment_fingerprint=schedule_fingerprint(schedule),
            consumed=consumed,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (:meth:`from_json` reads it back)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Position:
        """The position :meth:`to_json` wrote, with lists of its own (advancing it leaves
        ``d`` as it was saved, to be loaded again)."""
        if "segment_iteration" not in d or "consumed" not in d:
            raise ValueError(
                "not a datacentric position (fields epoch, iterations_done, segment_*, "
                f"consumed); got keys {sorted(d)}: it was saved by another version"
            )
        kept = [k for k in cls.__dataclass_fields__ if k in d]
        return cls(**{k: list(d[k]) if isinstance(d[k], list) else d[k] for k in kept})

    def remaining(self, num_samples: int) -> list[int] | None:
        """Sample ids the current segment schedules (``None``: the whole epoch)."""
        if not self.segment_excluded:
            return None
        excluded = set(self.segment_excluded)
        left = [i for i in range(num_samples) if i not in excluded]
        if not left:
            raise ValueError(f"epoch {self.epoch} has no samples left to run")
        return left

    def advance(self, sample_ids: Sequence[int], segment_length: int) -> None:
        """Record one finished optimizer step of ``sample_ids``; at the end of a
        segment of ``segment_length`` iterations, move to the next epoch."""
        self.iterations_done += 1
        self.samples_seen += len(sample_ids)
        self.segment_iteration += 1
        self.consumed.extend(int(i) for i in sample_ids)
        if self.segment_iteration >= segment_length:
            self.next_epoch()

    def next_epoch(self) -> None:
        """Move to the start of the next epoch."""
        self.epoch += 1
        self.consumed = []
        self.segment_excluded = []
        self.segment_iteration = 0
        self.segment_world = None
        self.forget_schedule()

    def forget_schedule(self) -> None:
        """Hold nothing of the current segment's schedule (a new segment begins)."""
        self.segment_fingerprint = ""
        self.known_steps(0, "")

    def known_steps(self, count: int, fingerprint: str) -> None:
        """Hold that the segment's first ``count`` steps have ``fingerprint``
        (:func:`steps_fingerprint`), its whole schedule not yet known."""
        self.segment_steps_known, self.segment_steps_fingerprint = int(count), fingerprint


def continue_schedule(
    position: Position,
    num_samples: int,
    world_size: int,
    make_schedule: MakeSchedule,
    *,
    same_batches: bool = False,
) -> Schedule:
    """The schedule that continues from ``position`` on ``world_size`` ranks.

    Starts a new segment when needed (new epoch, or a world size other than the saved
    segment's: see :func:`begin_segment` and ``same_batches``) and updates ``position``
    accordingly. Raises ``ValueError`` if the rebuilt schedule differs from the one the
    position was taken from, or, on another world, its steps up to the position do not
    hold the samples that ran.
    """
    ids = begin_segment(position, num_samples, world_size, same_batches=same_batches)
    schedule = make_schedule(position.epoch, ids)
    if position.segment_iteration:
        check_steps_run(position, schedule.iterations, world_size, schedule.policy)
    check_segment(position, schedule)
    return schedule


def begin_segment(
    position: Position, num_samples: int, world_size: int, *, same_batches: bool = False
) -> list[int] | None:
    """Start a new segment in ``position`` where the world size is not the saved
    segment's; the sample ids the segment schedules (``None``: the whole epoch). With
    ``same_batches`` (the epoch's global batches do not depend on the world: an explicit
    global batch) and a segment that holds the whole epoch, the new segment is the whole
    epoch again, at the step the epoch stands at: the steps that ran are the rebuilt
    schedule's first ones (checked by :func:`check_steps_run`), and the rest are the
    global batches an uninterrupted run trains next. Otherwise the samples the epoch has
    not run are re-planned. The first half of :func:`continue_schedule`: a runtime that
    streams the segment's steps calls :func:`check_segment` once its schedule is whole."""
    if position.segment_world != world_size:
        if not (same_batches and not position.segment_excluded):
            position.segment_excluded = sorted(position.consumed)
            position.segment_iteration = 0
        position.segment_world = world_size
        position.forget_schedule()
    return position.remaining(num_samples)


def check_segment(position: Position, schedule: Schedule, found: str = "") -> None:
    """Raise ``ValueError`` when ``schedule``, the segment's rebuilt schedule, is not
    the one ``position`` was saved from (its fingerprint, else its first steps'), or is
    shorter than where the position stands; else hold its fingerprint in ``position``.
    ``found``: where the run found a difference (said in the error)."""
    fingerprint = check_fingerprint(position.segment_fingerprint, position.epoch, schedule, found)
    check_length(position, len(schedule.iterations))
    world, policy = schedule.world_size, schedule.policy
    check_known_steps(position, schedule.iterations, world, policy, found, whole=True)
    position.segment_fingerprint = fingerprint
    position.known_steps(0, "")  # the whole is known now


def check_fingerprint(saved: str, epoch: int, schedule: Schedule, found: str = "") -> str:
    """The fingerprint of epoch ``epoch``'s rebuilt ``schedule``; ``ValueError`` when it
    is not the one a position saved (``saved``; empty: nothing to compare)."""
    fingerprint = schedule_fingerprint(schedule)
    if saved and saved != fingerprint:
        raise schedule_changed(epoch, schedule.world_size, schedule.policy, found)
    return fingerprint


def schedule_changed(epoch: int, world_size: int, policy: str, found: str = "") -> ValueError:
    """The error of a segment's rebuilt schedule that is not the saved one (``found``:
    where the run found it, said in parentheses)."""
    where = f" ({found})" if found else ""
    return ValueError(
        f"the rebuilt schedule of epoch {epoch} (world {world_size}, policy {policy}) differs "
        f"from the saved one{where}: the dataset, model, cost model or options changed since "
        "it was saved; resume with the same settings"
    )


def check_length(position: Position, num_steps: int) -> None:
    """Raise ``ValueError`` when ``position`` stands past the end of its segment's
    schedule of ``num_steps`` steps (known before the steps are built)."""
    if position.segment_iteration > num_steps:
        raise ValueError(
            f"the saved position is at iteration {position.segment_iteration} of a "
            f"{num_steps}-iteration schedule"
        )


def check_steps_run(
    position: Position, built: Sequence[Iteration], world_size: int, policy: str
) -> None:
    """Raise ``ValueError`` when the samples of the rebuilt segment's first steps
    (``built``, up to where ``position`` stands) are not those the position says its
    segment ran (the tail of ``consumed``), step by step (in any order within a step: a
    step run on another world lists its samples by that world's ranks): a changed
    schedule found before the next step runs, without its whole build (the fingerprint
    is checked once it is whole)."""
    ran = position.consumed[len(position.segment_excluded) :]
    at = 0
    for it in built[: position.segment_iteration]:
        ids = it.sample_ids()
        if sorted(ran[at : at + len(ids)]) != sorted(ids):
            raise schedule_changed(position.epoch, world_size, policy)
        at += len(ids)
    if at != len(ran):
        raise schedule_changed(position.epoch, world_size, policy)


def check_known_steps(
    position: Position,
    built: Sequence[Iteration],
    world_size: int,
    policy: str,
    found: str = "",
    *,
    whole: bool = False,
) -> bool:
    """Whether the rebuilt segment's steps ``built`` (its first ones; ``whole``: all of
    them) reach the steps ``position`` held the fingerprint of, saved before its whole
    schedule was known (:attr:`Position.segment_steps_known`; True when it holds none):
    ``ValueError`` when those steps are not the saved ones, or the whole has fewer
    (``found``: where the run found it)."""
    known = position.segment_steps_known
    if not known:
        return True
    if len(built) < known and not whole:
        return False
    if len(built) < known or steps_fingerprint(built[:known]) != position.segment_steps_fingerprint:
        raise schedule_changed(position.epoch, world_size, policy, found)
    return True


def batch_tokens_to_record(
    options: SchedulingConfig, shapes: Sequence[SampleShape], world_size: int
) -> int | None:
    """The global batch (tokens) a run's checkpoints record: ``options``' own, else,
    where they give none, the default its epochs are cut by on ``world_size`` ranks
    (:func:`~datacentric.scheduling.global_batches.default_tokens_per_iteration` of
    the samples of ``shapes``), which a resume on another world keeps
    (:func:`kept_global_batch`); ``None`` where the batch is given in samples (the
    settings hold it) or there are no samples."""
    if options.global_batch_samples is not None or not len(shapes):
        return None
    if options.global_batch_tokens is not None:
        return int(options.global_batch_tokens)
    view = DatasetView(shapes)
    return default_tokens_per_iteration(view, np.arange(len(shapes)), world_size)


def kept_global_batch(
    options: SchedulingConfig,
    recorded: int | None,
    shapes: Sequence[SampleShape],
    world_size: int,
    setting: str = "--global-batch-tokens",
) -> GlobalBatchSize | None:
    """The global batch a resume on ``world_size`` ranks trains where ``options`` give
    none: ``recorded``, the batch (tokens) the checkpoint it continues recorded (the
    default its run chose), with a note where this world's default differs (naming
    ``setting``, the one that gives the batch). ``None``
    where ``options`` give a batch (the resume's settings check
    compares it with the recorded one) or the checkpoint recorded none (saved before
    checkpoints held it: this world's default, as before). Why: the default grows with
    the world, so a resume on another world cut the rest of the epoch into other, larger
    or smaller, global batches: other training math, without a word."""
    given = options.global_batch_tokens, options.global_batch_samples
    if recorded is None or any(value is not None for value in given):
        return None
    here = batch_tokens_to_record(options, shapes, world_size)
    if here == recorded:
        return GlobalBatchSize(int(recorded))
    note = (
        f"global batch kept at {int(recorded):,} tokens, the default the resumed run trained "
        f"({counted(world_size, 'rank')} would default to {here:,}), so that its steps stay "
        f"those of the uninterrupted run ({setting} gives it; another is refused)"
    )
    return GlobalBatchSize(int(recorded), note)


def kept_batch_shortfall(
    kept: GlobalBatchSize,
    options: SchedulingConfig,
    shapes: Sequence[SampleShape],
    *,
    sp_sizes: Sequence[int],
    world_size: int,
    seed: int,
    epochs: int,
    iterations: int | None = None,
) -> str | None:
    """Check the global batch a resume keeps (``kept``, applied to ``options``) on
    ``world_size`` ranks, with the SP sizes ``sp_sizes`` allows, as a given one is
    (:func:`~datacentric.scheduling.global_batches.check_global_batch`, over ``epochs``
    epochs or as many as ``iterations`` steps take): ``None`` where every step fills this
    world's groups, else the words saying which need a step falls short of ('a step of
    it holds fewer than the 4 samples ...'), for the caller's line and fix. Why not the
    check's own line: it advises a larger batch, which a resume refuses (its steps would
    not be the run's). A dataset with fewer samples than the groups: the check's own
    ``ValueError`` (that limit is the data's, said as for any start)."""
    applied, largest = kept.applied(options), max(sp_sizes, default=1)
    try:
        check_global_batch(
            applied,
            shapes,
            world_size=world_size,
            largest_sp=largest,
            seed=seed,
            epochs=epochs,
            iterations=iterations,
        )
    except ValueError:
        cap = GroupCap.of(applied, world_size, largest)
        needed = samples_per_step(world_size, cap.size)
        if len(shapes) < needed:
            raise
        return (
            f"a step of it holds fewer than the {needed} samples {counted(world_size, 'rank')} "
            f"in groups of at most {cap.size} ({cap.source}) need"
        )
    return None


def resumed_global_batch(
    options: SchedulingConfig,
    position: Position,
    shapes: Sequence[SampleShape],
    world_size: int,
    *,
    sp_sizes: Sequence[int] | None,
    seed: int,
) -> GlobalBatchSize | None:
    """The global batch a user's loop resumed from ``position`` on ``world_size`` ranks
    trains (``DataCentric.load_state_dict``): where ``options`` give none, the one the
    position recorded (:func:`kept_global_batch`, its note naming
    ``tokens_per_iteration``); ``None`` where ``options`` give that batch or the position
    recorded none (a state saved before positions held it: the options as they are).
    ``ValueError`` (one line) where ``options`` give another: the rest of the epoch
    would be cut into other steps than those of the run that saved it; where a step of
    the kept batch cannot fill this world's groups (``sp_sizes``, ``None``: any size; the
    epochs up to the position's, seeded by ``seed``: :func:`kept_batch_shortfall`), naming
    the fix that works here: fewer ranks (the world the state was saved on), or a new run."""
    recorded = position.global_batch_tokens
    tokens, samples = options.global_batch_tokens, options.global_batch_samples
    if recorded is not None and samples is not None:
        given = f"{counted(int(samples), 'sample', ',')} (options.global_batch_samples)"
    elif recorded is not None and tokens is not None and int(tokens) != int(recorded):
        given = f"{int(tokens):,} tokens (tokens_per_iteration)"
    else:
        kept = kept_global_batch(options, recorded, shapes, world_size, "tokens_per_iteration")
        if kept is None:
            return None
        where = {"sp_sizes": sp_sizes or [world_size], "world_size": world_size, "seed": seed}
        short = kept_batch_shortfall(kept, options, shapes, epochs=position.epoch + 1, **where)
        if short is None:
            return kept
        saved = position.segment_world
        fewer = f" ({counted(saved, 'rank')}, the world it was saved on)" if saved else ""
        raise ValueError(
            f"DataCentric: the state to load keeps the global batch of {kept.tokens:,} tokens "
            "its run trained (so that its steps stay those of the run that saved it; another "
            f"is refused), and {short}: load it on fewer ranks{fewer}, or start a new run (a "
            "DataCentric given no state)"
        )
    raise ValueError(
        f"DataCentric: the state to load was saved by a run training a global batch of "
        f"{int(recorded):,} tokens, and this DataCentric gives {given}: give "
        f"tokens_per_iteration={int(recorded)}, or none to keep it, so that the resumed "
        "steps are those of the run that saved it"
    )
