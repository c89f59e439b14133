"""FSDP2 on the generic diffusers path: micro-batches of mixed clip shapes on some ranks.

The generic path runs the diffusers model's own ``forward`` once per clip shape of a
micro-batch, so a block runs as many times as its micro-batch has shapes. FSDP2
communicates in each call's backward hook; a step where one rank's micro-batch holds two
shapes and another's one used to deadlock in the reduce-scatter. Now the reduction of
such a model is issued once per unit after the last micro-batch (``parallel.grad_sync``).
Each step runs under the default sharding (FSDP2) with a launcher timeout, so a
deadlock fails the test, and every gradient is compared with the unmodified diffusers
model's own ``forward`` on each clip alone (``verify.reference``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")


from datacentric.schedule import Assignment, Iteration, MicroBatch  # noqa: E402
from datacentric.shapes import bucket_name  # noqa: E402
from datacentric.verify.case_models import build_case  # noqa: E402
from datacentric.verify.equivalence import (  # noqa: E402
    TOLERANCE,
    relative_errors,
    run_distributed,
    run_reference,
)

# the repository (ranks import this module too, without tests/ on their path)
ROOT = Path(__file__).resolve().parents[3]

MODEL = "diffusers:wan"
SMALL = {"num_layers": 2}
"""Two blocks: each still runs once per clip shape (fewer make the spawned ranks faster)."""
#: the case dataset's first clips: (frames, rows, columns) of latent patches
#: (1, 4, 6), (2, 4, 4), (3, 4, 6), (1, 8, 8), (4, 4, 6), (2, 6, 8), (5, 4, 4), ...


def iteration_of(groups: list[tuple[int, list[list[int]]]]) -> Iteration:
    """An iteration from ``(sp_size, micro-batches)`` per group, in rank order."""
    _, dataset = build_case(MODEL, 0, torch.float32)
    shapes = dataset.shapes()
    assignments, rank = [], 0
    for sp, batches in groups:
        micro_batches = tuple(
            MicroBatch(
                sample_ids=tuple(ids),
                bucket=bucket_name(max((shapes[i] for i in ids), key=lambda s: s.tokens)),
                tokens=sum(shapes[i].tokens for i in ids),
            )
            for ids in batches
        )
        assignments.append(Assignment(rank, sp, micro_batches))
        rank += sp
    return Iteration(index=0, assignments=tuple(assignments))


CASES = {
    # rank 0: two clips of different shapes in one micro-batch; rank 1: one clip
    "world-2": (2, [(1, [[0, 1]]), (1, [[2]])]),
    # an SP group of 2 on two shapes; a rank with a one-shape then a two-shape
    # micro-batch; a rank with one clip
    "world-4": (4, [(2, [[3, 1]]), (1, [[2], [4, 5]]), (1, [[6]])]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_mixed_clip_shapes_per_rank_under_fsdp2_equal_the_models_own_forward(case: str) -> None:
    world, groups = CASES[case]
    iteration = iteration_of(groups)
    iteration.validate(world)
    (result,) = run_distributed(
        [(MODEL, iteration)], world, wrapper="fsdp2", timeout_s=240, model_args=SMALL
    )
    reference = run_reference(MODEL, iteration, model_args=SMALL)
    errors = relative_errors(result.grads, reference.grads)
    assert result.ranks_agree
    assert max(errors.values()) <= TOLERANCE, sorted(errors.items(), key=lambda e: -e[1])[:3]
    torch.testing.assert_close(
        torch.tensor(result.loss), torch.tensor(reference.loss), rtol=1e-6, atol=0.0
    )


def undeclared_wan_case():  # noqa: ANN201
    """``diffusers:wan`` without its ``block_calls_vary`` declaration (a factory case)."""
    model, dataset = build_case(MODEL, 0, torch.float32, SMALL)
    model.block_calls_vary = False
    return model, dataset


@pytest.mark.slow
def test_a_block_run_twice_without_the_declaration_is_named_not_a_hang(monkeypatch) -> None:  # noqa: ANN001

    monkeypatch.syspath_prepend(str(ROOT))
    world, groups = CASES["world-2"]
    case = "tests.runtime.parallel.test_fsdp2_mixed_shapes:undeclared_wan_case"
    with pytest.raises(RuntimeError, match="block 0 of DiffusersVideoTransformer ran 2 times"):
        run_distributed([(case, iteration_of(groups))], world, wrapper="fsdp2", timeout_s=240)


def test_reshard_after_forward_is_refused_for_per_shape_block_calls_before_ranks() -> None:
    """FSDP2's ``reshard_after_forward`` gathers a block on each of its calls: refused
    (collective-free, as ``train`` checks it before ranks start) for the generic path,
    allowed for a model whose blocks run once per forward."""
    from datacentric.models.presets import build_model
    from datacentric.parallel.grad_sync import check_fsdp2

    model, _ = build_case(MODEL, 0, torch.float32, SMALL)
    with pytest.raises(ValueError, match="reshard_after_forward: DiffusersVideoTransformer"):
        check_fsdp2(model, True)
    check_fsdp2(model, False)
    check_fsdp2(build_model("llama"), True)
