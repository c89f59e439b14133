"""The plan a schedule uses when the caller gives none: the planner's, on the same
cost model (so there is one path from buckets to options). Its options recompute
no block or every block; a plan given by the caller adds the knapsack's choice."""

from __future__ import annotations

import numpy as np

from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import OPTION_BATCH_LIMIT, Plan
from datacentric.planning.planner import plan_buckets
from datacentric.scheduling.dataset_view import DatasetView


def plan_dataset(
    view: DatasetView,
    cost_model: CostModel,
    world_size: int,
    option_batch_limit: int = OPTION_BATCH_LIMIT,
) -> Plan:
    """The planner's plan of the dataset ``view`` under the cost model's capacity,
    with options up to ``option_batch_limit`` samples per micro-batch."""
    counts = np.bincount(view.bucket_of, minlength=len(view.buckets)).tolist()
    return plan_buckets(
        view.buckets,
        cost_model,
        world_size=world_size,
        sample_counts={b.name: n for b, n in zip(view.buckets, counts)},
        option_batch_limit=option_batch_limit,
        knapsack_option=False,
    )
