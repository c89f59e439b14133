"""The trainer under every ``shard`` setting at world 2: the same step as one process."""

from __future__ import annotations

import pytest
import torch
from run_config import small_config

from datacentric.parallel.launch import spawn
from datacentric.train.checkpoints.checkpoint_load import read_model_state
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.slow

SHARDS = ("none", "ddp", "fsdp2")
SETTINGS = dict(iterations=2, dataset_limit=4, lr_schedule="constant", warmup_iterations=0)


def _run(out, world: int, **overrides):
    config = small_config(out, **SETTINGS, **overrides)
    if world == 1:
        train_rank(config)
    else:
        spawn(train_rank, world, config, timeout_s=300)
    weights = read_model_state(latest_checkpoint(out))
    return read_metrics(out), weights


@pytest.fixture(scope="module")
def none_at_two(tmp_path_factory):
    """The world-2 run with ``shard = none`` both tests compare with: (metrics, weights)."""
    return _run(tmp_path_factory.mktemp("none"), 2, shard="none")


def test_every_shard_setting_steps_as_none_and_one_process(tmp_path, none_at_two):
    ref_metrics, ref_weights = none_at_two
    for shard in ("ddp", "fsdp2"):
        metrics, weights = _run(tmp_path / shard, 2, shard=shard)
        assert [m["groups"] for m in metrics] == [m["groups"] for m in ref_metrics]
        for got, want in zip(metrics, ref_metrics):
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
        assert weights.keys() == ref_weights.keys()
        for name in weights:
            torch.testing.assert_close(weights[name], ref_weights[name], rtol=1e-5, atol=1e-6)
    by_shard = {s: read_metrics(tmp_path / s)[0]["optimizer_state_bytes"] for s in SHARDS[1:]}
    by_shard["none"] = ref_metrics[0]["optimizer_state_bytes"]
    assert by_shard["ddp"] == by_shard["none"]
    assert by_shard["fsdp2"] == pytest.approx(by_shard["none"] / 2, rel=0.02)


def test_none_at_world_two_matches_one_process(tmp_path, none_at_two):
    """A whole step's samples on one process give the world-2 run's loss and weights."""
    metrics2, weights2 = none_at_two
    metrics1, weights1 = _run(tmp_path / "w1", 1)
    assert [m["samples"] for m in metrics2] == [m["samples"] for m in metrics1]
    for got, want in zip(metrics2, metrics1):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    # Adam's first steps move each weight by about lr * sign(grad): a gradient equal up to
    # summation order may still differ in the last bits of near-zero entries.
    for name in weights1:
        torch.testing.assert_close(weights2[name], weights1[name], rtol=1e-5, atol=1e-4)


def _call_inside_ddp() -> str:
    from datacentric.parallel.grad_sync import wrap_model
    from datacentric.parallel.groups import ProcessGroups
    from datacentric.planning.sharding import ShardingSpec

    module = torch.nn.Linear(2, 2)
    ddp = wrap_model(module, ProcessGroups(), ShardingSpec("ddp"))
    ddp(torch.ones(1, 2)).sum().backward()  # through the wrapper: fine
    try:
        module(torch.ones(1, 2))
    except RuntimeError as err:
        return str(err)
    return "no error"


def test_calling_the_module_inside_ddp_is_refused():
    for message in spawn(_call_inside_ddp, 2, timeout_s=120):
        assert "call the wrapper" in message
