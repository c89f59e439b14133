"""``datacentric simulate``: schedule a dataset with several policies and simulate them.

The dataset is ``--dataset SPEC`` (a workload preset, ``stdlib`` or your own data:
``jsonl:FILE``, ... as ``train`` opens it, shaped by the same ``[data]`` flags) or
``--lengths FILE``. One epoch is simulated: every global batch is one optimizer step,
so the step count is the dataset's tokens over the global batch (the report says which).

Prints, per policy, ``tokens_per_s``, ``speedup_vs_static``,
``speedup_vs_static_reference``, ``idle_share``, ``efficiency`` and
``tokens_per_step_mean`` (every policy runs the same global batches), as one JSON
object with ``--json``; ``--trace`` writes a Perfetto trace and ``--plot`` a Gantt
and throughput figure. The policies are built at once, each in its own process (the
same results as one after another), and the time left is the running ones' own
estimates over the CPU they get. ``static`` is always simulated, because speedups are measured
against it. Settings may come from ``--config FILE`` (the keys of its flags; flags
override it).
"""

from __future__ import annotations

import argparse
from typing import Any

from datacentric.cli.epoch_report import policy_report
from datacentric.cli.flag_groups import (
    add_dataset_flags,
    add_global_batch_flags,
    add_hardware_flag,
    add_json_flag,
    add_model_flags,
    add_policy_flag,
    add_shard_flags,
    add_split_mode_flag,
    add_world_flag,
    json_text,
    limit_splits,
    lora_of_args,
)
from datacentric.cli.flags import add_deprecated_alias, config_option, enable_config_file
from datacentric.cli.planning_inputs import (
    NO_DATA,
    data_named,
    dataset_shapes,
    global_batch_options,
    sharding_of,
    sized_global_batch,
)
from datacentric.cli.ranks import announce
from datacentric.progress import counted

KEY = """\
Reading the output. The headline, per policy: one epoch's simulated time (every step's
makespan plus its exposed gradient sync) and its efficiency, the ideal bound over that
time (1.0: no time lost; higher is better; the bound is every sample at its fastest
fitting configuration, its GPU-seconds spread evenly over the world, proved never above
what a valid schedule spends). The table:
  M tok/s      simulated throughput, millions of tokens per second (tokens_per_s)
  vs static    throughput over static's (speedup_vs_static); vs ref: over
               static-reference's, when it ran (speedup_vs_static_reference)
  idle         share of GPU time idle before the gradient reductions (idle_share)
  recomp       share of busy GPU time spent recomputing activations (recompute_share)
  comm         share of busy GPU time in sequence-parallel communication (comm_share)
  sync         share of the epoch in exposed gradient sync (grad_sync_share)
  steps        optimizer steps simulated (iterations)
--json prints every field; besides those above: epoch_time_s and ideal_epoch_time_s
(the headline's times), efficiency_old_bound (against the former, priced bound: reads
higher), idle_share_mean_per_iteration, tokens_per_step_mean, tokens_per_step_max,
samples, samples_dropped, tokens, world_size and schedule_seconds (CPU seconds the
schedule took to build; the policies are built at once, each in its own process, so
wall time would count the others'); and for the run: workload, description, model,
hardware, gpus, samples, tokens, steps and steps_why (the global batch that sets the step count).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate scheduling policies on modelled hardware at any scale",
        description=__doc__,
        epilog=KEY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dataset_flags(
        parser, "--preset", exclusive=True, note="a workload preset brings its model and hardware"
    )
    add_deprecated_alias(parser, "--num-samples", "--dataset-limit", "dataset_limit", type=int)
    add_model_flags(parser, note="an analytic preset", lora=False)
    add_hardware_flag(parser, note="default: the workload's")
    add_world_flag(parser, required=True)
    add_policy_flag(parser, several=True)
    add_global_batch_flags(parser)
    add_split_mode_flag(parser)
    config_option(parser, "--seed", key="seed", type=int)
    add_json_flag(parser)
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto JSON trace")
    parser.add_argument(
        "--trace-iterations",
        type=int,
        default=20,
        help="iterations per policy in the trace (default: %(default)s; 0: all)",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="write Gantt and throughput charts")
    add_shard_flags(parser)
    enable_config_file(parser)
    parser.set_defaults(func=run)


def simulate_command(args: argparse.Namespace) -> dict[str, Any]:
    """Run the simulation the arguments describe; returns the JSON-able report."""
    from datacentric.models.model_args import parse_model_args
    from datacentric.profiling.factory import named_spec
    from datacentric.sim.policy_comparison import DEFAULT_POLICIES, policy_table, run_policies
    from datacentric.sim.policy_comparison import simulation_cost_model as make_cost_model

    if args.world < 1:
        raise ValueError(f"--world must be >= 1, got {args.world}")
    workload = _workload(args)
    model = args.model or workload.model
    hardware = args.hardware or workload.hardware
    chosen = args.policy or ",".join(DEFAULT_POLICIES)
    policies = [p.strip() for p in chosen.split(",") if p.strip()]
    if "static" not in policies:
        policies.insert(0, "static")
    from datacentric.progress import Progress
    from datacentric.settings import SchedulingConfig

    options = SchedulingConfig(**global_batch_options(args))
    spec = named_spec(model, parse_model_args(args.model_args), lora_of_args(args))
    cost_model = make_cost_model(spec, hardware, args.world, shard=sharding_of(args))
    cost_model = limit_splits(cost_model, args)
    options = sized_global_batch(args, options, workload.shapes, cost_model, args.world)
    what = f"simulate on {counted(args.world, 'rank')}"
    with Progress(what, 1, unit="part", time_left=True) as bar:  # run_policies sizes it
        runs = run_policies(
            workload.shapes,
            cost_model,
            args.world,
            policies,
            seed=args.seed,
            record_spans=bool(args.trace or args.plot),
            options=options,
            progress=bar,
            workers=len(policies),  # every policy at once: each stage's time left is its own
        )
    results = {p: r.result for p, r in runs.items()}
    if args.trace:
        from datacentric.sim.trace import write_trace

        write_trace(results, args.trace, args.trace_iterations or None)
    if args.plot:
        from datacentric.sim.plots import plot_results

        title = f"{workload.name}: {model} on {args.world} x {hardware}"
        plot_results(results, args.plot, title=title)
    first = next(iter(runs.values())).result
    steps = len(next(iter(runs.values())).schedule.iterations)
    return {
        "workload": workload.name,
        "description": workload.description,
        "model": model,
        "hardware": hardware,
        "gpus": args.world,  # the JSON field keeps its name
        "samples": len(workload.shapes),
        "tokens": workload.num_tokens,
        "ideal_epoch_time_s": first.ideal_epoch_time_s,
        "steps": steps,
        "steps_why": _steps_why(args, workload.shapes, steps, options),
        "policies": policy_table(runs),
    }


def _workload(args: argparse.Namespace) -> Any:
    """The workload of ``--dataset`` (a preset keeps its model and hardware) or
    ``--lengths``."""
    from datacentric.data.workloads import (
        get_workload,
        list_workloads,
        workload_from_lengths,
        workload_from_shapes,
    )

    if args.lengths:
        return workload_from_lengths(args.lengths, args.model, args.hardware)
    if not args.dataset:
        raise ValueError(NO_DATA)
    if args.dataset in list_workloads():
        return get_workload(args.dataset, seed=args.seed, num_samples=args.dataset_limit)
    shapes, _ = dataset_shapes(args)
    return workload_from_shapes(args.dataset, shapes, args.model, args.hardware, "")


def _steps_why(args: argparse.Namespace, shapes: Any, steps: int, options: Any) -> str:
    """Why the epoch has ``steps`` optimizer steps: the global batch and where it is set
    (``options``: the ``[scheduling]`` section simulated, its sized batch included)."""
    if args.global_batch_samples:
        samples = counted(args.global_batch_samples, "sample")
        return f"global batch of {samples} (--global-batch-samples)"
    if args.global_batch_tokens:
        return f"global batch of {args.global_batch_tokens} tokens (--global-batch-tokens)"
    if options.global_batch_tokens:
        return (
            f"global batch of {options.global_batch_tokens} tokens (sized from the dataset "
            "as train sizes it; --global-batch-tokens changes it)"
        )
    import numpy as np

    from datacentric.scheduling.dataset_view import DatasetView
    from datacentric.scheduling.global_batches import default_tokens_per_iteration

    bound = default_tokens_per_iteration(DatasetView(shapes), np.arange(len(shapes)), args.world)
    return (
        f"global batch of {bound} tokens (the default, world x max(2**18, longest sample); "
        "--global-batch-tokens changes it)"
    )


def run(args: argparse.Namespace) -> int:
    announce(  # before the data is read (a tokenizer, or a large file, takes seconds)
        "simulate",
        f"{args.policy or 'the default policies'} on {data_named(args)} at "
        f"{counted(args.world, 'rank')}; reading the data first, then one epoch per policy with "
        "time left",
        json_output=args.json,
    )
    report = simulate_command(args)
    if args.json:
        print(json_text(report))
        return 0
    print(
        f"{report['workload']}: {counted(report['samples'], 'sample')}, {report['model']} on "
        f"{report['gpus']} x {report['hardware']}"
    )
    steps = report["steps"]
    print(f"one epoch simulated: {counted(steps, 'optimizer step')}, each a {report['steps_why']}")
    print("\n".join(policy_lines(report["policies"])))
    return 0


def policy_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Per policy its headline (the epoch's simulated time and its efficiency against
    the ideal bound), then a short table of the figures that say why (:data:`KEY`)."""
    header = (
        f"{'policy':<16}{'M tok/s':>9}{'vs static':>11}{'vs ref':>8}{'idle':>7}"
        f"{'recomp':>8}{'comm':>7}{'sync':>7}{'steps':>7}"
    )
    lines = policy_report(rows, "epoch_time_s", "simulated", header, _policy_row)
    return [*lines, "each figure: datacentric simulate --help; every field: --json"]


def _policy_row(policy: str, row: dict[str, Any]) -> str:
    ref = row["speedup_vs_static_reference"]
    return (
        f"{policy:<16}{row['tokens_per_s'] / 1e6:>9.3f}{row['speedup_vs_static']:>10.2f}x"
        f"{'-' if ref is None else f'{ref:.2f}x':>8}{row['idle_share']:>7.1%}"
        f"{row['recompute_share']:>8.1%}{row['comm_share']:>7.1%}"
        f"{row['grad_sync_share']:>7.1%}{row['iterations']:>7}"
    )
