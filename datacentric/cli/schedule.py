"""``datacentric schedule``: build one epoch's schedule and report how good it is.

The dataset is ``--dataset NAME`` (``stdlib`` or a workload preset) or ``--lengths
FILE``; costs come from a saved profile (``--profile-dir DIR``, its fitted cost model) or
an analytic preset (``--model PRESET --hardware PRESET``; a workload preset brings
its own defaults). The planner plans every bucket first (its knapsack recomputation
is one of the choices ``dcp-pac`` and ``dcp-opt`` use). Prints a summary, or one
JSON object with ``--json``; ``--json-out FILE`` saves the schedule itself as JSON.
With several policies (``--policy static,dcp-opt``) every policy schedules the same
data on the same plan, and the JSON object holds ``policies`` keyed by name (as
``datacentric simulate --json`` does).
Settings may come from ``--config FILE`` (the keys of its flags; flags override it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from datacentric.cli.epoch_report import policy_report, ratio_text
from datacentric.cli.flag_groups import (
    add_dataset_flags,
    add_global_batch_flags,
    add_hardware_flag,
    add_json_flag,
    add_json_out_flag,
    add_model_flags,
    add_policy_flag,
    add_skip_unfittable_flag,
    add_split_mode_flag,
    add_world_flag,
    json_text,
    limit_splits,
)
from datacentric.cli.flags import add_deprecated_alias, config_option, enable_config_file
from datacentric.cli.planning_inputs import (
    add_cost_model_arguments,
    analytic_model,
    command_pipeline,
    data_named,
    dataset_shapes,
    global_batch_options,
    model_and_hardware,
    profiled_model,
    sized_global_batch,
)
from datacentric.cli.ranks import announce
from datacentric.progress import StepShare, counted

if TYPE_CHECKING:
    from datacentric.progress import Progress

KEY = """\
Reading the output. The headline, per policy: one epoch's estimated time (the steps'
makespans plus the exposed gradient sync) and its efficiency, the ideal bound over that
time (1.0: no time lost; higher is better). The ideal bound is every sample at its
fastest fitting configuration, its GPU-seconds summed and spread evenly over the world:
on an analytic cost model it is proved never above what a valid schedule spends; a
fitted profile's model keeps the former, priced bound. The table:
  steps        optimizer steps (global batches) in the epoch (iterations)
  tokens/step  mean tokens per step (tokens_per_step_mean; tokens_per_step_max: most)
  idle mean    mean share of GPU time idle inside a step (imbalance_mean); idle max: the
               worst step's (imbalance_max)
  step bound   efficiency against the per-step bound (efficiency_step_bound): per step,
               its samples' ideal GPU-seconds over the world or its longest sample's
               fastest run, whichever is larger; never below efficiency
  sync s       gradient-sync seconds left exposed after the last backward, whole epoch
               (grad_sync_exposed_s)
  from peers   dcp-opt's steps taken from another policy's (static, dcp-pac) schedule
               of the same global batch because it was faster (settings.steps_from_peers;
               -: not dcp-opt or the epoch is too large); megatron-dyncp's token-packed
               steps are part of dcp-opt's own search (settings.token_packed_steps)
--json prints every field; besides those above: policy, world, cost_model (where the
costs came from), est_epoch_time_s and ideal_epoch_time_s (the headline's times),
efficiency_makespan_only (the same bound over the makespans plus every step's whole
gradient reduction, none hidden), efficiency_old_bound and ideal_epoch_time_old_s
(against the former, priced bound: reads higher), step_bound_epoch_time_s,
samples_total, samples_scheduled, samples_dropped (not scheduled: --drop-remainder's
last partial batch, and samples in buckets the plan skipped), samples_skipped (left out
by the dataset on request: empty documents, or longer than allowed when those are
skipped), settings (what the policy chose; dcp-opt: steps_from_peers,
token_packed_steps (its own steps formed as megatron-dyncp forms them), peers_skipped
(peers whose search could not beat its steps), peers_dropped (peers left out on an
epoch too large for them)), plan_seconds (time taken to schedule),
groups_per_iteration_mean, phases_per_iteration_max, sp_splits ([ulysses, ring,
micro-batches] per split the schedule runs) and out (--json-out). With several
policies: the shared fields (world, cost_model, samples_total, samples_skipped,
tokens_per_step_mean, global_batch_tokens), then policies keyed by name, each with
the rest.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "schedule",
        help="build an epoch's schedule with a policy and report its efficiency",
        description=__doc__,
        epilog=KEY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dataset_flags(parser, exclusive=True)
    add_world_flag(parser, required=True)
    add_policy_flag(parser, several=True)
    config_option(parser, "--profile", key="profile_dir", metavar="DIR")
    add_model_flags(parser, note="an analytic preset")
    add_hardware_flag(parser, note="default: the workload's")
    add_cost_model_arguments(parser)
    config_option(parser, "--seed", key="seed", type=int)
    parser.add_argument("--epoch", type=int, default=0, help="epoch number (orders the samples)")
    add_global_batch_flags(parser)
    add_split_mode_flag(parser)
    config_option(
        parser, "--drop-remainder", key="drop_remainder", action=argparse.BooleanOptionalAction
    )
    config_option(parser, "--max-sp", key="max_sp_size", type=int)
    config_option(
        parser, "--exact-solver", key="exact_solver", action=argparse.BooleanOptionalAction
    )
    add_deprecated_alias(
        parser, "--no-exact", "--no-exact-solver", "exact_solver", nargs=0, const=False
    )
    add_skip_unfittable_flag(parser)
    add_json_out_flag(parser, note="here: the schedule")
    add_json_flag(parser)
    enable_config_file(parser)
    parser.set_defaults(func=run)


def cost_model_and_source(args: argparse.Namespace) -> tuple[Any, str]:
    """The cost model (profile or analytic) and where it came from."""
    if args.profile:
        cost, _ = profiled_model(args)
        return limit_splits(cost, args), f"profile {args.profile}"
    model, hardware = model_and_hardware(args)
    if not (model and hardware):
        from datacentric.planning.hardware import list_hardware

        raise ValueError(
            f"--model {model} prices with the analytic cost model: give --hardware PRESET "
            f"({', '.join(list_hardware())}), or --profile-dir DIR"
            if model
            else "give --profile-dir DIR, or --model MODEL --hardware PRESET"
        )
    cost = limit_splits(analytic_model(model, hardware, args.world, args), args)
    return cost, f"analytic {model} on {hardware}"


def schedule_summary(args: argparse.Namespace) -> dict[str, Any]:
    """Build the schedule(s) the arguments describe; the summary as a JSON-able dict:
    one policy's fields, or with several policies ``policies`` keyed by name (one plan,
    one pipeline, every policy on the same global batches)."""
    from datacentric.progress import Progress
    from datacentric.settings import SchedulingConfig

    policies = [p for p in args.policy.split(",") if p]
    if len(policies) > 1 and args.json_out:
        raise ValueError("--json-out saves one schedule: give one --policy")
    batch = global_batch_options(args)
    with Progress(f"schedule on {counted(args.world, 'rank')}", 2, unit="stage") as bar:
        bar.set_stage("the dataset and the cost model")
        shapes, skipped = dataset_shapes(args)
        cost, source = cost_model_and_source(args)
        options = SchedulingConfig(
            **batch,
            drop_remainder=args.drop_remainder,
            max_sp_size=args.max_sp,
            exact_solver=args.exact_solver,
        )
        options = sized_global_batch(args, options, shapes, cost, args.world)  # as train's
        pipeline = command_pipeline(args, shapes, cost, args.world, options=options, seed=args.seed)
        bar.update(stage=f"planning {counted(len(shapes), 'sample', ',')}")
        pipeline.plan  # noqa: B018 - made once here, so the stages show
        bar.update()
    rows = {}
    for policy in policies:  # each policy's steps, out of the epoch's, with time left
        with Progress(f"schedule {policy} steps", 1, unit="step", time_left=True) as steps:
            rows[policy] = policy_summary(
                args, policy, pipeline, source, skipped, on_step=last_step_held(steps)
            )
            steps.update()  # the last step, with the epoch's measures and checks
    if len(policies) == 1:
        return rows[policies[0]]
    shared = ("world", "cost_model", "samples_total", "samples_skipped", "tokens_per_step_mean")
    first = rows[policies[0]]
    return {
        **{key: first[key] for key in shared},
        "global_batch_tokens": options.global_batch_tokens,
        "policies": {p: {k: v for k, v in row.items() if k != "policy"} for p, row in rows.items()},
    }


def last_step_held(steps: Progress) -> StepsHeld:
    """``on_step`` for a progress of the epoch's steps that counts the last one only
    once the schedule is measured and checked (seconds on a large epoch, up to a few
    steps' time: the time left would end before the work does)."""
    return StepsHeld(steps)


class StepsHeld(StepShare):
    """``on_step(done, total)`` for :func:`last_step_held`; its ``searched(done,
    total)`` hears of a policy's search in the units it counts (``static``: micro-batches
    priced; ``megatron-dyncp``: steps priced;
    :func:`~datacentric.scheduling.search_steps.searched`): a policy that searches before
    its steps is counted in those units, its steps then held at the search's end (they
    come at once, after it). As a :class:`~datacentric.progress.StepShare` it hears how
    far the step now built is (``dcp-opt``), which the progress reads as the share of that
    step done (:meth:`share`): an epoch of a few long steps (one, on a large world) then
    says a time left before its first step is out."""

    def __init__(self, steps: Progress) -> None:
        super().__init__()
        self.steps = steps
        self.search = 0.0
        """The steps priced by the policy's search, once it told them (0: none)."""
        steps.partial = self.share

    def __call__(self, done: int, total: int) -> None:
        if self.search:
            self.searched(self.search, self.search)
        else:
            if done < total:  # the last step's share stays while the epoch is measured
                self.step_out()
            self.steps.reached(min(done, total - 1), total)

    def searched(self, done: float, total: float) -> None:
        """The policy's search has done ``done`` of its ``total`` units (see the class)."""
        if not self.search:
            self.steps.set_stage("its search")
        self.search, units = total, max(int(total), 1)
        self.steps.reached(min(int(done), units - 1), units)

    def share(self) -> tuple[float, str] | None:
        """The share of the step now built that is done, as its policy told it, for the
        progress's ``partial``; None where not told. The last step's stays while the
        epoch is measured and checked."""
        share = None if self.search else self.step_share()
        return None if share is None else (share, "")


def policy_summary(
    args: argparse.Namespace,
    policy: str,
    pipeline: Any,
    source: str,
    skipped: int,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """One policy's schedule from the command's pipeline, built and validated; its
    summary fields. ``on_step``: told the steps scheduled (a progress line)."""
    shapes = pipeline.shapes
    schedule = pipeline.schedule(args.epoch, policy=policy, on_step=on_step)
    schedule.validate()
    if args.json_out:
        schedule.save(args.json_out)
    meta = schedule.meta
    groups = [len(it.assignments) for it in schedule.iterations]
    splits: dict[tuple[int, int], int] = {}
    for it in schedule.iterations:
        for group in it.assignments:
            for split in group.splits:
                splits[split] = splits.get(split, 0) + 1
    return {
        "policy": policy,
        "world": args.world,
        "cost_model": source,
        "iterations": len(schedule.iterations),
        "samples_total": len(shapes),
        "samples_scheduled": schedule.samples_scheduled,
        "samples_dropped": meta["samples_dropped"],
        "samples_skipped": skipped,
        "efficiency": meta["efficiency"],
        "efficiency_makespan_only": meta["efficiency_makespan_only"],
        "efficiency_step_bound": meta["efficiency_step_bound"],
        "efficiency_old_bound": meta["efficiency_old_bound"],
        "settings": meta["settings"],
        "tokens_per_step_mean": meta["tokens_per_step_mean"],
        "tokens_per_step_max": meta["tokens_per_step_max"],
        "imbalance_mean": meta["imbalance_mean"],
        "imbalance_max": max(meta["imbalance"]),
        "est_epoch_time_s": meta["est_epoch_time_s"],
        "ideal_epoch_time_s": meta["ideal_epoch_time_s"],
        "ideal_epoch_time_old_s": meta["ideal_epoch_time_old_s"],
        "step_bound_epoch_time_s": meta["step_bound_epoch_time_s"],
        "grad_sync_exposed_s": meta["grad_sync_exposed_s"],
        "plan_seconds": meta["plan_seconds"],
        "groups_per_iteration_mean": sum(groups) / len(groups),
        "phases_per_iteration_max": max(it.num_phases for it in schedule.iterations),
        "sp_splits": [[u, r, n] for (u, r), n in sorted(splits.items())],
        "out": args.json_out,
    }


def run(args: argparse.Namespace) -> int:
    from datacentric.planning.planner import UnfittableBucketError
    from datacentric.profiling.store import ProfileError

    costs = f"the profile in {args.profile}" if args.profile else "the analytic cost model"
    announce(  # before the data is read (a tokenizer, or a large file, takes seconds)
        "schedule",
        f"{args.policy} on {data_named(args)} at {counted(args.world, 'rank')} "
        f"with {costs}; "
        "reading the data and planning first, then each policy's steps with time left",
        json_output=args.json,
    )
    try:
        summary = schedule_summary(args)
    except (ProfileError, UnfittableBucketError, ValueError, KeyError, OSError) as err:
        print(f"datacentric schedule: {err}", file=sys.stderr)
        return 2
    print(json_text(summary) if args.json else human_report(summary))
    return 0


def human_report(summary: dict[str, Any]) -> str:
    """What ``schedule`` prints without ``--json``: per policy a headline (the epoch's
    estimated time and its efficiency against the ideal bound), a short table of the
    figures that say why, and one line on the data; :data:`KEY` explains each."""
    rows = summary.get("policies") or {summary["policy"]: summary}
    header = (
        f"{'policy':<16}{'steps':>7}{'tokens/step':>13}{'idle mean':>11}{'idle max':>10}"
        f"{'step bound':>12}{'sync s':>9}{'from peers':>12}"
    )
    lines = policy_report(rows, "est_epoch_time_s", "estimated", header, _policy_row)
    lines.append(
        f"{counted(summary['samples_total'], 'sample', ',')} on "
        f"{counted(summary['world'], 'rank')} "
        f"({summary['cost_model']})"
    )
    if summary["samples_skipped"]:
        lines.append(
            f"left out by the dataset: {counted(summary['samples_skipped'], 'sample', ',')}"
        )
    if any(row["samples_dropped"] for row in rows.values()):
        dropped = ", ".join(f"{p} {r['samples_dropped']:,}" for p, r in rows.items())
        lines.append(f"samples not scheduled: {dropped}")
    lines.append("each figure: datacentric schedule --help; every field: --json")
    return "\n".join(lines)


def _policy_row(policy: str, row: dict[str, Any]) -> str:
    peers = row["settings"].get("steps_from_peers")
    return (
        f"{policy:<16}{row['iterations']:>7}{row['tokens_per_step_mean']:>13,.0f}"
        f"{row['imbalance_mean']:>11.1%}{row['imbalance_max']:>10.1%}"
        f"{ratio_text(row['efficiency_step_bound']):>12}{row['grad_sync_exposed_s']:>9.3g}"
        f"{'-' if peers is None else sum(peers.values()):>12}"
    )
