"""``lr_schedule = "linear"``: transformers' default, a linear decay to 0 at the horizon."""

from __future__ import annotations

import pytest
import torch

from datacentric.settings.sections import TrainingConfig
from datacentric.train.lr_schedule import lr_lambda


@pytest.mark.parametrize("warmup", [0, 3])
def test_linear_decays_as_transformers_does_after_the_warm_up(warmup: int) -> None:
    from transformers import get_linear_schedule_with_warmup

    total = 10
    factor = lr_lambda(TrainingConfig(lr_schedule="linear", warmup_iterations=warmup), total)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = get_linear_schedule_with_warmup(optimizer, warmup, total)
    for n in range(total):
        if n >= warmup:
            assert factor(n) == pytest.approx(theirs.lr_lambdas[0](n), abs=1e-12)
        else:  # ours reaches the peak at the end of the warm-up, theirs one step later
            assert factor(n) == pytest.approx((n + 1) / warmup)
    assert factor(total) == 0.0
