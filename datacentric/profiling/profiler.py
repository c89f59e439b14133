"""Dual-layer profiling on the real device, through the real runtime.

For a micro-batch (sample shapes) on an SP size, the profiler runs the model
truncated to at most two blocks: ``(depth, recomputed blocks)`` in
``(0, 0), (1, 1), (2, 0), (2, 2)``. Times fit ``T(d, k) = base + d*block +
k*recompute`` by least squares (four runs, three unknowns: the depth-0 run pins the
base directly, so the per-block time is ``(T(2) - T(0)) / 2`` rather than a
difference of two nearly equal numbers); peak memory gives, exactly,

    base = M(0)      block = (M(2, 0) - M(0)) / 2      recomputed = M(2, 2) - M(1, 1)
    transient = M(1, 1) - base - recomputed

(:class:`~datacentric.planning.fitted.ProfilePoint`). Runs go through
:class:`~datacentric.parallel.runtime.DataCentricRuntime` on ``world_size`` ranks
(gloo on CPU, NCCL on GPUs), so SP sizes above 1 are measured with the real
Ulysses all-to-alls in real process groups. Every rank takes part in every round:
each round runs one case on every group of its SP size, so every rank is busy as in a
training step; a case's time is the median over ``repeats`` passes (each pass: its
slowest rank) after ``warmup`` passes, the timed passes cycling through all cases so
that a changing machine load touches every case alike. The first warm-up pass measures memory
(:mod:`datacentric.profiling.memory`), to which parameters, gradients and Adam's
two moments are added from their sizes.

:func:`measure_profile` measures a whole profile: the dual-layer points of the micro-batches
:func:`select_profile_shapes` picks, on every SP size (:func:`default_sp_sizes` when none
are given), as one :class:`~datacentric.profiling.store.Profile`.

The profiler sits above the runtime (it runs it); the cost models it fits and the
planner that reads them stay pure, below it.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from datacentric.data import SyntheticTextDataset, SyntheticVideoDataset
from datacentric.models.lora import LoraSpec, apply_lora
from datacentric.models.model_args import ModelSource
from datacentric.models.presets import MODEL_PRESETS, build_model
from datacentric.models.source import build_from_source, resolve_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import run_step
from datacentric.planning.fitted import ProfilePoint
from datacentric.planning.model_specs import ModelSpec
from datacentric.profiling.memory import measure_peak, model_state_bytes
from datacentric.profiling.store import Profile
from datacentric.progress import Progress
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.settings.sections import CostConfig
from datacentric.shapes import SampleShape


@dataclass(frozen=True, kw_only=True)
class ProfileSettings:
    """How to measure: which model, on how many ranks, how carefully (``cost``: the
    ``[cost]`` section's ``warmup``, ``repeats``, ``threads_per_rank``, ``timeout_s``
    and ``interleave``)."""

    model: str
    """The model: a preset, ``hf:DIR_OR_NAME``, ``diffusers:DIR_OR_NAME`` or
    ``pkg.module:factory`` (:mod:`datacentric.models.source`)."""
    model_args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the model (``--model-arg``)."""
    lora: LoraSpec | None = None
    """LoRA adapters the run trains (the rest frozen); ``None``: every parameter."""
    dataset: Any = None
    """The run's dataset: its own samples of each profiled shape are measured (a model
    that is not a preset reads the inputs it was made for); ``None``: synthetic samples."""
    world_size: int
    """Ranks to start (each SP size measured must divide it)."""
    backend: str = "gloo"
    """``gloo`` (CPU) or ``nccl`` (one GPU per rank)."""
    dtype: str = "float32"
    """The dtype the run trains in (``float32``, ``bfloat16``): measured as the trainer
    runs it, float32 weights, gradients and optimizer state, ``bfloat16`` forwards under
    autocast (:func:`~datacentric.parallel.step.run_step`)."""
    seed: int = 0
    """Weights and synthetic data."""
    progress: bool = False
    """Show a progress bar (rank 0, on stderr)."""
    clock: str = "auto"
    """``wall``: the runtime's synchronised wall time of a pass; ``cpu``: the rank
    process's CPU time over the pass (all its threads: compute and gloo's transfers),
    which leaves out time the OS gives other processes on a shared machine; ``auto``:
    ``cpu`` on CPU ranks, ``wall`` on GPUs."""
    cost: CostConfig = field(default_factory=CostConfig)
    """How carefully: the ``[cost]`` section (its measurement keys)."""
    spec: ModelSpec | None = None
    """The model's spec without adapters (its blocks and their attention; its vocabulary
    bounds the synthetic samples' token ids, :func:`synthetic_token_ids`), as the caller
    found it once (a run's :attr:`~datacentric.train.build.RunModel.profile_spec`); ``None``:
    looked up by ``model`` where the profile command measures
    (:func:`~datacentric.profiling.factory.named_spec`, in
    :func:`~datacentric.profiling.autoprofile.run_profile`)."""
    source: ModelSource | None = None
    """The model as the caller resolved it once (a run's
    :attr:`~datacentric.train.build.RunModel.source`; its adapters are :attr:`lora`'s);
    ``None``: resolved from :attr:`model` and :attr:`model_args` where it is built."""
    identity: Mapping[str, Any] | None = None
    """What the profile's fingerprint records of a model that is not a preset (its class,
    config and parameter shapes), as the caller read it once off the model it built (a
    run's :attr:`~datacentric.train.build.RunModel.identity`); ``None`` for a preset,
    and where the profile command finds it by name
    (:func:`~datacentric.profiling.store.model_identity`, in
    :func:`~datacentric.profiling.autoprofile.run_profile`)."""
    ranks_per_node: int | None = None
    """The ranks of one node, as the caller's process groups read them once (a run's
    :attr:`~datacentric.train.build.RunPlace.ranks_per_node`: torchrun's
    ``LOCAL_WORLD_SIZE``); the profile records it (its fingerprint and its
    ``gpus_per_node``). ``None``: the whole world on this machine, as a spawn starts it."""


@dataclass(frozen=True)
class RunCase:
    """One measured configuration: a micro-batch on an SP group of a model of ``depth``
    blocks, with every block recomputing (``recompute``) or none."""

    shapes: tuple[SampleShape, ...]
    sp_size: int
    depth: int
    recompute: bool | tuple[bool, ...]

    def flags(self) -> tuple[bool, ...]:
        if isinstance(self.recompute, tuple):
            return self.recompute
        return (self.recompute,) * self.depth


@dataclass(frozen=True)
class RunResult:
    """Median pass time, every measured time, and peak bytes of the busiest rank."""

    case: RunCase
    time_s: float
    times: tuple[float, ...] = field(compare=False)
    memory_bytes: int
    grad_sync_s: float = 0.0
    state_bytes: int = 0
    """Parameters, gradients and optimizer state of the (truncated) model, per rank."""


DUAL_LAYER_RUNS = ((0, False), (1, True), (2, False), (2, True))


def dual_layer_cases(shapes: Sequence[SampleShape], sp_size: int) -> list[RunCase]:
    """The four runs that give one profile point."""
    return [RunCase(tuple(shapes), sp_size, d, r) for d, r in DUAL_LAYER_RUNS]


def point_from_runs(results: Sequence[RunResult]) -> ProfilePoint:
    """Per-block components from the four dual-layer runs of one micro-batch.

    Components are clamped at zero: each is a cost, and timing noise on a very small
    case must not turn one negative.
    """
    by = {(r.case.depth, r.case.recompute): r for r in results}
    missing = [k for k in DUAL_LAYER_RUNS if k not in by]
    if missing:
        raise ValueError(f"dual-layer runs missing (depth, recompute) {missing}")
    rows = np.array([[1.0, d, d if r else 0] for d, r in DUAL_LAYER_RUNS])
    times = np.array([by[k].time_s for k in DUAL_LAYER_RUNS])
    base_t, block_t, recompute_t = np.linalg.lstsq(rows, times, rcond=None)[0]
    m = {k: by[k].memory_bytes for k in DUAL_LAYER_RUNS}
    base_m = m[0, False]
    block_m = max(0, (m[2, False] - base_m) // 2)
    block_state = max(0, (by[2, False].state_bytes - by[0, False].state_bytes) // 2)
    recomputed_m = max(0, m[2, True] - m[1, True])
    first = by[0, False].case
    return ProfilePoint(
        shapes=first.shapes,
        sp_size=first.sp_size,
        base_time_s=max(0.0, float(base_t)),
        block_time_s=max(0.0, float(block_t)),
        recompute_time_s=max(0.0, float(recompute_t)),
        base_memory_bytes=base_m,
        block_memory_bytes=block_m,
        recomputed_block_memory_bytes=recomputed_m,
        transient_memory_bytes=max(0, m[1, True] - base_m - recomputed_m),
        block_state_bytes=block_state,
    )


def plan_rounds(cases: Sequence[RunCase], world_size: int) -> list[list[tuple[int, int]]]:
    """One round per case, as lists of (case index, rank_start): the case runs on every
    aligned block of its SP size, so every rank is busy with the same work, as in a
    training step. (Packing different cases side by side let a long SP-1 pass run beside
    a rank that had finished a short one: on two CPU ranks it measured 9.1 s for a pass
    that took 12.3 s in training with both ranks busy.)"""
    rounds: list[list[tuple[int, int]]] = []
    for i in sorted(range(len(cases)), key=lambda i: (cases[i].depth, -cases[i].sp_size)):
        size = cases[i].sp_size
        if world_size % size:
            raise ValueError(f"SP size {size} does not divide world size {world_size}")
        rounds.append([(i, start) for start in range(0, world_size, size)])
    return rounds


def measure(cases: Sequence[RunCase], settings: ProfileSettings) -> list[RunResult]:
    """Run every case on ``settings.world_size`` ranks and collect the results.

    Inside an initialised ``torch.distributed`` world (a training run) every rank must
    call this with the same arguments: the rounds run on the world's ranks and the
    results are gathered. Otherwise ``settings.world_size`` local ranks are started.
    """
    rounds = plan_rounds(cases, settings.world_size)
    if settings.dataset is None and not all(s.is_video for c in cases for s in c.shapes):
        synthetic_token_ids(settings)  # a model without a vocabulary: refused before ranks start
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() != settings.world_size:
            raise ValueError(
                f"profiling for world size {settings.world_size} inside a world of "
                f"{dist.get_world_size()} ranks"
            )
        per_rank: list[Any] = [None] * settings.world_size
        dist.all_gather_object(per_rank, _rank_worker(list(cases), rounds, settings))
    else:
        per_rank = spawn(
            _rank_worker,
            settings.world_size,
            list(cases),
            rounds,
            settings,
            backend=settings.backend,
            timeout_s=settings.cost.timeout_s,
            threads_per_rank=settings.cost.threads_per_rank,
        )
    results = []
    for i, case in enumerate(cases):
        ranks = [rank_results[i] for rank_results in per_rank if i in rank_results]
        # a pass of a group ends when its slowest rank ends
        times = tuple(max(values) for values in zip(*(r[0] for r in ranks)))
        results.append(
            RunResult(
                case=case,
                time_s=statistics.median(times),
                times=times,
                memory_bytes=max(r[1] for r in ranks),
                grad_sync_s=statistics.median([r[2] for r in ranks]),
                state_bytes=max(r[3] for r in ranks),
            )
        )
    return results


def select_profile_shapes(
    shapes: Sequence[SampleShape], *, max_points: int = 3, max_tokens: int | None = None
) -> list[tuple[SampleShape, ...]]:
    """Micro-batches to profile: up to ``max_points`` distinct bucket shapes spread
    geometrically over the token range (at most ``max_tokens`` each), plus four copies
    of the smallest (so the fit can tell a per-sample cost from a per-token one); one
    point is the smallest. Raises ``ValueError`` when ``max_points`` is below 1."""
    if max_points < 1:
        raise ValueError(f"--max-points {max_points}: profile at least one bucket shape")
    distinct = sorted(set(shapes), key=lambda s: (s.tokens, s.grid or (0, 0, 0)))
    if max_tokens is not None:
        distinct = [s for s in distinct if s.tokens <= max_tokens] or distinct[:1]
    if len(distinct) > max_points:
        last = len(distinct) - 1
        picks = sorted({round(i * last / max(1, max_points - 1)) for i in range(max_points)})
        distinct = [distinct[i] for i in picks]
    return [(s,) for s in distinct] + [(distinct[0],) * 4]


def attention_kind(model: str, spec: ModelSpec) -> str:
    """The attention of the blocks of a runnable model of ``spec`` (``causal`` or
    ``full``)."""
    kinds = spec.kinds
    if len(kinds) != 1:
        raise ValueError(f"{model}: the profiler handles one block kind, got {kinds}")
    return kinds[0]


def measure_profile(
    settings: ProfileSettings,
    shapes: Sequence[SampleShape],
    sp_sizes: Sequence[int],
    fingerprint: dict[str, Any],
    spec: ModelSpec,
    *,
    max_points: int = 3,
    max_tokens: int | None = None,
    extra_cases: Sequence[RunCase] = (),
) -> tuple[Profile, list[Any]]:
    """Dual-layer profile points of the micro-batches :func:`select_profile_shapes` picks
    of ``shapes`` (``max_points``, ``max_tokens``) on every SP size (one spawn), as the
    profile of ``fingerprint`` and ``spec`` (the model without adapters: its blocks and
    their attention), both as the caller found them once
    (:func:`~datacentric.profiling.store.fingerprint`, :attr:`ProfileSettings.spec` else
    :func:`~datacentric.profiling.factory.named_spec`), and the results of ``extra_cases``
    measured in the same session."""
    start = time.perf_counter()
    # what the profile records of the model, checked before anything runs
    kind = attention_kind(settings.model, spec)
    if settings.spec is None:  # the ranks read its vocabulary (synthetic_token_ids)
        settings = dataclasses.replace(settings, spec=spec)
    micro_batches = select_profile_shapes(shapes, max_points=max_points, max_tokens=max_tokens)
    cases = [c for mb in micro_batches for sp in sp_sizes for c in dual_layer_cases(mb, sp)]
    results = measure([*cases, *extra_cases], settings)
    dual, extra = results[: len(cases)], results[len(cases) :]
    points = [point_from_runs(dual[i : i + 4]) for i in range(0, len(dual), 4)]
    sync = [r.grad_sync_s for r in dual if r.case.depth == 2 and not r.case.recompute]
    sync0 = [r.grad_sync_s for r in dual if r.case.depth == 0]
    depth_sync = (statistics.median(sync) - statistics.median(sync0)) / 2
    full_sync = statistics.median(sync0) + spec.num_blocks * max(0.0, depth_sync)
    profile = Profile(
        fingerprint=fingerprint,
        model=settings.model,
        num_blocks=spec.num_blocks,
        attention_kind=kind,
        points=tuple(points),
        # the ranks of one machine share its links: those of a node when the world spans
        # several, else the whole world
        gpus_per_node=settings.ranks_per_node or settings.world_size,
        grad_sync_seconds={settings.world_size: full_sync} if settings.world_size > 1 else {},
        profile_seconds=time.perf_counter() - start,
    )
    return profile, extra


def default_sp_sizes(world: int) -> list[int]:
    """The SP sizes a profile measures when none are given: the powers of two that divide
    ``world``."""
    sizes = [1]
    while sizes[-1] * 2 <= world and world % (sizes[-1] * 2) == 0:
        sizes.append(sizes[-1] * 2)
    return sizes


def _rank_worker(
    cases: list[RunCase], rounds: list[list[tuple[int, int]]], settings: ProfileSettings
) -> dict[int, tuple[list[float], int, float, int]]:
    """On every rank: run the rounds; return ``{case index: (times, peak bytes, sync s,
    state bytes)}`` for the cases this rank took part in.

    What every round runs is known before any model is built: its iteration, this rank's
    case in it and when its timed passes run (:func:`_timed_after`). Each round then runs
    its warm-up and memory passes on the model of its depth (:func:`_runtime`, built once
    per depth); the timed passes follow as :func:`_timed_after` orders them. A model is
    kept until its rounds are timed: with ``interleave``, one per depth; without it, one
    at a time.
    """
    groups = ProcessGroups()
    dataset, ids = _dataset(settings, cases)
    iterations = [_round_iteration(cases, round_, ids) for round_ in rounds]
    mine = [
        next((i for i, at in round_ if _holds(cases, i, at, groups.rank)), None)
        for round_ in rounds
    ]
    timed_after = _timed_after(len(rounds), settings.cost)
    sp_sizes = sorted({case.sp_size for case in cases})
    use_cpu_clock = settings.clock == "cpu" or (
        settings.clock == "auto" and groups.device.type == "cpu"
    )
    bar = profiling_progress(len(rounds), settings.cost, settings.progress and groups.rank == 0)
    warm_passes = _warm_passes(settings.cost)
    models: dict[int, tuple[DataCentricRuntime, PassCpuClock]] = {}  # by depth
    depths = [cases[round_[0][0]].depth for round_ in rounds]
    memory: dict[int, tuple[int, int]] = {}
    times: dict[int, list[float]] = {}
    syncs: dict[int, list[float]] = {}
    for slot, depth in enumerate(depths):
        if depth not in models:
            if not settings.cost.interleave:  # the last depth's rounds are timed: drop it
                models.clear()
            models[depth] = _runtime(settings, depth, groups, dataset, sp_sizes)
        runtime, iteration = models[depth][0], iterations[slot]
        # the first pass allocates gradients; the second (a warm-up too) measures memory
        run_step(runtime, iteration, dtype=settings.dtype)
        peak = measure_peak(
            groups.device, partial(run_step, runtime, iteration, dtype=settings.dtype)
        )[0]
        states = model_state_bytes(runtime.module)
        memory[slot] = (peak + states, states)
        for _ in range(max(0, settings.cost.warmup - 2)):
            run_step(runtime, iteration, dtype=settings.dtype)
        bar.update(warm_passes)
        del runtime  # nothing but ``models`` keeps a model past its round
        for timed in timed_after[slot]:  # its model is in ``models``: its own, or all
            model = models[depths[timed]]  # not held past this pass (no local keeps it)
            stats = run_step(model[0], iterations[timed], dtype=settings.dtype).stats
            seconds = model[1].seconds if use_cpu_clock else stats.micro_batches[0].time_s
            times.setdefault(timed, []).append(seconds)
            syncs.setdefault(timed, []).append(stats.sync_time_s)
            bar.update(1)
            del model
    bar.close()
    out: dict[int, tuple[list[float], int, float, int]] = {}
    for slot, case in enumerate(mine):
        if case is not None:
            peak, states = memory[slot]
            out[case] = (times[slot], peak, statistics.median(syncs[slot]), states)
    return out


def _timed_after(rounds: int, cost: CostConfig) -> list[list[int]]:
    """The rounds whose timed passes run after each round's warm-up: with ``interleave``
    (the ``[cost]`` key), every round's, cycled ``repeats`` times after the last round's
    warm-up, so that a change in the machine's load while profiling touches every case
    alike instead of skewing some against others; without it, its own ``repeats``
    passes back to back (one model kept at a time, for models too large to keep several
    depths in memory)."""
    if not cost.interleave:
        return [[slot] * cost.repeats for slot in range(rounds)]
    return [[] for _ in range(rounds - 1)] + [list(range(rounds)) * cost.repeats]


def _warm_passes(cost: CostConfig) -> int:
    """Passes a round runs before its timed ones: the first (allocates gradients), the
    memory pass, and the warm-up passes past those two."""
    return max(2, cost.warmup)


def profiling_progress(rounds: int, cost: CostConfig, enabled: bool, **kwargs: Any) -> Progress:
    """The profiler's progress, counted in passes so that its units are of like size and
    the time left holds: a round's warm-up counts its :func:`_warm_passes`, each timed
    pass one (``kwargs``: :class:`~datacentric.progress.Progress`'s, such as a test's
    clock)."""
    total = rounds * (_warm_passes(cost) + cost.repeats)
    return Progress("profiling", total, unit="pass", enabled=enabled, time_left=True, **kwargs)


def _round_iteration(
    cases: Sequence[RunCase], round_: list[tuple[int, int]], ids: Sequence[tuple[int, ...]]
) -> Iteration:
    """The one-micro-batch iteration that runs a round's case on each of its groups."""
    assignments = []
    for index, start in round_:
        case = cases[index]
        micro_batch = MicroBatch(
            sample_ids=ids[index],
            bucket="profile",
            tokens=sum(s.tokens for s in case.shapes),
            recompute=case.flags(),
        )
        assignments.append(
            Assignment(rank_start=start, sp_size=case.sp_size, micro_batches=(micro_batch,))
        )
    return Iteration(index=0, assignments=tuple(assignments))


class PassCpuClock:
    """CPU time of the process over one forward+backward pass of ``module``: from its
    forward pre-hook to the last parameter's gradient accumulation."""

    def __init__(self, module: nn.Module) -> None:
        self.start = self.end = 0.0
        module.register_forward_pre_hook(self._on_forward)
        for param in module.parameters():
            if param.requires_grad:  # frozen weights (LoRA's base) get no gradient
                param.register_post_accumulate_grad_hook(self._on_grad)

    def _on_forward(self, *_: Any) -> None:
        self.start = time.process_time()

    def _on_grad(self, *_: Any) -> None:
        self.end = time.process_time()

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def _holds(cases: Sequence[RunCase], index: int, start: int, rank: int) -> bool:
    return start <= rank < start + cases[index].sp_size


def _runtime(
    settings: ProfileSettings,
    depth: int,
    groups: ProcessGroups,
    dataset: Any,
    sp_sizes: Sequence[int],
) -> tuple[DataCentricRuntime, PassCpuClock]:
    """The runtime of the model cut to ``depth`` blocks (its adapters injected), told the
    SP sizes it will run (checked against its heads now), and the clock of its passes.
    Its weights are float32 in any dtype, as the trainer builds them
    (:func:`~datacentric.train.build.build_model_for`); ``bfloat16`` is autocast."""
    torch.manual_seed(settings.seed)
    layers = max(depth, 1)
    if settings.model in MODEL_PRESETS:
        args = {**settings.model_args, "num_layers": layers}
        model = build_model(settings.model, dtype=torch.float32, device=groups.device, **args)
    else:  # any other model: built whole (its adapters aside), then cut to its first blocks
        source = settings.source
        if source is None:
            source = resolve_model(settings.model, settings.model_args)
        with torch.device(groups.device):
            bare = dataclasses.replace(source, lora=None)
            model, _ = build_from_source(bare, dtype=torch.float32, dataset=settings.dataset)
        truncate_blocks(model, layers)
    if settings.lora is not None:
        apply_lora(model, settings.lora)
    clock = PassCpuClock(model)
    runtime = DataCentricRuntime(
        model, groups, dataset.pack, dataset.loss_tokens, sp_sizes=sp_sizes
    )
    if depth == 0:
        # the runtime needs an attention layer to wire up; the depth-0 model (embedding,
        # head and loss only) then drops its one block
        truncate_blocks(model, 0)
    return runtime, clock


def truncate_blocks(model: nn.Module, depth: int) -> None:
    """Keep only the first ``depth`` of ``model.blocks``, wherever the model holds them
    (an adapter's ``blocks`` is the wrapped model's own layer list: every module that
    holds that list gets the shorter one): the dual-layer profile's model."""
    old = model.blocks
    new = nn.ModuleList(list(old)[:depth])
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if child is old:
                setattr(module, name, new)
    if getattr(model, "blocks", None) is old:  # held as a plain attribute
        model.__dict__["blocks"] = new


def _dataset(
    settings: ProfileSettings, cases: Sequence[RunCase]
) -> tuple[Any, list[tuple[int, ...]]]:
    """The dataset every case's samples come from, and each case's sample ids: the
    run's own samples of each shape when ``settings.dataset`` is given, else a
    synthetic dataset holding them."""
    if settings.dataset is not None:
        by_shape: dict[SampleShape, list[int]] = {}
        for i, shape in enumerate(settings.dataset.shapes()):
            by_shape.setdefault(shape, []).append(i)
        ids = []
        for case in cases:
            taken: list[int] = []
            for shape in case.shapes:
                pool = by_shape.get(shape)
                if not pool:
                    raise ValueError(f"profile of {settings.model!r}: no sample of shape {shape}")
                taken.append(pool[len(taken) % len(pool)])  # distinct samples where it can
            ids.append(tuple(taken))
        return settings.dataset, ids
    shapes: list[SampleShape] = []
    ids = []
    for case in cases:
        ids.append(tuple(range(len(shapes), len(shapes) + len(case.shapes))))
        shapes.extend(case.shapes)
    if all(s.is_video for s in shapes):
        return SyntheticVideoDataset(shapes, seed=settings.seed), ids
    if any(s.is_video for s in shapes):
        raise ValueError(f"profile of {settings.model!r} mixes text and video shapes")
    return SyntheticTextDataset(shapes, synthetic_token_ids(settings), seed=settings.seed), ids


#: The synthetic text samples' token ids are bytes (below 256, as
#: :class:`~datacentric.data.SyntheticTextDataset` draws by default) when the model's
#: vocabulary holds them all.
BYTE_IDS = 256


def synthetic_token_ids(settings: ProfileSettings) -> int:
    """How many token ids the profiler's synthetic text samples of ``settings.model`` draw
    from: its vocabulary (:attr:`ProfileSettings.spec`'s, as the caller found it), at
    most :data:`BYTE_IDS`. A pass takes the same time whatever the ids (an embedding row
    and a loss column each), so a vocabulary of at least 256 ids is profiled on the very
    samples it always was, and a smaller one on ids its embedding holds. Without a spec
    (a caller measuring a preset by hand; the profile command and a run hand theirs
    down), :data:`BYTE_IDS`. Raises ``ValueError`` naming the setting when the model has
    no vocabulary size."""
    spec = settings.spec
    if spec is None:
        return BYTE_IDS
    if spec.vocab_size <= 0:
        folder = (settings.source or resolve_model(settings.model, settings.model_args)).folder
        where = "the model's vocab_size (--model-arg vocab_size=N)"
        if folder is not None:
            where = f"vocab_size in {folder / 'config.json'}"
        raise ValueError(
            f"model {settings.model!r} has no vocabulary size (vocab_size {spec.vocab_size}, "
            f"read from its {spec.source or 'spec'}) to draw its synthetic token ids below: "
            f"set {where}"
        )
    return min(spec.vocab_size, BYTE_IDS)
