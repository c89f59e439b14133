"""What every proved price on a configuration shares (its fixed costs and a text
sample's floor polynomials) is made once per cost model: the prices are the same."""

from __future__ import annotations

import numpy as np

from datacentric.planning.proved_price import proved_prices
from datacentric.profiling.factory import analytic_cost_model
from datacentric.shapes import SampleShape

CAP = 98_700_000_000


def test_a_second_pricing_reuses_the_configurations_and_prices_alike() -> None:
    model = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
    fresh = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
    floors = []
    floor = model.pass_floor

    def counted(*args, **kwargs):
        floors.append(1)
        return floor(*args, **kwargs)

    model.pass_floor = counted
    first = [SampleShape.text(t) for t in (900, 5_000, 70_000)]
    later = [SampleShape.text(t) for t in (1_300, 40_000)]
    proved_prices(model, first, [1, 8, 16], CAP)
    asked = len(floors)
    again = proved_prices(model, later, [1, 8, 16], CAP, "full")
    assert asked > 0 and len(floors) == asked  # nothing evaluated again
    assert np.array_equal(again, proved_prices(fresh, later, [1, 8, 16], CAP, "full"))
    assert np.array_equal(
        proved_prices(model, first, [8], CAP), proved_prices(fresh, first, [8], CAP)
    )
