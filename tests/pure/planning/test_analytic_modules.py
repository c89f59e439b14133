"""``datacentric.planning.analytic`` keeps every name it had before the formulas of a
pass and the pricing of a ring moved to modules beside it, and the cost model still
answers every method it had from the module that now defines it."""

from __future__ import annotations

import pytest
from moved_names import assert_given_as_defined

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.analytic_formulas import PassFormulas
from datacentric.planning.analytic_ring import RingPricing

PACKAGE = "datacentric.planning"
#: each public constant ``analytic`` held that moved, and where it lives now
HOMES = {"ATTENTION_BACKWARD_FACTOR": "analytic_formulas", "RING_KINDS": "analytic_ring"}
#: the methods of :class:`AnalyticCostModel` that moved, by the base that defines them
METHODS = {
    PassFormulas: [
        "work",
        "_work",
        "_add_blocks",
        "_alltoall",
        "_memory",
        "_loss_head_bytes",
        "pass_floor",
    ],
    RingPricing: [
        "supports_split",
        "compute_split_breakdown",
        "compute_split_memory_bytes",
        "_ring_memory",
        "_ring_chunk_bytes",
        "_ring_exposed_s",
        "_ring_backward_link_s",
        "_attention_flops_per_pass",
    ],
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_analytic_still_gives_each_name_as_its_new_home_defines_it(name):
    assert_given_as_defined(f"{PACKAGE}.analytic", f"{PACKAGE}.{HOMES[name]}", name)


@pytest.mark.parametrize("base", list(METHODS), ids=lambda base: base.__name__)
def test_the_cost_model_answers_each_moved_method_from_its_base(base):
    """No method of the cost model's own (nor of ``CachedCostModel``'s defaults, which
    come after the bases) hides a moved one."""
    for name in METHODS[base]:
        assert getattr(AnalyticCostModel, name) is vars(base)[name], name
        assert name not in vars(AnalyticCostModel), name
