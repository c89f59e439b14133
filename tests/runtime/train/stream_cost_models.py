"""Cost models for the streamed build's tests: one that takes a lock of this module on
every price (as a cost model with a lock-guarded cache does), one that fails after a
number of prices. Both price as the model they wrap, and this module imports no torch,
so the schedule's build process loads it quickly."""

from __future__ import annotations

import threading

from datacentric.planning.cost_model import WrappedCostModel

#: The lock :class:`Locked` takes on every price.
PRICES = threading.Lock()


class Priced(WrappedCostModel):
    """The wrapped model's prices, asked of it every time (:meth:`breakdown`)."""

    same_prices = True

    def compute_breakdown(self, *args, **kwargs):
        return self.inner.breakdown(*args, **kwargs)

    def breakdown(self, *args, **kwargs):
        return self.inner.breakdown(*args, **kwargs)


class Locked(Priced):
    """The wrapped model's prices, each taken under :data:`PRICES`."""

    def breakdown(self, *args, **kwargs):
        with PRICES:
            return self.inner.breakdown(*args, **kwargs)


class FailsAfter(Priced):
    """The wrapped model's prices, ``calls`` of them, then ``ValueError``; :attr:`asked`
    counts the prices asked for."""

    def __init__(self, cost_model, calls: int) -> None:
        super().__init__(cost_model)
        self.calls, self.asked = calls, 0

    def breakdown(self, *args, **kwargs):
        self.asked += 1
        if self.asked > self.calls:
            raise ValueError(f"planted: price {self.asked} fails")
        return self.inner.breakdown(*args, **kwargs)
