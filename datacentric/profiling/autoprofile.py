"""Profile a model for a dataset, plan it, validate the extrapolation, and persist.

:func:`run_profile` is what ``datacentric profile`` runs: dual-layer profile points
for a few bucket shapes per SP size (the fitted cost model predicts the others),
the plan under the memory cap, and a validation that runs the *full-depth* model on
some buckets and compares measured time and memory with the prediction.
:func:`ensure_profile` is what a training run calls at start: it returns the saved
profile when its fingerprint matches, and otherwise measures one on the ranks at hand
(inside the run's own ``torch.distributed`` world when one is initialised; no second
launch) and saves it.

A saved profile is reused only when this machine still runs like the one that measured
it: unless it was measured or checked in the last :data:`PROBE_TRUST_S` seconds,
:func:`probe_profile` re-times a few of its cases, and a difference above the spread
its validation measured between sessions (:func:`probe_tolerance`) re-measures it (with
a one-line note), so a profile from a different or busier machine is never reused
silently.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from datacentric.log import get_logger
from datacentric.models.configs import MODEL_PRESETS
from datacentric.models.source import build_model_named
from datacentric.planning.fitted import FittedCostModel, extrapolate
from datacentric.planning.heads import ulysses_sp_sizes
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.plan import Plan
from datacentric.planning.planner import recompute_from_counts
from datacentric.profiling.factory import fitted_cost_model, named_spec
from datacentric.profiling.profiler import (
    ProfileSettings,
    RunCase,
    RunResult,
    default_sp_sizes,
    dual_layer_cases,
    measure,
    measure_profile,
    point_from_runs,
)
from datacentric.profiling.store import (
    Profile,
    ProfileError,
    fingerprint,
    fresh_profile,
    last_checked,
    model_identity,
    save_plan,
    save_probe,
    save_profile,
)
from datacentric.scheduling.pipeline import Pipeline
from datacentric.shapes import SampleShape, make_buckets
from datacentric.timing import relative_spread


def validation_cases(
    plan: Plan, cost: FittedCostModel, *, count: int = 3, max_tokens: int = 4096
) -> list[RunCase]:
    """Full-depth runs to check: the ``count`` largest planned buckets whose preferred
    micro-batch (:meth:`~datacentric.planning.plan.Plan.preferred`) fits in
    ``max_tokens`` (the micro-batch shrunk to fit when needed); the first moved to the
    largest SP size when no planned bucket uses SP above 1, and the last set to
    recompute its first half of blocks when no planned bucket recomputes."""
    chosen: list[RunCase] = []
    for bp in sorted(plan.buckets.values(), key=lambda b: -b.shape.tokens):
        best = plan.preferred(bp.bucket)
        bs = min(best.micro_batch_size, max(1, max_tokens // bp.shape.tokens))
        if bp.shape.tokens * bs > max_tokens:
            continue
        chosen.append(RunCase((bp.shape,) * bs, best.sp_size, cost.num_blocks, best.recompute))
        if len(chosen) == count:
            break
    largest = max(cost.sp_sizes)
    if largest > 1 and chosen and all(c.sp_size == 1 for c in chosen):
        chosen[0] = replace(chosen[0], sp_size=largest)
    if len(chosen) > 1 and not any(any(c.flags()) for c in chosen):
        # check the recomputation extrapolation too: half the blocks recompute (the
        # first ones, as the planner places them)
        half = recompute_from_counts(cost.block_kinds, {cost.attention_kind: cost.num_blocks // 2})
        chosen[-1] = replace(chosen[-1], recompute=half)
    return chosen


#: Sessions of the full-depth validation runs (each a fresh start of the ranks): two
#: are the fewest that show how much one session's times differ from another's.
VALIDATION_REPEATS = 2


def validation_report(
    cost: FittedCostModel,
    full: Sequence[Sequence[RunResult]],
    dual: Sequence[RunResult],
) -> dict[str, Any]:
    """Measured full-depth time and memory against the dual-layer prediction.

    ``full`` holds one list of the full-depth cases' results per session in which they
    were measured (the same cases, in order); a case's measured time is the median over
    sessions and its ``time_noise_rel`` the largest relative difference between two
    sessions (:func:`~datacentric.timing.relative_spread`): an error below it is not
    told apart from noise. ``dual`` holds the four dual-layer runs of each full-depth
    case, in order. The prediction (``predicted_*``, whose errors are reported)
    extrapolates the case's own dual-layer point to full depth; ``fitted_*`` is what the
    fitted cost model, which did not see that point, predicts for it (a check of the
    fit, reported alongside).
    """
    rows = []
    for index, r in enumerate(full[0]):
        case = r.case
        flags = case.flags()
        point = point_from_runs(dual[4 * index : 4 * index + 4])
        pred_t, pred_m = extrapolate(point, case.depth, sum(flags))
        times = [session[index].time_s for session in full]
        measured_t = statistics.median(times)
        memory = max(session[index].memory_bytes for session in full)
        rows.append(
            {
                "shape": case.shapes[0].to_json(),
                "micro_batch_size": len(case.shapes),
                "sp_size": case.sp_size,
                "num_blocks": case.depth,
                "num_recomputed": sum(flags),
                "measured_time_s": measured_t,
                "measured_times_s": times,
                "time_noise_rel": relative_spread(times),
                "predicted_time_s": pred_t,
                "time_rel_err": abs(pred_t - measured_t) / measured_t,
                "measured_memory_bytes": memory,
                "predicted_memory_bytes": pred_m,
                "memory_rel_err": abs(pred_m - memory) / memory,
                "fitted_time_s": cost.pass_time_s(case.shapes, case.sp_size, flags),
                "fitted_memory_bytes": cost.pass_memory_bytes(case.shapes, case.sp_size, flags),
            }
        )
    return {
        "buckets": rows,
        "sessions": len(full),
        "time_rel_err": max((row["time_rel_err"] for row in rows), default=0.0),
        "time_noise_rel": max((row["time_noise_rel"] for row in rows), default=0.0),
        "memory_rel_err": max((row["memory_rel_err"] for row in rows), default=0.0),
    }


@dataclass(frozen=True)
class ProfileReport:
    """What ``datacentric profile`` produced."""

    profile: Profile
    plan: Plan
    wall_seconds: float
    reused: bool = False
    """The profile was loaded from ``out_dir`` (fresh fingerprint), not measured."""


def run_profile(
    settings: ProfileSettings,
    shapes: Sequence[SampleShape],
    *,
    memory_cap_bytes: int,
    sp_sizes: Sequence[int] | None = None,
    max_points: int = 3,
    max_profile_tokens: int | None = None,
    validate: int = 3,
    validation_tokens: int = 4096,
    validation_repeats: int = VALIDATION_REPEATS,
    skip_unfittable: bool = False,
    out_dir: str | os.PathLike[str] | None = None,
    reuse: bool = True,
) -> ProfileReport:
    """Profile, plan the dataset ``shapes`` under ``memory_cap_bytes`` per rank (one
    :class:`~datacentric.scheduling.pipeline.Pipeline`) and (``validate`` > 0) validate
    on ``validate`` buckets (their full-depth runs measured in ``validation_repeats``
    sessions); save to ``out_dir`` when given. With ``reuse``, a fresh
    profile in ``out_dir`` is loaded instead of measured (and its saved validation
    kept); a stale one is re-measured; a corrupt one raises
    :class:`~datacentric.profiling.store.ProfileError`. A saved profile that a probe
    finds off on this machine (:func:`reusable`) is re-measured."""
    start = time.perf_counter()
    world = settings.world_size
    meta = None  # a model not built here: built on the meta device once, for its identity and spec
    if settings.identity is None and settings.model not in MODEL_PRESETS:
        meta = build_model_named(settings.model, settings.model_args, device="meta")
        identity = model_identity(settings.model, settings.model_args, module=meta)
        settings = replace(settings, identity=identity)
    # its spec found once: the profile records it, and every launch of the ranks reads
    # its vocabulary (the synthetic samples' ids, profiler.synthetic_token_ids)
    spec = settings.spec or named_spec(settings.model, settings.model_args, module=meta)
    settings = replace(settings, spec=spec)
    sp_sizes = list(sp_sizes or profiled_sp_sizes(spec, world, meta))
    current = _fingerprint(settings, world)
    saved, checked = fresh_profile(out_dir, current) if out_dir is not None else (None, 0.0)
    reused = reuse and saved is not None and reusable(saved, settings, out_dir, checked=checked)
    if reused:
        profile = saved
    else:
        bucket_shapes = [b.shape for b in make_buckets(shapes).buckets]
        profile, _ = measure_profile(
            settings,
            bucket_shapes,
            sp_sizes,
            current,
            spec,
            max_points=max_points,
            max_tokens=max_profile_tokens,
        )
    cost = fitted_cost_model(profile)
    plan = Pipeline(
        shapes,
        cost,
        world_size=world,
        memory_cap_bytes=memory_cap_bytes,
        skip_unfittable=skip_unfittable,
    ).plan
    if validate and not reused:
        cases = validation_cases(plan, cost, count=validate, max_tokens=validation_tokens)
        dual = [c for case in cases for c in dual_layer_cases(case.shapes, case.sp_size)]
        results = measure([*cases, *dual], settings)
        sessions = [results[: len(cases)]]
        # the full-depth cases again, each time in a fresh session: the spread between
        # sessions is the noise the errors are read against (and the probe's tolerance)
        for _ in range(1, validation_repeats):
            sessions.append(measure(cases, replace(settings, progress=False)))
        report = validation_report(cost, sessions, results[len(cases) :])
        profile = replace(profile, validation=report)
    if out_dir is not None:
        if not reused:
            save_profile(profile, out_dir)
        save_plan(plan, profile.fingerprint, out_dir)
    wall = time.perf_counter() - start
    return ProfileReport(profile=profile, plan=plan, wall_seconds=wall, reused=reused)


def profiled_sp_sizes(spec: ModelSpec, world: int, module: Any = None) -> list[int]:
    """The SP sizes a profile measures when none are given: those of
    :func:`~datacentric.profiling.profiler.default_sp_sizes` that the model runs (its
    heads split among them, none above its ``max_sp_size``:
    :func:`~datacentric.planning.heads.ulysses_sp_sizes` of ``module``, else of
    ``spec``'s heads), as a training run's profile measures the sizes its model runs."""
    model = module
    if model is None:
        model = SimpleNamespace(num_heads=spec.heads, num_kv_heads=spec.kv_heads or spec.heads)
    runs = set(ulysses_sp_sizes(model, world))
    return [size for size in default_sp_sizes(world) if size in runs]


def ensure_profile(
    directory: str | os.PathLike[str],
    settings: ProfileSettings,
    shapes: Sequence[SampleShape],
    *,
    sp_sizes: Sequence[int] | None = None,
    max_points: int = 3,
    max_profile_tokens: int | None = None,
    probe: bool = True,
) -> Profile:
    """The profile saved in ``directory`` if it matches this model, device, torch, world
    and dtype and this machine still runs like it (:func:`reusable`; without ``probe``,
    not asked: a resumed run rebuilds its saved schedule from the profile that made it);
    otherwise measure one now and save it. A corrupt file raises
    :class:`~datacentric.profiling.store.ProfileError`.

    Called by every rank of a training run that has initialised ``torch.distributed``
    (the measurement then runs on those ranks), or by one process without it (the
    measurement then starts ``settings.world_size`` local ranks). The model is described
    as the run read it once: a model that is not a preset is fingerprinted by
    ``settings.identity``, and a profile measured now records ``settings.spec`` (its
    blocks and their attention; :attr:`ProfileSettings.identity`,
    :attr:`ProfileSettings.spec`)."""
    current = _fingerprint(settings, settings.world_size)
    # Rank 0 alone saves the profile, so it alone reads it and every rank takes what it
    # read: ranks that read their own (another node's disk without it, or a stale copy)
    # measured while rank 0 reused it, and their collectives crossed until the timeout.
    read: tuple[Profile | None, float] | ProfileError | None = None
    if _is_rank_zero():
        try:
            read = fresh_profile(directory, current)
        except ProfileError as err:  # raised on every rank
            read = err
    read = _rank_zero_value(read)
    if isinstance(read, ProfileError):
        raise read
    saved, checked = read if read is not None else (None, 0.0)
    if saved is not None and (not probe or reusable(saved, settings, directory, checked=checked)):
        return saved
    spec = settings.spec  # what the profile records of the model: the run's, without adapters
    if spec is None:
        raise ValueError(f"a profile of {settings.model!r} needs its spec (ProfileSettings.spec)")
    sizes = list(sp_sizes or default_sp_sizes(settings.world_size))
    profile, _ = measure_profile(
        settings, shapes, sizes, current, spec, max_points=max_points, max_tokens=max_profile_tokens
    )
    if _is_rank_zero():
        save_profile(profile, directory)
    return profile


#: A reused profile is measured again when a probe case's time differs from the
#: profile's by more than its tolerance (:func:`probe_tolerance`): the spread its
#: validation measured between sessions, at least :data:`PROBE_MIN_TOLERANCE` and at
#: most this; this when the profile was not validated (no spread was measured).
PROBE_TOLERANCE = 0.25
#: The least tolerance of a probe: a spread from two sessions can be small by chance.
PROBE_MIN_TOLERANCE = 0.05
#: A profile measured or probed this many seconds ago is trusted without a probe (the
#: runs of one comparison share one profile).
PROBE_TRUST_S = 900.0


@dataclass(frozen=True)
class ProbeResult:
    """Probe cases with the time the profile gives them and the time measured now."""

    rows: tuple[tuple[RunCase, float, float], ...]

    @property
    def worst_rel_diff(self) -> float:
        """Largest ``|now - profile| / profile`` over the cases."""
        return max((abs(now - then) / then for _, then, now in self.rows), default=0.0)

    def agrees(self, tolerance: float = PROBE_TOLERANCE) -> bool:
        return self.worst_rel_diff <= tolerance

    def describe(self) -> str:
        """``tokens@SP: profile ms -> now ms`` of every case."""
        return ", ".join(
            f"{sum(s.tokens for s in case.shapes)} tokens@SP{case.sp_size}: "
            f"{then * 1e3:.1f} -> {now * 1e3:.1f} ms"
            for case, then, now in self.rows
        )


def probe_tolerance(profile: Profile) -> float:
    """How far a probe may be off ``profile`` for it to be reused: the largest spread
    between sessions that its validation measured (``time_noise_rel``), within
    [:data:`PROBE_MIN_TOLERANCE`, :data:`PROBE_TOLERANCE`]; :data:`PROBE_TOLERANCE` for a
    profile without one (not validated, or saved before validations were repeated)."""
    spread = (profile.validation or {}).get("time_noise_rel")
    if spread is None:
        return PROBE_TOLERANCE
    return min(PROBE_TOLERANCE, max(PROBE_MIN_TOLERANCE, float(spread)))


def probe_cases(profile: Profile, count: int = 2) -> list[tuple[RunCase, float]]:
    """Up to ``count`` of the profile's micro-batches to re-time: the one with the most
    tokens on each SP size (largest first), as their two-block run without
    recomputation, with the time the profile gives that run."""
    largest: dict[int, Any] = {}
    for point in profile.points:
        best = largest.get(point.sp_size)
        if best is None or _tokens(point.shapes) > _tokens(best.shapes):
            largest[point.sp_size] = point
    picks = sorted(largest.values(), key=lambda p: (-_tokens(p.shapes), p.sp_size))[:count]
    return [
        (RunCase(p.shapes, p.sp_size, 2, False), p.base_time_s + 2 * p.block_time_s)
        for p in picks
        if p.base_time_s + 2 * p.block_time_s > 0
    ]


def probe_profile(profile: Profile, settings: ProfileSettings, count: int = 2) -> ProbeResult:
    """Re-time :func:`probe_cases` now, under ``settings`` (on the world's ranks inside
    an initialised ``torch.distributed`` world: every rank calls this)."""
    cases = probe_cases(profile, count)
    results = measure([c for c, _ in cases], replace(settings, progress=False))
    return ProbeResult(tuple((c, then, r.time_s) for (c, then), r in zip(cases, results)))


def reusable(
    saved: Profile,
    settings: ProfileSettings,
    directory: str | os.PathLike[str],
    *,
    tolerance: float | None = None,
    checked: float | None = None,
) -> bool:
    """Whether ``saved`` (with a fresh fingerprint) may be reused on this machine now:
    measured or checked recently (``checked``: when, as
    :func:`~datacentric.profiling.store.fresh_profile` read it; default: read from
    ``directory``), or a probe agrees within ``tolerance`` (default:
    :func:`probe_tolerance`, the spread its validation measured; the check is recorded).
    Otherwise a one-line note on stderr says why it is measured again."""
    if tolerance is None:
        tolerance = probe_tolerance(saved)
    if checked is None:
        checked = last_checked(directory)
    if _rank_zero_value(time.time() - checked < PROBE_TRUST_S):
        return True
    probe = probe_profile(saved, settings)
    if probe.agrees(tolerance):
        if _is_rank_zero():
            save_probe(directory, probe.worst_rel_diff)
        return True
    if _is_rank_zero():
        get_logger().warning(
            f"datacentric: the profile in {directory} is {probe.worst_rel_diff:.0%} off on this "
            f"machine now, more than its {tolerance:.0%} tolerance ({probe.describe()}); "
            "measuring it again"
        )
    return False


def _tokens(shapes: Sequence[SampleShape]) -> int:
    return sum(s.tokens for s in shapes)


def _rank_zero_value(value: Any) -> Any:
    """Rank 0's ``value`` on every rank of an initialised world (else ``value``)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _is_rank_zero() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _fingerprint(settings: ProfileSettings, world: int) -> dict[str, Any]:
    lora = settings.lora.to_json() if settings.lora is not None else None
    found = fingerprint(
        settings.model,
        world,
        settings.dtype,
        settings.backend,
        dict(settings.model_args),
        identity=settings.identity,
        ranks_per_node=settings.ranks_per_node,  # as measure_profile records its node
    )
    if lora is not None:  # frozen weights time and hold differently
        found["lora"] = lora
    return found
