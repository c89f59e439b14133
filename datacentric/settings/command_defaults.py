"""Where a command's default of a settings key differs from the schema's, and why (no torch).

Every flag of a settings key takes its name, help, type, choices and default from the
schema (:mod:`~datacentric.settings.sections`); a command whose work needs another
default declares it here, the one place, with the reason. The flag's help shows the
default the command uses (:attr:`Override.shown` when it is chosen at run time), and
``tests/runtime/cli/test_flag_schema.py`` holds every command's flags to this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datacentric.settings.layout import flat_defaults


@dataclass(frozen=True)
class Override:
    """A command's own default of a settings key: ``value`` (``None``: chosen when the
    command runs, as ``shown`` says), and ``reason``, why the schema's does not fit."""

    value: Any
    reason: str
    shown: str | None = None


#: ``profile``'s longest sample, profiled sample and validated micro-batch with gloo
#: (CPUs: attention over 8k-token samples takes seconds per pass, docs/data.md) and
#: with nccl.
CPU_MAX_TOKENS = 1024
GPU_MAX_TOKENS = 4096

#: ``bench``'s and ``demo``'s local gloo ranks outside torchrun: the smallest world with
#: an SP-2 group (under torchrun they run on its ``WORLD_SIZE``).
COMPARISON_WORLD = 2
_COMPARISON_WORLD = Override(
    None,
    f"{COMPARISON_WORLD} local gloo ranks, the smallest world with an SP-2 group; under "
    "torchrun, its ranks",
    shown=f"{COMPARISON_WORLD}; under torchrun, its WORLD_SIZE",
)

_EITHER_DATA = Override(None, "the samples come from --dataset or --lengths, whichever is given")
_WORKLOAD_MODEL = Override(
    None, "a workload preset brings its model", shown="the workload's, llama-7b for text data"
)

#: Command -> settings key -> its own default. The keys are flat (``lora_rank``).
COMMAND_DEFAULTS: dict[str, dict[str, Override]] = {
    "bench": {
        # The CPU comparison: the tiny Llama on the standard-library corpus with a memory
        # cap under which the longest files need SP 2 or recomputation. The model is held
        # whole on each rank (one gradient all-reduce after the step's passes): under
        # FSDP2 on gloo the last backward's per-block reduce-scatters tie the ranks
        # together mid-pass, and on two CPU cores that slowed the other rank's remaining
        # micro-batches (1.5 s -> 3.6 s), which the simulator does not model (errors
        # 6.5-15.1% with FSDP2, 0.6-1.5% without, same command, 2026-12-01).
        "world": _COMPARISON_WORLD,
        "policy": Override(
            "static,dcp-pac,dcp-opt", "a comparison: the baseline first, then the DCP policies"
        ),
        "out": Override("runs/bench", "its runs are not a training run's"),
        "dataset_limit": Override(12, "12 corpus files keep two runs of each policy in minutes"),
        "memory_gb": Override(0.2, "a cap under which the longest files need SP 2 or recompute"),
        "shard": Override("none", "FSDP2 on gloo couples the ranks mid-pass (see above)"),
        "tokens_per_iteration": Override(16384, "steps of a few files each on CPUs"),
        "progress": Override(False, "stdout holds the summary; each run's bar would interleave"),
    },
    "demo": {
        "world": _COMPARISON_WORLD,
        "out": Override("runs/demo", "its runs are not a training run's"),
        # one run of each policy on 12 files took 2 min 53 s; two on 10 (24 chunks,
        # 5 steps) keep `make demo` near five minutes on an idle machine
        "dataset_limit": Override(10, "10 corpus files keep the demo near five minutes"),
    },
    "tiny": {"out": Override("tiny", "tiny inputs to try commands on, not a training run")},
    "equivalence": {
        "world": Override(4, "four gloo ranks: a step that mixes SP sizes, or a U x R split"),
        "timeout_s": Override(300.0, "one step of a small model, not a profile's many passes"),
    },
    "export": {
        "model": Override(
            None, "the checkpoint records its model", shown="the one the checkpoint records"
        ),
    },
    "plan": {
        "model": Override(
            None,
            "an analytic plan needs a model and --hardware; a profile knows its model",
            shown="none: from --profile-dir, else give it with --hardware",
        ),
        "dataset": _EITHER_DATA,
    },
    "prepare": {
        "out": Override(
            None, "the latents folder is the user's to name", shown="none: give --out DIR"
        ),
    },
    "profile": {
        "dataset": _EITHER_DATA,
        "world": Override(2, "two local gloo ranks: the smallest world with an SP-2 group"),
        "max_tokens": Override(
            None,
            "attention over 8k-token samples takes seconds per pass on CPUs (docs/data.md)",
            shown=f"{CPU_MAX_TOKENS} with gloo on CPUs, else {GPU_MAX_TOKENS}",
        ),
        "dtype": Override(
            None,
            "gloo ranks on CPUs profile in float32, GPUs in the dtype they train in",
            shown="float32 with gloo, bfloat16 with nccl",
        ),
        "profile_dir": Override(
            None,
            "a profile measured on its own is named after what it measured",
            shown="runs/profile-MODEL-worldN",
        ),
        "repeats": Override(
            5,
            "a profile measured on its own is kept and shared between runs: two more timed "
            "passes per case steady its medians; a training run's own profile (3) delays "
            "its first step",
        ),
        "timeout_s": Override(
            1800.0,
            "each launch also runs the full-depth validation (two sessions), longer than a "
            "training run's two-block profile",
        ),
    },
    "schedule": {
        "dataset": _EITHER_DATA,
        "model": Override(None, "a workload preset brings its model", shown="the workload's"),
    },
    "simulate": {
        "dataset": _EITHER_DATA,
        "model": _WORKLOAD_MODEL,
        "policy": Override(
            None,
            "a comparison of the paper's policies",
            shown="the paper's policies, sim.policy_comparison.DEFAULT_POLICIES",
        ),
    },
}


def command_override(command: str, key: str) -> Override | None:
    """``command``'s own default of settings key ``key`` (None: the schema's)."""
    return COMMAND_DEFAULTS.get(command, {}).get(key)


def command_default(command: str, key: str) -> Any:
    """The default ``command`` uses for ``key``: its override's value, else the schema's."""
    override = command_override(command, key)
    return flat_defaults()[key] if override is None else override.value


def command_settings(command: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """``{key: command_default(command, key)}`` of ``keys``."""
    return {key: command_default(command, key) for key in keys}
