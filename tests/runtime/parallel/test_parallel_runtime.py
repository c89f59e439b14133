"""The runtime, the launcher and the process groups; DDP and FSDP2 with unequal accumulation."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from datacentric.data import SyntheticTextDataset
from datacentric.models.presets import build_model
from datacentric.parallel.grad_sync import wrap_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import init_from_env, spawn
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import Step, run_step
from datacentric.planning.sharding import ShardingSpec
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.shapes import SampleShape
from datacentric.verify.case_models import build_case
from datacentric.verify.equivalence import (
    assert_gradients_close,
    mixed_iteration,
    run_distributed,
    run_reference,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _groups_worker() -> dict[str, object]:
    groups = ProcessGroups()
    rank = groups.rank
    assert groups.sizes == (1, 2, 4)
    assert groups.group(rank, 1) is None
    assert groups.group(0, 4) is dist.group.WORLD
    pair = groups.group(rank - rank % 2, 2)
    assert dist.get_process_group_ranks(pair) == [rank - rank % 2, rank - rank % 2 + 1]
    assignment = Assignment(rank_start=2, sp_size=2, micro_batches=(MicroBatch((0,), "b", 1),))
    assert dist.get_process_group_ranks(groups.for_assignment(assignment)) == [2, 3]
    with pytest.raises(ValueError, match="no process group for ranks 1..2"):
        groups.group(1, 2)
    total = torch.tensor([float(rank)])
    dist.all_reduce(total, group=pair)  # only the pair's two ranks take part
    return {"rank": rank, "pair_sum": float(total)}


def _failing_worker(bad_rank: int) -> int:
    if dist.get_rank() == bad_rank:
        raise ValueError("boom on purpose")
    return dist.get_rank()


def _crashing_worker() -> int:
    if dist.get_rank() == 1:
        os._exit(3)  # no exception, no result: as if killed
    return dist.get_rank()


def _hanging_worker() -> None:
    time.sleep(60)


def _naive_ddp_worker(unequal: bool) -> bool:
    """Plain DDP, one reduction per backward; rank r runs 1 + r passes if ``unequal``."""
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model("llama", num_layers=1))
    batch = SyntheticTextDataset([SampleShape.text(16)]).pack([0])
    for _ in range(1 + dist.get_rank() if unequal else 2):
        model(batch).sum().backward()
    dist.all_reduce(torch.ones(1))  # the next world collective, e.g. the loss
    return True


@pytest.mark.slow
def test_per_pass_reductions_deadlock_with_unequal_accumulation() -> None:
    """Why the runtime reduces once per iteration: the naive way hangs (or errors)."""
    assert spawn(_naive_ddp_worker, 2, False, timeout_s=60) == [True, True]  # control
    with pytest.raises((RuntimeError, TimeoutError)):
        spawn(_naive_ddp_worker, 2, True, timeout_s=6)


@pytest.mark.slow
def test_process_groups_at_world_four() -> None:
    results = spawn(_groups_worker, 4, timeout_s=60)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert [r["pair_sum"] for r in results] == [1.0, 1.0, 5.0, 5.0]


@pytest.mark.slow
def test_spawn_names_failing_and_crashed_ranks_and_times_out_on_a_hang() -> None:
    with pytest.raises(RuntimeError, match=r"rank 1 failed:(.|\n)*ValueError: boom on purpose"):
        spawn(_failing_worker, 2, 1, timeout_s=60)
    with pytest.raises(RuntimeError, match=r"rank 1 exited with code 3 without a result"):
        spawn(_crashing_worker, 2, timeout_s=60)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] did not finish within 3 s"):
        spawn(_hanging_worker, 2, timeout_s=3)
    assert time.monotonic() - start < 30


def test_local_runtime_accumulates_like_one_big_batch() -> None:
    """World 1, no torch.distributed: three micro-batches with mixed recomputation."""
    dataset = build_case("dit", 0, torch.float32)[1]
    shapes = dataset.shapes()
    mbs = tuple(
        MicroBatch(ids, "b", sum(shapes[i].tokens for i in ids), recompute=rc)
        for ids, rc in [((0, 3), (True,) * 8), ((5,), (False, True) * 4), ((1, 2), ())]
    )
    iteration = Iteration(index=0, assignments=(Assignment(0, 1, mbs),))
    torch.manual_seed(0)
    model = build_model("dit")
    runtime = DataCentricRuntime(
        model, ProcessGroups.local(), dataset.pack, loss_tokens_function(dataset)
    )
    step = run_step(runtime, iteration)
    stats = step.stats
    assert stats.accumulation_steps == 3
    assert [mb.num_recomputed for mb in stats.micro_batches] == [8, 4, 0]
    assert stats.sync_time_s == 0.0
    result_loss = step.loss
    reference = run_reference("dit", iteration)
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert_gradients_close(type(reference)(loss=result_loss, grads=grads), reference)


def test_heads_not_divisible_by_sp_fail_at_setup() -> None:
    dataset = build_case("llama", 0, torch.float32)[1]
    model = build_model("llama", num_layers=2, num_heads=4)
    args = (ProcessGroups.local(), dataset.pack, loss_tokens_function(dataset))
    with pytest.raises(ValueError, match=r"4 attention heads, not divisible by SP size 8"):
        DataCentricRuntime(model, *args, sp_sizes=[1, 2, 8])
    runtime = DataCentricRuntime(model, *args)
    mb = MicroBatch((0,), "b", 1, recompute=(True, False))
    runtime.check_schedule([Iteration(0, (Assignment(0, 1, (mb,)),))])
    with pytest.raises(ValueError, match=r"not divisible by SP size 8"):
        runtime.check_sp_sizes([8])
    bad = MicroBatch((0,), "b", 1, recompute=(True,) * 3)
    with pytest.raises(ValueError, match=r"recompute setting of 3 entries for a model of 2 blocks"):
        runtime.check_schedule([Iteration(0, (Assignment(0, 1, (bad,)),))])


def test_init_from_env_names_what_is_missing(monkeypatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"):
        init_from_env()


@pytest.mark.slow
@pytest.mark.parametrize(("wrapper", "model", "world"), [("ddp", "llama", 4), ("fsdp2", "dit", 2)])
def test_wrapped_models_with_unequal_accumulation(wrapper: str, model: str, world: int) -> None:
    """Per-pass world collectives would deadlock here; ours run once per iteration."""
    num_blocks = len(build_model(model, device="meta").blocks)
    shapes = build_case(model, 0, torch.float32)[1].shapes()
    iteration = mixed_iteration(shapes, world, num_blocks, sizes=None if world > 2 else [1, 1])
    counts = [a.accumulation_steps for a in iteration.assignments]
    assert len(set(counts)) > 1
    (result,) = run_distributed([(model, iteration)], world, wrapper=wrapper, timeout_s=120)
    assert result.ranks_agree
    assert_gradients_close(result, run_reference(model, iteration))


@pytest.mark.slow
@pytest.mark.parametrize(("wrapper", "model"), [("ddp", "llama"), ("fsdp2", "dit")])
def test_wrapped_models_on_a_step_of_several_phases(wrapper: str, model: str) -> None:
    """The group layout changes between micro-batches; the world collectives of the
    wrappers still run once, in each rank's last backward."""
    num_blocks = len(build_model(model, device="meta").blocks)
    shapes = build_case(model, 0, torch.float32)[1].shapes()
    iteration = mixed_iteration(shapes, 2, num_blocks, phases=[[2], [1, 1]])
    (result,) = run_distributed([(model, iteration)], 2, wrapper=wrapper, timeout_s=120)
    assert result.ranks_agree
    assert_gradients_close(result, run_reference(model, iteration))


def _accumulating_worker(iteration_json: dict) -> dict[str, dict[str, torch.Tensor]]:
    """Each way of holding the model, given other weights on rank 1 (a seed per rank),
    runs one iteration twice without zeroing the gradients between (a caller's own
    accumulation over steps): every gradient."""
    groups, iteration = ProcessGroups(), Iteration.from_json(iteration_json)
    out = {}
    for shard in ("none", "ddp", "fsdp2"):
        model, dataset = build_case("llama", 0, torch.float32)
        model.eval()
        if groups.rank == 1:  # rank 0's weights are the ones trained, as DDP takes them
            with torch.no_grad():
                model.embed.weight.add_(1.0)
        held = wrap_model(model, groups, ShardingSpec(shard))
        runtime = DataCentricRuntime(held, groups, dataset.pack, loss_tokens_function(dataset))
        for _ in range(2):
            run_step(runtime, iteration)
        out[shard] = _full_grads(held)
        step = Step(runtime, iteration)  # the trainer's order: the step, then zero_grad
        held.zero_grad(set_to_none=True)
        for micro in step:
            micro.backward(held(micro.batch))
        step.finish()
        out[f"{shard}, zeroed after the step was made"] = _full_grads(held)
    return out


def _full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name.removeprefix("module."): (
            p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
        )
        for name, p in model.named_parameters()
    }


@pytest.mark.slow
def test_gradients_accumulated_over_steps_add_as_in_one_process() -> None:
    """A step adds its reduced gradient to what ``.grad`` held: the sum of the steps'
    gradients, as one process accumulates them, under every way of holding the model
    (a plain module and DDP summed the held gradient over the ranks again); and every
    rank trains rank 0's weights (a plain module kept each rank's own, FSDP2 sharded a
    mix of them)."""
    num_blocks = len(build_model("llama", device="meta").blocks)
    shapes = build_case("llama", 0, torch.float32)[1].shapes()
    iteration = mixed_iteration(shapes, 2, num_blocks, sizes=[1, 1])
    reference = run_reference("llama", iteration)
    results = spawn(_accumulating_worker, 2, iteration.to_json(), timeout_s=120)[0]
    for shard, grads in results.items():
        for name, grad in grads.items():
            want = (1 if "zeroed" in shard else 2) * reference.grads[name]
            torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-6, msg=f"{shard} {name}")


def test_held_gradients_are_summed_over_three_ranks_as_they_were() -> None:
    """What each rank holds when a step starts sums over the world (the step's SUM) to
    the held gradient itself, bit for bit, on a world that is not a power of two: held
    divided by 3 on every rank summed to other values in the last bits (18% of these
    float32 elements); a frozen parameter's gradient, never reduced, stays as it was on
    every rank (it was divided by 3)."""
    from datacentric.parallel.grad_sync import share_held_gradients

    torch.manual_seed(0)
    held = torch.randn(4096) / 3
    ranks = [torch.nn.Linear(64, 64) for _ in range(3)]
    for module in ranks:
        module.weight.grad = held[: 64 * 64].reshape(64, 64).clone()
        module.bias.requires_grad_(False)
        module.bias.grad = held[:64].clone()
    for rank, module in enumerate(ranks):
        share_held_gradients(module, rank)
    summed = (ranks[0].weight.grad + ranks[1].weight.grad) + ranks[2].weight.grad
    assert torch.equal(summed, held[: 64 * 64].reshape(64, 64))
    assert all(torch.equal(module.bias.grad, held[:64]) for module in ranks)


def test_losses_and_times_are_read_from_the_device_once_per_step(monkeypatch) -> None:
    """No float read of a device value inside the micro-batch loop: one ``host_read``
    per step, at its end (on CUDA the times come from events read there too; this
    machine has no CUDA, so only the CPU path runs here)."""
    import datacentric.parallel.runtime as runtime_module

    dataset = build_case("dit", 0, torch.float32)[1]
    shapes = dataset.shapes()
    mbs = tuple(MicroBatch((i,), "b", shapes[i].tokens) for i in range(4))
    iteration = Iteration(index=0, assignments=(Assignment(0, 1, mbs),))
    model = build_model("dit")
    packing = []

    def pack(ids, multiple):  # host-side data (its random draws are not device reads)
        packing.append(True)
        try:
            return dataset.pack(ids, multiple)
        finally:
            packing.pop()

    runtime = DataCentricRuntime(model, ProcessGroups.local(), pack, loss_tokens_function(dataset))
    events: list[str] = []
    real_read = runtime_module.host_read
    monkeypatch.setattr(
        runtime_module, "host_read", lambda values: events.append("host_read") or real_read(values)
    )
    for name in ("item", "tolist", "__float__"):
        real = getattr(torch.Tensor, name)

        def spy(self, *args, _real=real, _name=name):
            if self.is_floating_point() and not packing:
                events.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(torch.Tensor, name, spy)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("synchronize"))
    stats = runtime.start_iteration(iteration)
    for micro in runtime.micro_steps(iteration, stats):
        micro.backward(model(micro.batch))
        events.append("micro-batch")
    assert events == ["micro-batch"] * 4  # nothing read inside the loop
    runtime.finish_iteration(stats)
    assert events[4:] == ["host_read", "tolist"]  # one read of every loss at the end
    assert all(mb.weighted_loss == mb.weighted_loss for mb in stats.micro_batches)  # not NaN
    assert all(mb.time_s > 0 for mb in stats.micro_batches)
