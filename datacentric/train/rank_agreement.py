"""What every rank of a training run must hold alike, checked when the run starts.

Under torchrun on several nodes each node runs its own command: a node started with
another ``--seed``, another ``--config`` file or other files under the same dataset path
plans other steps from the same collectives, and trains on without a word (or hangs in a
collective the others never call); a node whose ``--out`` is not the folder the others
write (no shared filesystem) saves its part of every checkpoint where no resume finds it.
Two collective checks refuse both before anything is trained or written, in the same
line on every rank (so each node says it once):

- :func:`check_same_run` (when the run is assembled, before any collective it issues):
  every rank's settings (but ``job.out``, which :func:`check_shared_run_folder` checks),
  the shapes of its training samples and the ranks of its node (torchrun's
  ``LOCAL_WORLD_SIZE``: a node is what the plan keeps groups within) are rank 0's;
- :func:`check_shared_run_folder` (once rank 0 holds the run folder's lock): every rank
  reads, in its own ``job.out``, the lock file rank 0's side wrote.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from datacentric.parallel.groups import ProcessGroups, local_world_size
from datacentric.planning.plan import BucketChoice, BucketPlan, Plan
from datacentric.scheduling.pipeline import Pipeline
from datacentric.shapes import SampleShape
from datacentric.train.run_folder import LOCK_FILE

_SAME_COMMAND = "start every node with the same command and --config file"


def _gathered(groups: ProcessGroups, value: Any) -> list[Any]:
    """``value`` of every rank, by rank (collective on the world's group)."""
    values: list[Any] = [None] * groups.world_size
    dist.all_gather_object(values, value, group=groups.world)
    return values


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    """``section.key`` -> value of sectioned settings (:meth:`TrainConfig.to_json`)."""
    flat: dict[str, Any] = {}
    for section, keys in settings.items():
        if isinstance(keys, dict):
            flat.update({f"{section}.{key}": value for key, value in keys.items()})
        else:
            flat[section] = keys
    return flat


def _where(rank: int, host: str) -> str:
    return f"rank {rank} (host {host})"


def check_same_run(
    groups: ProcessGroups, settings: dict[str, Any], shapes: Sequence[SampleShape]
) -> None:
    """Refuse, on every rank, a run whose ranks were given other settings than rank 0's
    (``settings``: :meth:`~datacentric.settings.TrainConfig.to_json`; ``job.out`` apart),
    read other training samples (``shapes``) or run on nodes of another number of ranks,
    in one ``ValueError`` naming the first rank that differs, its host and the setting.
    Collective; nothing for one process."""
    if not (groups.distributed and groups.world_size > 1):
        return
    flat = {k: v for k, v in _flat(settings).items() if k != "job.out"}
    digest = hashlib.sha256(repr([(s.tokens, s.grid) for s in shapes]).encode()).hexdigest()
    local = local_world_size(dist.get_world_size())  # the ranks of this node
    mine = (flat, digest, len(shapes), socket.gethostname(), local)
    first, *others = _gathered(groups, mine)
    for rank, (theirs, their_digest, count, host, their_local) in enumerate(others, start=1):
        if their_local != first[4]:  # a node is the plan's unit: every node holds as many
            raise ValueError(
                f"{_where(rank, host)} runs on a node of {their_local} rank(s) where rank 0 "
                f"(host {first[3]}) runs on one of {first[4]} (torchrun --nproc-per-node "
                "differs); start every node with the same --nproc-per-node"
            )
        for key in sorted(set(first[0]) | set(theirs)):
            if theirs.get(key) != first[0].get(key):
                raise ValueError(
                    f"{_where(rank, host)} was started with {key} = {theirs.get(key)!r} "
                    f"where rank 0 (host {first[3]}) has {first[0].get(key)!r}; "
                    f"{_SAME_COMMAND}"
                )
        if their_digest != first[1]:
            dataset = first[0].get("data.dataset")
            raise ValueError(
                f"{_where(rank, host)} reads other training samples under data.dataset "
                f"{dataset!r} than rank 0 (host {first[3]}): {count} samples against "
                f"{first[2]}, or other lengths; give every node the same files"
            )


def check_shared_run_folder(groups: ProcessGroups, out: str | Path) -> None:
    """Refuse, on every rank, a run whose ranks do not all see the run folder rank 0
    writes: each reads ``out``'s lock file (rank 0's side holds it by now, naming its
    host and process) after the others came here, and one that reads another (or none)
    is named with its host in one ``ValueError`` (no shared filesystem, or another
    ``--out``). Collective; nothing for one process."""
    if not (groups.distributed and groups.world_size > 1):
        return
    _gathered(groups, None)  # rank 0's side holds the lock before anyone reads it
    try:
        seen = (Path(out) / LOCK_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        seen = None
    first, *others = _gathered(groups, (seen, str(out), socket.gethostname()))
    for rank, (theirs, their_out, host) in enumerate(others, start=1):
        if theirs != first[0]:
            raise ValueError(
                f"{_where(rank, host)} does not see the run folder rank 0 (host "
                f"{first[2]}) writes: its --out {their_out} is another folder than rank "
                f"0's {first[1]} (checkpoints would be saved in parts); give every node "
                "the same --out on a filesystem they share"
            )


def _plan_record(pipeline: Pipeline) -> tuple[tuple, Exception | None]:
    """What a rank's plan is made of and decides, and what its planning raised (``None``
    when it planned): the hardware its cost model prices on (an analytic model's preset,
    picked by the device's name; another model's class), its budget and SP sizes, a
    digest of each bucket's decisions (:func:`_decisions`) and one of the plan's other
    fields. A refusal of its planning (``ValueError``) stands for the plan: it is raised
    again (the caller's line) where the plan is first used; another failure is raised
    once every rank has its record."""
    model = pipeline.cost_model
    hardware = getattr(getattr(model, "hardware", None), "name", None) or type(model).__name__
    try:
        plan: Plan = pipeline.plan
    except ValueError as err:  # the same on every rank that plans alike
        return (hardware, -1, pipeline.sp_sizes, {}, f"refused: {_one_line(err)}"), None
    except Exception as err:  # every rank still reaches the all-gather, told of it
        failed = f"failed: {type(err).__name__}: {_one_line(err)}"
        return (hardware, -1, pipeline.sp_sizes, {}, failed), err
    buckets = {
        name: _digest(_decisions(bucket, plan.preferred(name) if bucket.options else None))
        for name, bucket in plan.buckets.items()
    }
    rest = _digest(
        (plan.world_size, plan.num_blocks, plan.option_batch_limit, sorted(plan.skipped.items()))
    )
    return (hardware, plan.memory_cap_bytes, pipeline.sp_sizes, buckets, rest), None


def _decisions(bucket: BucketPlan, best: BucketChoice | None) -> tuple:
    """What a bucket's plan decides: its shape, each option's configuration (SP size,
    ring, recomputation, largest micro-batch, the micro-batches it is timed at) and the
    preferred choice (``best``), without the estimated times: those come from a
    least-squares fit or libm, whose last bits may differ on other CPUs without another
    decision."""
    options = [(o.sp_size, o.ring_size, o.recompute, o.max_batch, o.counts) for o in bucket.options]
    chosen = best and (best.sp_size, best.ring_size, best.recompute, best.micro_batch_size)
    return bucket.bucket, bucket.shape, options, chosen


def _one_line(err: BaseException) -> str:
    """``err``'s message on one line (a refusal's line says it)."""
    return " ".join(str(err).split()) or type(err).__name__


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _plan_difference(mine: tuple, first: tuple, zero: str) -> str | None:
    """What differs between a rank's :func:`_plan_record` and rank 0's (``first``; ``zero``
    names rank 0), as a refusal says it; ``None`` when nothing does."""
    hardware, budget, sizes, buckets, rest = mine
    hw0, budget0, sizes0, buckets0, rest0 = first
    if hardware != hw0:
        return f"prices its plan on hardware {hardware!r} where {zero} prices it on {hw0!r}"
    if rest != rest0 and "refused: " in (rest[:9], rest0[:9]):
        return (
            f"refused its plan ({rest[9:]}) where {zero} planned"
            if rest.startswith("refused: ")
            else f"planned where {zero} refused its plan ({rest0[9:]})"
        )
    if budget != budget0:
        return f"plans under {budget} bytes per rank where {zero} plans under {budget0}"
    if sizes != sizes0:
        return f"plans with SP sizes {sizes} where {zero} plans with {sizes0}"
    for name in [*buckets0, *(b for b in buckets if b not in buckets0)]:
        if buckets.get(name) != buckets0.get(name):
            return f"plans bucket {name!r} otherwise than {zero}"
    return None if rest == rest0 else f"made another plan than {zero}"


def check_same_plan(groups: ProcessGroups, pipeline: Pipeline) -> None:
    """Refuse, on every rank, ranks that made other plans from the same settings and
    samples (``pipeline``'s: each rank plans alone, from what its own machine says, and
    ranks that plan otherwise run other steps: a hang, or another computation), in one
    ``ValueError`` naming the first rank that differs, its host and what differs (the
    hardware its cost model prices on, the budget, the SP sizes, a bucket's decisions).
    A rank whose planning failed takes part too: it raises its error after the
    all-gather, and the others a ``ValueError`` naming it and its error. Makes the plan;
    one small all-gather. Collective; nothing for one process."""
    if not (groups.distributed and groups.world_size > 1):
        return
    record, failure = _plan_record(pipeline)
    gathered = _gathered(groups, (record, socket.gethostname()))
    if failure is not None:  # told to the others below, in one line
        raise failure
    for rank, (theirs, host) in enumerate(gathered):
        if theirs[4].startswith("failed: "):
            raise ValueError(
                f"{_where(rank, host)} could not make its plan ({theirs[4][8:]}); "
                "see that rank's error"
            )
    first, *others = gathered
    for rank, (record, host) in enumerate(others, start=1):
        difference = _plan_difference(record, first[0], _where(0, first[1]))
        if difference is not None:
            raise ValueError(
                f"{_where(rank, host)} {difference}, and would run other steps: give every "
                "rank the same device model, or one cost model (cost_model=, or --cost-model "
                "profile, which rank 0 reads for every rank)"
            )
