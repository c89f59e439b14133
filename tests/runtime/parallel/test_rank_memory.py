"""A rank's memory on the CPU is this machine's physical memory shared by the world's
ranks on it (spawned: all of them; torchrun: ``LOCAL_WORLD_SIZE``), so ranks that share
a machine plan within their share of it, the pre-check as the ranks do."""

from __future__ import annotations

import pytest
import torch

from datacentric.parallel import groups
from datacentric.parallel.groups import device_memory_bytes, local_world_size

PAGE, PAGES = 4096, 6_000_000  # a machine of about 24 GB
CPU = torch.device("cpu")


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> int:
    """This machine's physical memory, fixed; no torchrun environment."""
    sizes = {"SC_PAGE_SIZE": PAGE, "SC_PHYS_PAGES": PAGES}
    monkeypatch.setattr(groups.os, "sysconf", lambda name: sizes[name])
    for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    return PAGE * PAGES


def test_spawned_ranks_share_the_machine_s_memory(machine: int) -> None:
    assert device_memory_bytes(CPU) == machine
    assert [local_world_size(w) for w in (1, 2, 4)] == [1, 2, 4]
    assert [device_memory_bytes(CPU, w) for w in (1, 2, 4)] == [
        machine,
        machine // 2,
        machine // 4,
    ]


def test_torchrun_ranks_share_it_with_the_ranks_on_their_machine(
    machine: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")  # two machines of 4 ranks
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_world_size(8) == 4
    assert device_memory_bytes(CPU, 8) == machine // 4


def test_the_pre_check_plans_world_2_within_half(machine: int) -> None:
    from datacentric.cli.flags import config_from_args
    from datacentric.cli.main import build_parser
    from datacentric.cli.precheck import analytic_pipeline, analytic_spec
    from datacentric.models.source import build_model_named
    from datacentric.planning.memory_cap import resolve_memory_cap
    from datacentric.shapes import SampleShape

    config = config_from_args(build_parser().parse_args(["train", "--model", "llama"]))
    module = build_model_named("llama", {}, device="meta", dataset=None)
    spec = analytic_spec(config, module)
    shapes = [SampleShape(tokens=64)] * 8
    caps = {
        world: analytic_pipeline(shapes, config, module, spec, world, False).plan.memory_cap_bytes
        for world in (1, 2)
    }
    assert caps[1] == resolve_memory_cap(None, machine)
    assert caps[2] == resolve_memory_cap(None, machine // 2)  # as each of its ranks plans
    assert caps[2] <= caps[1] // 2
