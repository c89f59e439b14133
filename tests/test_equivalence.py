"""One data-centric step of the reference models equals one single-process step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from datacentric.cli import equivalence as equivalence_cli
from datacentric.cli.main import main
from datacentric.verify.case_models import build_case
from datacentric.verify.equivalence import (
    assert_gradients_close,
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
        model, dataset = build_case(name, 0, torch.float32)
        cases.append((name, mixed_iteration(dataset.shapes(), world, len(model.blocks))))
    _, iteration = cases[0]
    counts = [a.accumulation_steps for a in iteration.assignments]
    if world == 4:
        assert len(set(counts)) >= 2
        assert sorted({a.sp_size for a in iteration.assignments}) == [1, 2]
    else:  # world 2: one SP-2 group accumulating two micro-batches
        assert [(a.sp_size, a.accumulation_steps) for a in iteration.assignments] == [(2, 2)]

    results = run_distributed(cases, world, timeout_s=180)
    for (name, iteration), result in zip(cases, results):
        reference = run_reference(name, iteration)
        assert result.ranks_agree, f"{name}: ranks disagree on the synchronised gradients"
        for param, ref in reference.grads.items():
            assert ref.abs().sum() > 0, f"{name}: {param} has no reference gradient"
        assert_gradients_close(result, reference)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "phases"), [(2, [[1, 1], [2]]), (4, [[2, 1, 1], [1, 1, 2], [4]])]
)
def test_a_step_that_changes_its_layout_between_phases_matches_one_process(
    world: int, phases: list[list[int]]
) -> None:
    cases = []
    for name in MODELS:
        model, dataset = build_case(name, 0, torch.float32)
        shapes = dataset.shapes()
        cases.append((name, mixed_iteration(shapes, world, len(model.blocks), phases=phases)))
    iteration = cases[0][1]
    assert iteration.num_phases == len(phases)
    assert [a.sp_size for a in iteration.assignments_for_rank(world - 1)] == [
        layout[-1] for layout in phases
    ]
    results = run_distributed(cases, world, timeout_s=180)
    for (name, iteration), result in zip(cases, results):
        reference = run_reference(name, iteration)
        assert result.ranks_agree, f"{name}: ranks disagree on the synchronised gradients"
        assert_gradients_close(result, reference)


def test_mixed_iteration_covers_the_world_with_distinct_settings() -> None:
    shapes = build_case("dit", 0, torch.float32)[1].shapes()
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


@pytest.mark.slow
def test_cli_checks_a_step_in_two_phases(capsys) -> None:
    assert main(["equivalence", "--model", "dit", "--world", "2", "--phased"]) == 0
    out = capsys.readouterr().out
    assert "dit (none) at world 2, 2 phases: SP sizes [2, 1, 1]" in out
    assert "-> PASS" in out


def user_factory():  # type: ignore[no-untyped-def]
    """A user's factory (named below as ``tests.test_equivalence:...``)."""
    from datacentric.models.presets import build_model

    return build_model("llama")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["hf:mistral", "hf:gpt2", "diffusers:wan", "tests.test_equivalence:user_factory"]
)
def test_cli_checks_other_models_at_world_2_with_sp_2(name, capsys, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    assert main(["equivalence", "--model", name, "--world", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == name and report["sp_sizes"] == [2]
    assert report["accumulation_counts"] == [2] and report["passed"]
    assert report["max_rel_grad_err"] <= 1e-5


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gpt5", "no equivalence case for model 'gpt5'"),
        ("hf:nope", "unknown Hugging Face model 'nope'"),
        ("no_such_module_x:make", "cannot import 'no_such_module_x'"),
        ("json:nothing", "json has no callable 'nothing'"),
    ],
)
def test_cli_names_a_bad_model_in_one_line(name, message, capsys) -> None:
    assert main(["equivalence", "--model", name, "--world", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("datacentric equivalence: ") and message in err
    assert "\n" not in err
