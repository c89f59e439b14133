"""Benchmark: is dcp-opt ahead of every peer on its own search, not by copying peers?

For every shipped workload preset at 32 and 64 GPUs (its own model and hardware, the
simulator's cost model and budget, default settings), schedules the epoch with every
policy on one plan and reports dcp-opt's efficiency, the best peer's, and the share of
dcp-opt's steps that are its own (``settings["steps_from_peers"]`` counts the steps its
portfolio took from a peer; above ``dcp_opt.PORTFOLIO_SAMPLES`` samples there is no
portfolio and every step is its own). The target: dcp-opt >= every peer and >= 90% of
its steps its own, on every row. Writes ``benchmarks/own_steps.md``.

``--sets`` instead runs the seeded length sets of :data:`SETS` (near-uniform documents,
reasoning traces, packed pretraining rows, short chat turns; llama-7b on h200-sxm) as a
user runs them, ``datacentric schedule --lengths FILE --json`` with every policy in a
child process (the analytic cost model and default budget and global batch), and
reports dcp-opt's efficiency, the best peer's, its own steps and the CPU seconds of the
child (every policy). Target there: dcp-opt >= every peer and >= 95% own steps.

    .venv/bin/python benchmarks/own_steps.py [--workloads a,b] [--gpus 32,64]
        [--samples N] [--out FILE]
    .venv/bin/python benchmarks/own_steps.py --sets [NAME,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from datacentric.data.workloads import get_workload, list_workloads
from datacentric.scheduling import Pipeline
from datacentric.scheduling.epoch import POLICIES
from datacentric.sim.policy_comparison import simulation_budget, simulation_cost_model

#: The share of dcp-opt's steps that must be its own.
OWN_SHARE_TARGET = 0.9
#: ... on the length sets of :data:`SETS`.
SET_SHARE_TARGET = 0.95


def near_uniform(rng: np.random.Generator) -> np.ndarray:
    """10,000 documents of 15,500 to 16,500 tokens."""
    return rng.integers(15_500, 16_501, size=10_000)


def reasoning(rng: np.random.Generator) -> np.ndarray:
    """16,000 reasoning traces: log-normal, median 6,000 tokens, at most 65,536."""
    return np.clip(rng.lognormal(np.log(6_000), 0.8, size=16_000), 64, 65_536).astype(int)


def packed_rows(rng: np.random.Generator) -> np.ndarray:
    """50,000 rows packed to 8,192 tokens, 12% of them a remainder (1 to 8,191)."""
    rows = np.full(50_000, 8_192)
    rest = rng.random(len(rows)) < 0.12
    rows[rest] = rng.integers(1, 8_192, size=int(rest.sum()))
    return rows


def chat_turns(rng: np.random.Generator, count: int = 120_000) -> np.ndarray:
    """Short chat turns: log-normal, median 180 tokens, 8 to 1,024."""
    return np.clip(rng.lognormal(np.log(180), 0.9, size=count), 8, 1_024).astype(int)


#: name: (lengths of seed 0, GPUs)
SETS = {
    "near-uniform-16k": (near_uniform, 8),
    "reasoning-traces": (reasoning, 8),
    "packed-rows-128": (packed_rows, 128),
    "packed-rows-8": (packed_rows, 8),
    "chat-turns-120k": (chat_turns, 8),
    "chat-turns-80k": (lambda rng: chat_turns(rng)[:80_000], 8),
    "chat-turns-40k": (lambda rng: chat_turns(rng)[:40_000], 8),
}


def run_set(name: str) -> dict:
    """Every policy on the set ``name`` by ``datacentric schedule --lengths`` in a child
    process: dcp-opt's efficiency and own steps, the best peer, the child's CPU time."""
    make, gpus = SETS[name]
    lengths = make(np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lengths.txt"
        path.write_text("".join(f"{int(n)}\n" for n in lengths))
        argv = [sys.executable, "-m", "datacentric", "schedule", "--lengths", str(path)]
        argv += ["--model", "llama-7b", "--hardware", "h200-sxm", "--world", str(gpus)]
        argv += ["--policy", ",".join(POLICIES), "--json"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = json.loads(done.stdout)["policies"]
    ours = found["dcp-opt"]
    peers = {p: r["efficiency"] for p, r in found.items() if p != "dcp-opt"}
    best_peer = max(peers, key=peers.get)
    from_peers = ours["settings"].get("steps_from_peers", {})
    return {
        "workload": name,
        "model": "llama-7b on h200-sxm",
        "gpus": gpus,
        "samples": len(lengths),
        "steps": ours["iterations"],
        "own": ours["iterations"] - sum(from_peers.values()),
        "from_peers": from_peers,
        "token_packed": ours["settings"].get("token_packed_steps", "-"),
        "dcp_opt": ours["efficiency"],
        "best_peer": best_peer,
        "best_peer_eff": peers[best_peer],
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    }


def run_one(workload: str, gpus: int, samples: int | None = None) -> dict:
    """Every policy's efficiency on ``workload`` at ``gpus`` GPUs, and dcp-opt's own
    steps (one plan; dcp-opt's portfolio reuses the peers' memoised steps)."""
    wl = get_workload(workload, seed=0, num_samples=samples)
    shapes = list(wl.shapes)
    cost = simulation_cost_model(wl.model, wl.hardware, gpus)
    pipeline = Pipeline(shapes, cost, world_size=gpus, memory_cap_bytes=simulation_budget(cost))
    efficiency, seconds = {}, {}
    from_peers: dict[str, int] = {}
    steps = 0
    for policy in POLICIES:
        started = time.process_time()
        try:
            schedule = pipeline.schedule(policy=policy)
        except ValueError as err:  # a peer that cannot run this epoch at all
            efficiency[policy] = None
            seconds[policy] = f"refused: {err}"[:80]
            continue
        seconds[policy] = time.process_time() - started
        efficiency[policy] = float(schedule.meta["efficiency"])
        if policy == "dcp-opt":
            from_peers = dict(schedule.meta["settings"].get("steps_from_peers", {}))
            steps = len(schedule.iterations)
    peers = {p: e for p, e in efficiency.items() if p != "dcp-opt" and e is not None}
    best_peer = max(peers, key=peers.get)
    taken = sum(from_peers.values())
    return {
        "workload": workload,
        "model": f"{wl.model} on {wl.hardware}",
        "gpus": gpus,
        "samples": len(shapes),
        "steps": steps,
        "own": steps - taken,
        "from_peers": from_peers,
        "portfolio": bool(from_peers),
        "dcp_opt": efficiency["dcp-opt"],
        "best_peer": best_peer,
        "best_peer_eff": peers[best_peer],
        "dcp_opt_cpu_s": seconds["dcp-opt"],
    }


def meets(row: dict, share: float = OWN_SHARE_TARGET) -> bool:
    """Whether the row meets both targets."""
    ahead = row["dcp_opt"] >= row["best_peer_eff"] * (1 - 1e-9)
    return ahead and row["own"] >= share * row["steps"]


def write_table(rows: list[dict], out: Path, *, sets: bool = False) -> None:
    """The presets' table written over ``out`` or, with ``sets``, the length sets'
    table as its section "Length sets" (the other part of ``out`` is kept)."""
    today = datetime.date.today().isoformat()
    machine = (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}."
    )
    if sets:
        head = [
            f"## Length sets ({today})",
            "",
            f"{machine} Generated by `benchmarks/own_steps.py --sets`: `datacentric "
            "schedule --lengths FILE --model llama-7b --hardware h200-sxm --world N "
            "--policy (all seven) --json`, seed 0 (the sets: `SETS` in the script). "
            "`token-packed`: dcp-opt's own steps formed token-packed "
            "(`settings.token_packed_steps`). `cpu s`: the child's CPU seconds, every "
            "policy. Target: dcp-opt >= every peer and >= 95% own steps.",
            "",
            "| set | GPUs | samples | dcp-opt | best peer | own / steps | from peers "
            "| token-packed | cpu s | target |",
            "|---|---:|---:|---:|---|---:|---|---:|---:|---|",
        ]
    else:
        head = [
            f"# dcp-opt's own steps against every peer ({today})",
            "",
            f"{machine} Generated by `benchmarks/own_steps.py`.",
            "",
            "Every shipped workload preset with its own model and hardware, the "
            "simulator's analytic cost model and budget, default settings, seed 0. "
            "`dcp-opt` and `best peer`: efficiency against the proved bound (the best of "
            "the six other policies). `own`: dcp-opt's steps that its own search "
            "produced, of all its steps (the rest came from its portfolio of `static` "
            "and `dcp-pac`, listed in `from peers`). Target: dcp-opt >= every peer and "
            ">= 90% own steps.",
            "",
            "| workload | model | GPUs | samples | dcp-opt | best peer | own / steps | "
            "from peers | dcp-opt cpu s | target |",
            "|---|---|---:|---:|---:|---|---:|---|---:|---|",
        ]
    lines = []
    for r in rows:
        peers = ", ".join(f"{k} {v}" for k, v in r["from_peers"].items() if v) or "-"
        first = f"| {r['workload']} | " + ("" if sets else f"{r['model']} | ")
        middle = f"{r['token_packed']} | {r['cpu_s']:.1f}" if sets else f"{r['dcp_opt_cpu_s']:.1f}"
        met = meets(r, SET_SHARE_TARGET if sets else OWN_SHARE_TARGET)
        lines.append(
            f"{first}{r['gpus']} | {r['samples']:,} | {r['dcp_opt']:.4f} | "
            f"{r['best_peer']} {r['best_peer_eff']:.4f} | {r['own']} / {r['steps']} | "
            f"{peers} | {middle} | {'met' if met else '**not met**'} |"
        )
    text = "\n".join(head + lines) + "\n"
    old = out.read_text(encoding="utf-8") if out.exists() else ""
    presets, mark, length_sets = old.partition("\n## Length sets")
    if sets and presets:
        text = presets.rstrip("\n") + "\n\n" + text
    elif not sets and mark:
        text += "\n" + mark.lstrip("\n") + length_sets
    out.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(list_workloads()))
    parser.add_argument("--gpus", default="32,64")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    parser.add_argument("--sets", nargs="?", const=",".join(SETS), default=None)
    args = parser.parse_args()
    rows = []
    if args.sets is not None:
        for name in args.sets.split(","):
            rows.append(run_set(name))
            print(rows[-1], flush=True)
            write_table(rows, Path(args.out), sets=True)
        return
    for workload in args.workloads.split(","):
        for gpus in (int(g) for g in args.gpus.split(",")):
            row = run_one(workload, gpus, args.samples)
            print(row, flush=True)
            rows.append(row)
            write_table(rows, Path(args.out))


if __name__ == "__main__":
    main()
