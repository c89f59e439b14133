"""A step whose loss is finite but whose gradient is not is refused, not applied."""

from __future__ import annotations

import pytest
from run_config import small_config

from datacentric.parallel.groups import ProcessGroups
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint
from datacentric.train.trainer import NonFiniteLossError, train_rank


def test_a_gradient_that_is_not_finite_is_not_applied(tmp_path):
    """A finite loss whose gradient is not (``0 * inf`` in the backward pass) was applied:
    clipping scaled every gradient by NaN, the step made every weight NaN, the checkpoint
    after it saved them, and the next step's NaN loss called that checkpoint intact. The
    step is now refused before the optimizer steps, naming it and its samples."""
    config = small_config(
        tmp_path / "run", model="tests.user_models:nan_grad_gpt", iterations=2, checkpoint_every=1
    )
    with pytest.raises(NonFiniteLossError) as err:
        train_rank(config, ProcessGroups.local())
    line = str(err.value)
    assert line.startswith("iteration 0 (epoch 0): the gradient's norm is nan"), line
    assert "samples [" in line and "was not applied" in line, line
    assert latest_checkpoint(config.job.out) is None  # nothing saved of a step not applied
