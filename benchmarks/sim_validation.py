"""Check the simulator against the real runtime on this machine; writes sim_validation.md.

    .venv/bin/python benchmarks/sim_validation.py [--iterations 4] [--out-dir runs/sim_validation]

1. Profile the tiny ``llama`` preset on the standard-library corpus with the real runtime
   (``datacentric profile``, gloo, world 2, 2 GiB cap; reused when fresh) and fit the cost
   model from it (``Profile.cost_model``).
2. Schedule a seeded subset of the corpus with several policies on that cost model, keeping
   the first ``--iterations`` iterations of each.
3. Store each (``<out-dir>/<policy>/schedules/epoch-0.json``) and execute the stored
   schedule with ``DataCentricRuntime`` on 2 gloo ranks, timing every iteration (after one
   untimed warm-up pass of the first iteration).
4. Simulate the same stored schedules (``datacentric.sim.engine.simulate``) on the same cost model
   and report predicted against measured iteration times.

The machine is shared: other processes on its cores add noise to the measured times, and the
file says how busy the machine was (load average) when it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import platform
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from datacentric.schedule import Schedule

MODEL = "llama"
WORLD = 2
MEMORY_GIB = 2.0
POLICIES = ("static", "dcp-pac", "dcp-opt")
SUBSET = 120
TOKENS_PER_ITERATION = 8_000
LAUNCH_TIMEOUT_S = 1800.0


def profile(out_dir: Path):  # noqa: ANN201 - a datacentric.profiling.store.Profile
    """Measure (or reuse) the profile with the ``datacentric profile`` command."""
    from datacentric.cli.main import main
    from datacentric.profiling.store import load_profile

    args = ["profile", "--model", MODEL, "--dataset", "stdlib", "--world", str(WORLD)]
    args += ["--memory-gb", str(MEMORY_GIB), "--out", str(out_dir), "--json"]
    with contextlib.redirect_stdout(io.StringIO()):
        if main(args) != 0:
            raise SystemExit("datacentric profile failed")
    return load_profile(out_dir)


def truncated(schedule: Schedule, iterations: int) -> Schedule:
    """The first ``iterations`` iterations; the other samples become dropped ids."""
    kept = schedule.iterations[:iterations]
    used = {i for it in kept for i in it.sample_ids()}
    dropped = tuple(i for i in range(schedule.num_samples) if i not in used)
    return replace(schedule, iterations=kept, dropped_sample_ids=dropped)


def _execute(run_dir: str, seed: int) -> list[tuple[float, float]]:
    """On every rank: run the iterations of the schedule stored in ``run_dir``; per
    iteration, (wall seconds, CPU seconds of this rank's process over it, all threads)."""
    import time

    import torch

    from datacentric.data import StdlibCorpus
    from datacentric.models.presets import build_model
    from datacentric.parallel.groups import ProcessGroups
    from datacentric.parallel.runtime import DataCentricRuntime
    from datacentric.parallel.step import run_step
    from datacentric.train.run_folder import load_schedule

    schedule = load_schedule(run_dir, 0)
    groups = ProcessGroups()
    corpus = StdlibCorpus()
    torch.manual_seed(seed)
    model = build_model(MODEL, device=groups.device)
    runtime = DataCentricRuntime(model, groups, corpus.pack, corpus.loss_tokens)
    model.zero_grad(set_to_none=True)
    run_step(runtime, schedule.iterations[0])  # warm-up, untimed
    times = []
    for iteration in schedule.iterations:
        model.zero_grad(set_to_none=True)
        cpu_start = time.process_time()
        stats = run_step(runtime, iteration).stats
        times.append((stats.total_time_s, time.process_time() - cpu_start))
    return times


def main() -> None:
    from datacentric.data import StdlibCorpus
    from datacentric.parallel.launch import spawn
    from datacentric.planning.memory_cap import resolve_memory_cap
    from datacentric.profiling.factory import fitted_cost_model
    from datacentric.scheduling import Pipeline
    from datacentric.settings import SchedulingConfig
    from datacentric.sim.engine import simulate
    from datacentric.train.run_folder import load_schedule, save_schedule

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--out-dir", default="runs/sim_validation")
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    load_before = os.getloadavg()
    prof = profile(Path(args.out_dir))
    cost_model = fitted_cost_model(prof)
    shapes = StdlibCorpus().shapes()
    subset = np.sort(np.random.default_rng(0).choice(len(shapes), SUBSET, replace=False))
    options = SchedulingConfig(tokens_per_iteration=TOKENS_PER_ITERATION)
    rows = []
    pipeline = Pipeline(
        shapes,
        cost_model,
        world_size=WORLD,
        memory_cap_bytes=resolve_memory_cap(MEMORY_GIB, None),
        options=options,
    )
    for policy in POLICIES:
        full = pipeline.schedule(sample_ids=subset.tolist(), policy=policy, measure=False)
        run_dir = str(Path(args.out_dir) / policy)
        save_schedule(run_dir, truncated(full, args.iterations))
        per_rank = spawn(_execute, WORLD, run_dir, 0, timeout_s=LAUNCH_TIMEOUT_S)
        predicted = simulate(load_schedule(run_dir, 0), shapes, cost_model)
        measured = np.max(np.asarray(per_rank), axis=0)  # the slower rank, per iteration
        for it, (wall, cpu) in zip(predicted.iterations, measured):
            rows.append((policy, it.index, it.time_s, float(wall), float(cpu)))
        print(
            policy, [f"{p.time_s:.3f}/{m[0]:.3f}" for p, m in zip(predicted.iterations, measured)]
        )
    write_report(args.out, rows, prof, load_before, os.getloadavg())


def write_report(path: str, rows: list, prof, load_before, load_after) -> None:  # noqa: ANN001
    errors = [p / m - 1 for _, _, p, m, _ in rows]
    cpu_errors = [p / q - 1 for _, _, p, _, q in rows]
    busy = max(load_before[0], load_after[0]) > (os.cpu_count() or 1)
    warning = (
        "**The machine was oversubscribed (load average above its CPU count) while this ran: "
        "measured times include waiting for the CPU and the errors below measure the "
        "contention as much as the model.**"
        if busy
        else "The machine was not oversubscribed while this ran."
    )
    lines = [
        "# Simulator against the real runtime",
        "",
        f"Generated {dt.date.today().isoformat()} by `benchmarks/sim_validation.py` on "
        f"{platform.machine()} with {os.cpu_count()} CPUs (load average before "
        f"{load_before[0]:.2f}, after {load_after[0]:.2f}; the cores are shared).",
        "",
        f"Model `{MODEL}` (the tiny byte-level Llama) on the standard-library corpus, gloo, "
        f"world {WORLD}, cap {MEMORY_GIB} GiB. Cost model: fitted from this machine's profile "
        f"({len(prof.points)} points, measured in {prof.profile_seconds:.0f} s). Schedules: "
        f"{SUBSET} seeded samples, at most {TOKENS_PER_ITERATION} tokens per iteration; "
        "measured = the slower rank's iteration, as wall time and as the CPU time of the rank's "
        "process (all threads). The profile behind the cost model measures CPU time on CPU "
        "ranks, which leaves out time the OS gives other processes; on a shared machine the "
        "CPU-time column is the comparable one (it also leaves out time a rank waits idle in "
        "a collective, which is small when the ranks are balanced).",
        "",
        warning,
        "",
        f"- iterations compared: {len(rows)}",
        f"- mean absolute relative error against CPU time: "
        f"{statistics.mean(map(abs, cpu_errors)):.1%} (worst {max(cpu_errors, key=abs):+.1%}); "
        f"against wall time: {statistics.mean(map(abs, errors)):.1%} "
        f"(worst {max(errors, key=abs):+.1%})",
        f"- total predicted / measured CPU time: "
        f"{sum(r[2] for r in rows) / sum(r[4] for r in rows) - 1:+.1%}",
        "",
        "| policy | iteration | predicted s | measured wall s | error | measured CPU s | error |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {pol} | {i} | {p:.3f} | {m:.3f} | {p / m - 1:+.1%} | {q:.3f} | {p / q - 1:+.1%} |"
            for pol, i, p, m, q in rows
        ),
        "",
    ]
    Path(path).write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
