"""The model FLOPs behind ``mfu``: ``6 x parameters`` per token plus attention's forward
FLOPs three times (backward as twice forward), counted from the spec's widths here, not
from the cost model's own work records; the same figure whatever the plan recomputes;
read for a model that is not a preset too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from datacentric.profiling.factory import named_spec
from datacentric.shapes import SampleShape
from datacentric.train.build import build_cost_model
from datacentric.train.reporting.metrics import StepMetrics


def metrics_for(spec, shapes) -> StepMetrics:
    metrics = StepMetrics.__new__(StepMetrics)
    metrics.analytic = build_cost_model(spec, torch.device("cpu"))
    metrics.shapes = shapes
    return metrics


def step_of(*groups: tuple[int, ...], recompute=()) -> SimpleNamespace:
    mbs = tuple(SimpleNamespace(sample_ids=g, recompute=recompute) for g in groups)
    return SimpleNamespace(
        iteration=SimpleNamespace(assignments=(SimpleNamespace(micro_batches=mbs),))
    )


def test_flops_count_forward_and_backward_attention():
    spec = named_spec("llama")
    shapes = [SampleShape(100), SampleShape(300), SampleShape(37)]
    metrics = metrics_for(spec, shapes)
    flops = metrics.model_flops(step_of((0, 1), (2,)))
    tokens = 100 + 300 + 37
    causal_pairs = sum(s * (s + 1) / 2 for s in (100, 300, 37))
    attention_forward = 4.0 * spec.hidden * causal_pairs * spec.num_blocks
    expected = 6.0 * spec.num_params * tokens + 3.0 * attention_forward
    assert flops == pytest.approx(expected, rel=1e-9)


def test_a_model_that_is_not_a_preset_gets_flops():
    spec = named_spec("tests.user_models:tiny_gpt")
    metrics = metrics_for(spec, [SampleShape(64)])
    assert metrics.model_flops(step_of((0,))) > 6.0 * spec.num_params * 64
