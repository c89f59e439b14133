"""One data-centric step of the reference models equals one single-process step."""

from __future__ import annotations

import json

import pytest

from datacentric.cli import equivalence as equivalence_cli
from datacentric.cli.main import main
from datacentric.models.presets import build_model
from datacentric.verify.equivalence import (
    assert_gradients_close,
    equivalence_dataset,
    mixed_iteration,
    run_distributed,
    run_reference,
)

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ("llama", "dit")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_both_models_match_the_single_process_step(world: int) -> None:
    cases = []
    for name in MODELS:
        shapes = equivalence_dataset(name).shapes()
        num_blocks = len(build_model(name, device="meta").blocks)
        cases.append((name, mixed_iteration(shapes, world, num_blocks)))
    _, iteration = cases[0]
    counts = [a.accumulation_steps for a in iteration.assignments]
    assert len(set(counts)) >= 2
    if world == 4:
        assert sorted({a.sp_size for a in iteration.assignments}) == [1, 2]

    results = run_distributed(cases, world, timeout_s=180)
    for (name, iteration), result in zip(cases, results):
        reference = run_reference(name, iteration)
        assert result.ranks_agree, f"{name}: ranks disagree on the synchronised gradients"
        for param, ref in reference.grads.items():
            assert ref.abs().sum() > 0, f"{name}: {param} has no reference gradient"
        assert_gradients_close(result, reference)


def test_mixed_iteration_covers_the_world_with_distinct_settings() -> None:
    shapes = equivalence_dataset("dit").shapes()
    iteration = mixed_iteration(shapes, 8, num_blocks=4, seed=3)
    iteration.validate(8)
    assert [a.sp_size for a in iteration.assignments] == [4, 1, 1, 1, 1]
    assert [a.accumulation_steps for a in iteration.assignments] == [1, 2, 3, 4, 5]
    recomputed = {mb.num_recomputed for a in iteration.assignments for mb in a.micro_batches}
    assert recomputed == {0, 2, 4}
    ids = iteration.sample_ids()
    assert len(ids) == len(set(ids))
    # The SP group holds the longest samples.
    longest = max(shapes[i].tokens for i in ids)
    assert longest in {shapes[i].tokens for i in iteration.assignments[0].sample_ids()}


def test_cli_prints_json_and_exits_by_tolerance(monkeypatch, capsys) -> None:
    report = {"model": "dit", "world": 2, "max_rel_grad_err": 3e-5, "passed": False}
    calls = []

    def fake_check(models, world, **kwargs):
        calls.append((models, world, kwargs["tolerance"]))
        return [dict(report)]

    monkeypatch.setattr(equivalence_cli, "check_equivalence", fake_check)
    assert main(["equivalence", "--model", "dit", "--world", "2", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == report
    assert calls == [(["dit"], 2, 1e-5)]


@pytest.mark.slow
def test_cli_end_to_end(capsys) -> None:
    # World 1 keeps it cheap; worlds 2 and 4 are checked above through the same functions.
    assert main(["equivalence", "--model", "llama", "--world", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("world", "sp_sizes", "accumulation_counts", "loss_distributed", "loss_reference"):
        assert key in report
    assert report["world"] == 1 and report["sp_sizes"] == [1]
    assert report["max_rel_grad_err"] <= 1e-5
