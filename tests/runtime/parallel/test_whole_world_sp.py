"""The whole world as one SP group at worlds that are not a power of two (3, 6, 12 ranks).

A step's SP groups are powers of two dividing the world, or the whole world alone in its
phase (docs/scheduling.md). The plan, every policy and the simulator use the whole world
where a sample needs it; a 6-head model at world 3 trains on SP 3 exactly, through the
Python API and ``datacentric train --world 3``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from cli_here import cli_here
from run_config import small_config
from toy_cost_model import ToyCostModel, toy_pipeline

from datacentric.cli.main import main
from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import launch
from datacentric.planning.bucket_options import mixable_sp_sizes, sp_size_tiers
from datacentric.planning.planner import UnfittableBucketError
from datacentric.scheduling import POLICIES
from datacentric.scheduling.micro_batches import check_layout
from datacentric.settings import SchedulingConfig
from datacentric.shapes import SampleShape
from datacentric.sim.policy_comparison import run_policies
from datacentric.train.checkpoints.checkpoint_load import read_model_state
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint
from datacentric.train.data_centric import DataCentric, ulysses_sp_sizes
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.trainer import train_rank
from datacentric.verify.reference import (
    Reference,
    packed_model_sample_loss,
    reference_grads,
    reference_loss,
)

#: per world: a sample that fits the whole world under the toy's 10 MiB budget (2 MiB
#: above its model state: 65,536 tokens per rank with every block recomputing) but not
#: the largest power of two dividing the world (1, 2 and 4 ranks)
LONG = {3: 131_072, 6: 262_144, 12: 524_288}


@dataclass(frozen=True)
class HeadsToy(ToyCostModel):
    """The toy cost model of a model with ``heads`` attention heads (Ulysses only)."""

    heads: int = 6

    def supports_sp_size(self, sp_size: int) -> bool:
        return self.heads % sp_size == 0


def test_a_step_may_use_powers_of_two_and_the_whole_world():
    assert mixable_sp_sizes(3) == [1, 3]
    assert mixable_sp_sizes(6) == [1, 2, 6]
    assert mixable_sp_sizes(12) == [1, 2, 4, 12]
    assert mixable_sp_sizes(8) == [1, 2, 4, 8]
    six = build_model("llama", num_heads=6, hidden_size=96)
    twelve = build_model("llama", num_heads=12, hidden_size=96)
    assert ulysses_sp_sizes(six, 3) == [1, 3]
    assert ulysses_sp_sizes(six, 6) == [1, 2, 6]
    assert ulysses_sp_sizes(six, 12) == [1, 2]  # 4 and 12 do not divide 6 heads
    assert ulysses_sp_sizes(twelve, 6) == [1, 2, 6]
    assert ulysses_sp_sizes(twelve, 12) == [1, 2, 4, 12]
    toy = HeadsToy(heads=12)
    assert sp_size_tiers(toy, 6) == ([1, 2, 6], [])
    assert sp_size_tiers(toy, 12) == ([1, 2, 4], [12])
    with pytest.raises(ValueError, match=r"SP sizes \[3\] cannot run at world size 6"):
        sp_size_tiers(toy, 6, [1, 3])


def _shapes(world: int) -> list[SampleShape]:
    lengths = [256] * 24 + [2048] * 6 + [LONG[world]] * 2
    return [SampleShape.text(n) for n in lengths]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize(("world", "heads"), [(3, 6), (6, 12), (12, 12)])
def test_every_policy_runs_a_long_sample_on_the_whole_world(world: int, heads: int, policy):
    shapes = _shapes(world)
    cost = HeadsToy(heads=heads, capacity_bytes=10 * 2**20)
    settings = SchedulingConfig(global_batch_tokens=2 * LONG[world])
    pipeline = toy_pipeline(shapes, cost, world_size=world, policy=policy, options=settings)
    assert {o.sp_size for o in pipeline.plan.options_of(f"t<={LONG[world]}")} == {world}
    schedule = pipeline.schedule()
    schedule.validate()
    assert not schedule.dropped_sample_ids
    long_ids = {i for i, s in enumerate(shapes) if s.tokens == LONG[world]}
    for it in schedule.iterations:
        check_layout(it, world)  # aligned groups of sizes 1, 2, 4 or the whole world
        for a in it.assignments:
            if long_ids & set(a.sample_ids()):
                assert a.sp_size == world, (it.index, a.sp_size)
    assert 0 < schedule.meta["efficiency"] <= 1 + 1e-9


def test_a_sample_too_long_for_the_whole_world_is_refused():
    shapes = [SampleShape.text(n) for n in [256] * 8 + [2 * LONG[3]]]
    pipeline = toy_pipeline(shapes, HeadsToy(heads=6, capacity_bytes=10 * 2**20), world_size=3)
    with pytest.raises(UnfittableBucketError, match="even with SP size 3"):
        pipeline.schedule()


def test_the_simulator_runs_every_policy_at_world_twelve():
    shapes = _shapes(12)
    cost = HeadsToy(heads=12, capacity_bytes=10 * 2**20)
    options = SchedulingConfig(global_batch_tokens=2 * LONG[12])
    runs = run_policies(
        shapes, cost, 12, sorted(POLICIES), options=options, memory_cap_bytes=cost.capacity_bytes
    )
    assert set(runs) == set(POLICIES)
    for name, run in runs.items():
        assert run.result.samples == len(shapes), name
        assert run.result.world_size == 12
        sizes = {a.sp_size for it in run.schedule.iterations for a in it.assignments}
        assert 12 in sizes and sizes <= {1, 2, 4, 12}, (name, sizes)
        assert 0 < run.result.efficiency <= 1 + 1e-9, name


def test_simulate_command_at_world_twelve(tmp_path, capsys):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in [2000] * 12 + [16000] * 4 + [600_000]))
    argv = ["simulate", "--lengths", str(lengths), "--world", "12", "--model", "llama-7b"]
    argv += ["--hardware", "h200-sxm", "--policy", "static,dcp-opt,megatron-dyncp", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == 12 and set(report["policies"]) == {
        "static",
        "dcp-opt",
        "megatron-dyncp",
    }
    for row in report["policies"].values():
        assert row["samples"] == 17 and row["samples_dropped"] == 0
        assert 0 < row["efficiency"] <= 1 + 1e-9


#: a budget under which the 1,024-token samples of the small corpus fit on no single rank
#: of the 6-head model, only on SP 3 (the analytic cost model of the CPU)
WORLD3_MEMORY_GB = 0.025
SIX_HEADS = {"num_heads": 6, "hidden_size": 96}


def _world3_step() -> dict:
    """On this rank: one step of the 6-head model through ``DataCentric`` (default
    policy and sharding); the loss, the step's samples and groups, every full gradient."""
    dataset = StdlibCorpus(max_tokens=1024, limit=2)
    torch.manual_seed(0)
    model = build_model("llama", **SIX_HEADS)
    dc = DataCentric(
        model,
        dataset,
        memory_gb=WORLD3_MEMORY_GB,
        tokens_per_iteration=2048,
        groups=ProcessGroups(),
        prefetch=0,
        shard="fsdp2",
    )
    step = next(iter(dc.steps()))
    for micro in step:
        micro.backward(dc.model(micro.batch))
    loss = step.finish()
    grads = {}
    for name, p in dc.model.named_parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name] = grad.detach().clone()
    groups = [(a.rank_start, a.sp_size) for a in step.iteration.assignments]
    dc.close()
    return {"loss": loss, "ids": list(step.sample_ids), "groups": groups, "grads": grads}


@pytest.mark.slow
def test_a_six_head_model_trains_exactly_on_sp_three_through_the_api():
    ranks = launch(_world3_step, nproc=3, collective_timeout_s=120.0)
    got = ranks[0]
    assert (0, 3) in got["groups"], got["groups"]  # SP 3: the whole world
    for other in ranks.values():
        assert other["loss"] == got["loss"] and other["ids"] == got["ids"]
        for name, grad in got["grads"].items():
            assert torch.equal(other["grads"][name], grad), name
    dataset = StdlibCorpus(max_tokens=1024, limit=2)
    torch.manual_seed(0)
    fresh = build_model("llama", **SIX_HEADS)  # unmodified: its own forward and attention
    reference = Reference(
        fresh, "", fresh.loss_mode, packed_model_sample_loss(fresh, dataset), "own forward"
    )
    ref_loss = reference_loss(reference, got["ids"])
    ref_loss.backward()
    torch.testing.assert_close(
        torch.tensor(got["loss"]), ref_loss.detach().float(), rtol=1e-5, atol=0.0
    )
    ref_grads = reference_grads(reference)
    assert got["grads"].keys() == ref_grads.keys()
    for name, ref in ref_grads.items():
        assert ref.abs().sum() > 0, name
        torch.testing.assert_close(got["grads"][name], ref, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_train_command_at_world_three_uses_sp_three_and_matches_one_process(tmp_path, capsys):
    """``datacentric train --world 3`` under a budget only SP 3 meets, against the same
    run in one process (a budget that fits one rank): same steps, losses and weights. The
    command runs in this process (its three ranks are spawned from it)."""
    settings = dict(
        max_tokens=1024,
        iterations=2,
        lr_schedule="constant",
        warmup_iterations=0,
        model_args=tuple(f"{k}={v}" for k, v in SIX_HEADS.items()),
    )
    argv = ["--model", "llama", "--dataset-limit", "2", "--max-tokens", "1024"]
    argv += ["--cost-model", "analytic", "--tokens-per-iteration", "1024", "--no-progress"]
    argv += ["--iterations", "2", "--lr-schedule", "constant", "--warmup-iterations", "0"]
    argv += [f"--model-arg={k}={v}" for k, v in SIX_HEADS.items()]
    argv += ["--memory-gb", str(WORLD3_MEMORY_GB), "--world", "3", "--out", str(tmp_path / "w3")]
    status, _, err = cli_here(["train", *argv], capsys)
    assert status == 0, err[-3000:]
    assert "Traceback" not in err
    train_rank(small_config(tmp_path / "w1", memory_gb=1.0, **settings))
    three, one = read_metrics(tmp_path / "w3"), read_metrics(tmp_path / "w1")
    assert len(three) == len(one) == 2
    assert any(sp == 3 for m in three for _, sp, _ in m["groups"]), [m["groups"] for m in three]
    for got, want in zip(three, one):
        assert got["samples"] == want["samples"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    weights3 = read_model_state(latest_checkpoint(tmp_path / "w3"))
    weights1 = read_model_state(latest_checkpoint(tmp_path / "w1"))
    assert weights3.keys() == weights1.keys()
    for name in weights1:  # Adam's first steps: see tests/runtime/train/test_train_sharding.py
        torch.testing.assert_close(weights3[name], weights1[name], rtol=1e-5, atol=1e-4)
