"""Ranks that were not started alike (several nodes, each its own command) are refused
before training, in the same line on every rank: other settings (another ``--seed``),
a run folder rank 0's side does not share (another ``--out``, no shared filesystem), or
nodes of other numbers of ranks (another ``--nproc-per-node``). All three trained
before, the second saving each checkpoint in parts. Ranks on devices of
other sizes plan under one default budget, the smallest device's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from run_config import small_config

from datacentric.parallel.launch import spawn
from datacentric.train import rank_agreement
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def _started_apart(root: str) -> dict[str, str]:
    """A rank's outcome of two runs of one step each: rank 1 given another seed, then
    another run folder (as a second node's command would give them)."""
    rank = dist.get_rank()
    seen = {}
    base = small_config(Path(root) / "run", iterations=1)
    job = base.job
    cases = {
        "seed": dataclasses.replace(job, seed=job.seed + rank),
        "out": dataclasses.replace(job, out=str(Path(root) / f"node-{rank}")),
    }
    for case, given in cases.items():
        try:
            train_rank(dataclasses.replace(base, job=given))
            seen[case] = "trained"
        except ValueError as err:
            seen[case] = str(err)
    seen["node"] = _on_nodes_of_other_sizes(base, rank)
    seen["budget"] = _default_budget(4 + 4 * rank)
    seen["hardware"] = _planned_apart(rank, hardware="h100-sxm")
    seen["plan"] = _planned_apart(rank, dtype="bfloat16")
    seen["memory"] = _planned_apart(rank, budget_on_rank_1_only=True)
    seen["last bits"] = _planned_apart(rank, times=lambda t: t * (1 + 1e-15))
    seen["failed"] = _planned_apart(rank, times=_fails)
    return seen


def _fails(seconds: float) -> float:
    """A cost model that fails with something else than a refusal (a ``ValueError``)."""
    raise RuntimeError("the cost model\nfailed")


def _planned_apart(rank: int, times: Callable[[float], float] | None = None, **given: Any) -> str:
    """:func:`_planned_apart_with` whose rank 1 passes each option's estimated pass time
    through ``times`` (last bits another CPU's fit or libm may give, or a failure)."""
    from datacentric.planning import bucket_options

    own = bucket_options.safe_time
    if rank == 1 and times is not None:
        bucket_options.safe_time = lambda *args: times(own(*args))
    try:
        return _planned_apart_with(rank, **given)
    except RuntimeError as err:
        return f"raised {err}"
    finally:
        bucket_options.safe_time = own


def _planned_apart_with(
    rank: int,
    hardware: str | None = None,
    dtype: str | None = None,
    budget_on_rank_1_only: bool = False,
) -> str:
    """A rank's outcome of a ``DataCentric`` whose rank 1 reads another GPU model off its
    device (the analytic cost model's ``hardware``), prices another ``dtype``, or alone
    is given ``memory_gb`` (``budget_on_rank_1_only``): each rank plans alone, from what
    its own machine and arguments say."""
    import datacentric.train.build as build
    from datacentric import DataCentric
    from datacentric.data import DataConfig, open_dataset
    from datacentric.models import build_model_named

    dataset = open_dataset("stdlib", DataConfig(max_tokens=256, dataset_limit=1))
    model = build_model_named("llama", dataset=dataset)
    own = build._hardware_name
    if rank == 1 and hardware is not None:
        build._hardware_name = lambda device: hardware
    try:
        given = {"dtype": dtype} if rank == 1 and dtype is not None else {}
        given["memory_gb"] = None if budget_on_rank_1_only and rank == 0 else 8
        DataCentric(model, dataset, check_model=False, prefetch=0, **given)
        return "planned"
    except ValueError as err:
        return str(err)
    finally:
        build._hardware_name = own


def _on_nodes_of_other_sizes(config, rank: int) -> str:
    """A rank's outcome of a run where rank 0's node holds 2 ranks and rank 1's one
    (torchrun's LOCAL_WORLD_SIZE, as another --nproc-per-node on the second node)."""
    import datacentric.parallel.groups as groups_module

    patched = [m for m in (groups_module, rank_agreement) if hasattr(m, "local_world_size")]
    saved = [m.local_world_size for m in patched]
    for module in patched:
        module.local_world_size = lambda world: world - rank
    try:
        train_rank(config)
        return "trained"
    except ValueError as err:
        return str(err)
    finally:
        for module, function in zip(patched, saved):
            module.local_world_size = function


def _default_budget(gib: int) -> int:
    """The budget a ``DataCentric`` without ``memory_gb`` plans under on a rank whose
    device has ``gib`` GiB (a node with other GPUs or memory than another's)."""
    import datacentric.parallel.groups as groups_module
    import datacentric.train.data_centric as data_centric
    from datacentric import DataCentric
    from datacentric.data import DataConfig, open_dataset
    from datacentric.models import build_model_named

    dataset = open_dataset("stdlib", DataConfig(max_tokens=256, dataset_limit=1))
    model = build_model_named("llama", dataset=dataset)
    patched = [m for m in (groups_module, data_centric) if hasattr(m, "device_memory_bytes")]
    saved = [m.device_memory_bytes for m in patched]
    for module in patched:
        module.device_memory_bytes = lambda device, world_size=1: gib * 2**30
    try:
        dc = DataCentric(model, dataset, check_model=False, prefetch=0)
        return dc.pipeline.memory_cap_bytes
    finally:
        for module, function in zip(patched, saved):
            module.device_memory_bytes = function


def test_ranks_started_with_other_settings_or_run_folders_are_refused(tmp_path):
    outcomes = spawn(_started_apart, 2, str(tmp_path), timeout_s=300)
    # the default budget: 70% of the smaller device on both ranks (was each its own)
    assert [o["budget"] for o in outcomes] == [int(0.7 * 4 * 2**30)] * 2, outcomes
    assert {**outcomes[0], "failed": ""} == {**outcomes[1], "failed": ""}  # one line
    seed, out = outcomes[0]["seed"], outcomes[0]["out"]
    assert seed.startswith("rank 1 (host "), seed
    assert "job.seed = 1 where rank 0 (host " in seed and "has 0;" in seed, seed
    assert out.startswith("rank 1 (host ") and "does not see the run folder" in out, out
    assert f"--out {tmp_path / 'node-1'} is another folder than rank 0's" in out, out
    node = outcomes[0]["node"]
    assert node.startswith("rank 1 (host ") and "runs on a node of 1 rank(s) where" in node
    assert node.endswith("start every node with the same --nproc-per-node"), node
    hardware, plan = outcomes[0]["hardware"], outcomes[0]["plan"]  # each ran other steps
    assert hardware.startswith("rank 1 (host "), hardware
    assert "prices its plan on hardware 'h100-sxm' where rank 0 (host " in hardware, hardware
    assert hardware.endswith(
        "prices it on 'cpu-local', and would run other steps: give every "
        "rank the same device model, or one cost model (cost_model=, or "
        "--cost-model profile, which rank 0 reads for every rank)"
    ), hardware
    assert plan.startswith("rank 1 (host ") and " plans bucket " in plan, plan
    memory = outcomes[0]["memory"]  # rank 0 alone took the default budget's all-reduce
    assert memory.startswith("rank 1 (host ") and " plans under " in memory, memory
    assert " bytes per rank where rank 0 (host " in memory, memory
    # times that differ in their last bits decide nothing else: the same plan
    assert [o["last bits"] for o in outcomes] == ["planned"] * 2, outcomes
    # a rank whose planning failed: the others are told, where they waited for it
    assert outcomes[1]["failed"] == "raised the cost model\nfailed", outcomes
    failed = outcomes[0].pop("failed")
    assert failed.startswith("rank 1 (host "), failed
    assert failed.endswith(
        "could not make its plan (RuntimeError: the cost model failed); see that rank's error"
    ), failed
    assert not (tmp_path / "run").exists()  # refused before anything was written
    assert not (tmp_path / "node-0" / "checkpoints").exists()
