"""One driver, one launch decision, one resume state (single process)."""

from __future__ import annotations

import pytest
import torch
from run_config import small_config

from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import launch, launch_mode, process_groups
from datacentric.scheduling.resume import Position
from datacentric.settings import TrainConfig
from datacentric.train.build import (
    RunModel,
    RunPlace,
    build_dataset,
    build_model_for,
    run_cost_model,
    sharding,
)
from datacentric.train.checkpoints.checkpoint_load import weights_sha256
from datacentric.train.data_centric import DataCentric
from datacentric.train.lr_schedule import lr_lambda
from datacentric.train.sampler import RankBatchSampler
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(out, **overrides) -> TrainConfig:
    settings = dict(dataset_limit=1, iterations=3, grad_clip=0.5)
    return small_config(out, **{**settings, **overrides})


def user_dc(config: TrainConfig) -> DataCentric:
    """What a user builds for the same run as the trainer (same seed, same inputs)."""
    torch.manual_seed(config.job.seed)
    dataset = build_dataset(config.data, config.job.seed)
    model = build_model_for(config.model, dataset, lora=config.lora)
    place = RunPlace(
        torch.device("cpu"), 1, sharding(config.parallelism), config.job, shapes=dataset.shapes()
    )
    cost = run_cost_model(RunModel.of(config.model, config.lora).placed(place), config.cost)
    return DataCentric(
        model,
        dataset,
        policy=config.scheduling.policy,
        cost_model=cost,
        tokens_per_iteration=config.scheduling.tokens_per_iteration,
        seed=config.job.seed,
        groups=ProcessGroups.local(),
    )


def run_user_loop(dc: DataCentric, config: TrainConfig, optimizer, steps: int) -> list[list[int]]:
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(config.training, config.training.iterations)
    )
    ran = []
    for step in dc.steps(None, iterations=steps):
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
        torch.nn.utils.clip_grad_norm_(dc.model.parameters(), config.training.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        ran.append(step.sample_ids)
    return ran


def adamw(dc: DataCentric, config: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        dc.model.parameters(),
        lr=config.training.lr,
        betas=config.training.betas,
        weight_decay=config.training.weight_decay,
    )


def test_trainer_and_user_loop_give_identical_parameters(tmp_path):
    config = tiny_config(tmp_path / "run")
    result = train_rank(config, ProcessGroups.local())
    dc = user_dc(config)
    run_user_loop(dc, config, adamw(dc, config), config.training.iterations)
    assert result.iterations_done == dc.position.iterations_done == config.training.iterations
    assert weights_sha256(dc.model.state_dict()) == result.weights_sha256


def test_user_loop_resumes_from_state_dict(tmp_path):
    config = tiny_config(tmp_path / "run", iterations=4)
    straight = user_dc(config)
    expected = run_user_loop(straight, config, adamw(straight, config), 4)
    first = user_dc(config)
    ran = run_user_loop(first, config, adamw(first, config), 2)
    saved = first.state_dict()
    again = user_dc(config)
    again.load_state_dict(saved)
    ran += run_user_loop(again, config, adamw(again, config), 4)
    assert ran == expected
    assert again.position.iterations_done == 4
    with pytest.raises(RuntimeError, match="finish"):
        steps = again.steps(None, iterations=5)
        next(steps)
        next(steps)


def test_sampler_state_is_the_position_and_old_states_are_refused():
    from toy_cost_model import ToyCostModel, toy_pipeline

    from datacentric.shapes import SampleShape

    shapes = [SampleShape.text(n) for n in (100, 900, 3000, 50, 4000, 700, 1200, 64)]
    pipeline = toy_pipeline(shapes, ToyCostModel(), world_size=2, policy="dcp-opt", seed=1)
    schedule = pipeline.schedule()
    sampler = RankBatchSampler(schedule, rank=0)
    state = sampler.state_dict(1)
    assert Position.from_json(state) == Position.at(schedule, 1)
    with pytest.raises(ValueError, match="another version"):
        sampler.load_state_dict({"fingerprint": "x", "epoch": 0, "next_iteration": 1})


@pytest.mark.parametrize(
    ("env", "nproc", "kind", "world"),
    [
        ({}, None, "single", 1),
        ({}, 1, "single", 1),
        ({}, 3, "spawn", 3),
        ({"RANK": "1", "WORLD_SIZE": "4"}, None, "torchrun", 4),
        ({"RANK": "1", "WORLD_SIZE": "4"}, 4, "torchrun", 4),
    ],
)
def test_one_launch_decision(monkeypatch, env, nproc, kind, world):
    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    mode = launch_mode(nproc)
    assert (mode.kind, mode.world_size, mode.restarts) == (kind, world, 0)


def test_launch_conflicts_and_single_process(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert launch_mode().restarts == 1
    with pytest.raises(ValueError) as refused:
        launch_mode(4)
    assert str(refused.value) == (
        "--world 4 under torchrun (WORLD_SIZE=2): torchrun starts the ranks; drop --world "
        "(or give --world 2)"
    )
    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name)
    assert process_groups().world_size == 1
    assert launch(max, 2, 5) == {0: 5}
