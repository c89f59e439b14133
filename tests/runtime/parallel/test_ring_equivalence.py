"""Steps with ring and hybrid (Ulysses x ring) groups equal one single-process step, on a
model with fewer query heads than its SP groups have ranks."""

from __future__ import annotations

import json

import pytest
import torch

from datacentric.cli.main import main
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.verify.case_models import build_case
from datacentric.verify.equivalence import (
    assert_gradients_close,
    mixed_iteration,
    run_distributed,
    run_reference,
    with_ring,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TWO_HEADS = {"num_heads": 2}


@pytest.mark.slow
def test_one_step_mixes_ulysses_ring_and_hybrid_groups() -> None:
    """World 4, a 2-head Llama: phase 0 a ring-only group of 2 beside a Ulysses group
    of 2, phase 1 one hybrid group of 2 x 2; loss and every gradient as one process."""
    model, dataset = build_case("llama", 0, torch.float32, TWO_HEADS)
    iteration = mixed_iteration(dataset.shapes(), 4, len(model.blocks), 0, phases=[[2, 2], [4]])
    iteration = with_ring(iteration, phase=0, rank_start=0, ring_size=2)
    iteration = with_ring(iteration, phase=1, rank_start=0, ring_size=2)
    splits = {(a.phase, a.rank_start): a.splits for a in iteration.assignments}
    assert splits[(0, 0)][0] == (1, 2) and splits[(0, 2)][0] == (2, 1)
    assert splits[(1, 0)][0] == (2, 2)
    (result,) = run_distributed([("llama", iteration)], 4, model_args=TWO_HEADS)
    assert result.ranks_agree
    assert_gradients_close(result, run_reference("llama", iteration, model_args=TWO_HEADS))


@pytest.mark.slow
@pytest.mark.parametrize("split", ["1,4", "2,2"])
def test_cli_checks_a_ring_split_beyond_the_head_count(split: str, capsys) -> None:
    argv = ["equivalence", "--model", "llama", "--world", "4", "--sp-split", split]
    assert main([*argv, "--model-arg", "num_heads=2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["max_rel_grad_err"] <= 1e-5
    assert report["sp_sizes"][0] == 4
    assert report["sp_splits"][0][0] == [int(n) for n in split.split(",")]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sp-split", "3"], "--sp-split '3': give two positive integers U,R"),
        (["--sp-split", "2,3"], "makes a group of 6 ranks, which must divide --world 4"),
        (["--model-arg", "heads"], "model argument 'heads' is not KEY=VALUE (--model-arg)"),
        (["--model-arg", "num_heads=3"], "hidden_size 128 is not divisible by num_heads 3"),
        (["--model", "dit", "--model-arg", "bogus=1"], "dit takes no bogus"),
    ],
)
def test_cli_names_a_bad_split_or_model_argument_in_one_line(argv, message, capsys) -> None:
    assert main(["equivalence", "--world", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("datacentric equivalence: ") and message in err
    assert err.count("\n") == 1


def test_ring_size_travels_with_the_micro_batch_and_must_divide_the_group() -> None:
    mb = MicroBatch((0, 1), "b", 10, ring_size=4)
    assignment = Assignment(0, 4, (mb, MicroBatch((2,), "b", 5)))
    assert assignment.splits == ((1, 4), (4, 1))
    it = Iteration(0, (assignment,))
    assert Iteration.from_json(json.loads(json.dumps(it.to_json()))) == it
    assert "ring" not in MicroBatch((2,), "b", 5).to_json()  # old schedules read the same
    with pytest.raises(ValueError, match="ring size 4, which does not divide the group size"):
        Assignment(0, 2, (mb,))
