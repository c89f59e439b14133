"""Mixed micro-batches for ``dcp-opt``: short samples riding in a long one's free memory.

Every pass pays fixed costs (block and operator launches, collective latencies, weight
traffic: about 0.07 s per llama-7b pass on one H200), so a step's short samples, packed
in micro-batches of their own, pay them once per micro-batch. A long sample that runs
alone, or a few of them, without recomputation often leaves memory free: filled with
short samples, the pass's fixed costs are shared and the short samples' own
micro-batches disappear (384 documents of 6,000 tokens and 9,984 of 128 at 8 GPUs: each
6,000 alone with 26 of 128 riding is the hand schedule, at the proved bound).

Per step, for each text bucket whose representative is at least :data:`RIDER_RATIO`
times the step's shortest text bucket's (the riders), :func:`host_plan` prices every
way to host riders on the representatives by the cost model: each SP size within a
node and option of the bucket, ``n`` hosts per micro-batch (1, 2, 3, 4, 6, ... up to
the option's largest), as many riders as the plan's memory cap leaves room for
(``pass_memory_bytes`` on the actual mix), and keeps the one with the fewest
GPU-seconds per host once the riders' own cost (their bucket's cheapest GPU-seconds per
sample) is taken off. Where that is at least :data:`RIDE_GAIN` below the bucket's own
cheapest, :func:`with_riders` forms the step's hosts with riders; everything else is
packed as before. Each mixed micro-batch is checked against the cap on its actual
samples (riders are dropped until it fits) and priced by the cost model on its actual
shapes wherever it runs (:meth:`OptionTable.item_option`). The work is bounded: one plan
per (host bucket, rider bucket) and epoch, memoised, and one memory check per mixed
micro-batch formed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datacentric.planning.bucket_options import BucketOption, safe_time
from datacentric.planning.cost_model import split_breakdown, split_memory_bytes
from datacentric.planning.planner import batch_ladder
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import make_item
from datacentric.scheduling.option_table import OptionTable
from datacentric.shapes import SampleShape

#: A bucket hosts riders only when its representative is at least this many times the
#: riders' (shorter riders fill the gaps a long sample leaves; near lengths pack as well
#: by themselves).
RIDER_RATIO = 8
#: Hosts with riders are formed only when they save at least this share of the host
#: bucket's own cheapest GPU-seconds per sample.
RIDE_GAIN = 0.005


@dataclass(frozen=True)
class HostPlan:
    """How a bucket's samples host riders: ``hosts`` samples per micro-batch on
    ``option`` (its SP size, recomputation and split), with ``riders`` riders of the
    rider bucket's representative; ``gpu_s`` is the GPU-seconds per host sample once
    the riders' own cost is taken off, ``saving`` how much below the bucket's own."""

    option: BucketOption
    hosts: int
    riders: int
    gpu_s: float
    saving: float


def max_riders(
    table: OptionTable, host: list[SampleShape], rider: SampleShape, option: BucketOption
) -> int:
    """Most copies of ``rider`` that ride with ``host`` (shapes) under the plan's cap on
    ``option``'s SP size, recomputation and split: galloping then bisecting on the cost
    model's memory (it grows with every rider), from the count its first rider's bytes
    extrapolate to (exact where memory is linear in the riders: two checks)."""

    cost, sp, rc, ring = table.cost_model, option.sp_size, option.recompute, option.ring_size

    def memory(k: int) -> int:
        return split_memory_bytes(cost, host + [rider] * k, sp, rc, ring)

    def fits(k: int) -> bool:
        return memory(k) <= table.cap

    alone, one = memory(0), memory(1)
    if one > table.cap:
        return 0
    guess = 1 + int((table.cap - one) // max(one - alone, 1))
    if fits(guess):
        good, bad = guess, guess + 1
        while fits(bad):
            good, bad = bad, bad + 2 * (bad - good)
    else:
        good, bad = 1, guess
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def host_plan(table: OptionTable, host_bucket: int, rider_bucket: int) -> HostPlan | None:
    """The cheapest way for ``host_bucket``'s representative to host riders of
    ``rider_bucket``'s (see the module doc), or None where no way beats the bucket's
    own cheapest option by :data:`RIDE_GAIN`. Memoised on the table.

    Each way is first estimated from short passes (``n`` hosts, then one rider more:
    the riders that memory leaves room for and their seconds extrapolated linearly,
    which never prices them below their first, as GEMMs only saturate more); the best
    estimate is then checked on the whole mix (:func:`max_riders`, its time)."""
    memo: dict[tuple[int, int], HostPlan | None] = table.__dict__.setdefault("_host_plans", {})
    key = (host_bucket, rider_bucket)
    if key not in memo:
        memo[key] = _host_plan(table, host_bucket, rider_bucket)
    return memo[key]


def _host_plan(table: OptionTable, host_bucket: int, rider_bucket: int) -> HostPlan | None:
    """:func:`host_plan`, not memoised."""
    view, cost = table.view, table.cost_model
    host_shape = view.buckets[host_bucket].shape
    rider_shape = view.buckets[rider_bucket].shape
    own = table.preferred(host_bucket).gpu_seconds_per_sample
    rider_cost = table.preferred(rider_bucket).gpu_seconds_per_sample
    best: tuple[float, BucketOption, int] | None = None
    for sp in table.node_sizes:
        for option in table.options_at(host_bucket, sp):
            rc, ring = option.recompute, option.ring_size
            for n in batch_ladder(option.max_batch):
                alone = split_breakdown(cost, [host_shape] * n, sp, rc, ring)
                one = split_breakdown(cost, [host_shape] * n + [rider_shape], sp, rc, ring)
                if one.memory_bytes > table.cap:
                    break  # more hosts leave even less room
                k = 1 + int(
                    (table.cap - one.memory_bytes) // max(one.memory_bytes - alone.memory_bytes, 1)
                )
                seconds = one.time_s + (k - 1) * (one.time_s - alone.time_s)
                estimate = (sp * seconds - k * rider_cost) / n
                if best is None or estimate < best[0]:
                    best = (estimate, option, n)
    if best is None:
        return None
    _, option, n = best
    host = [host_shape] * n
    k = max_riders(table, host, rider_shape, option)
    if k == 0:
        return None
    seconds = safe_time(
        cost, host + [rider_shape] * k, option.sp_size, option.recompute, option.ring_size
    )
    gpu_s = (option.sp_size * seconds - k * rider_cost) / n
    if own - gpu_s < RIDE_GAIN * own:
        return None
    return HostPlan(option, n, k, gpu_s, own - gpu_s)


def with_riders(
    table: OptionTable,
    by_bucket: dict[int, np.ndarray],
    pack_rest: Callable[[int, np.ndarray], list[Item]],
    min_saving: float = 0.0,
) -> list[Item]:
    """A step's micro-batches: its samples (``by_bucket``: ids per bucket) in hosts
    with riders where a :func:`host_plan` pays, the rest packed by ``pack_rest(bucket,
    ids)`` as the step packs without riders. Hosts are formed longest first from the
    buckets that save the most per rider token, while riders are left."""
    view = table.view
    text = [b for b in by_bucket if view.shapes[int(by_bucket[b][0])].grid is None]
    if len(text) < 2:
        return [item for b, ids in by_bucket.items() for item in pack_rest(b, ids)]
    rider_bucket = min(text, key=view.rep_tokens)
    floor = RIDER_RATIO * view.rep_tokens(rider_bucket)
    plans = {
        b: plan
        for b in text
        if view.rep_tokens(b) >= floor and (plan := host_plan(table, b, rider_bucket)) is not None
    }
    if not plans:
        return [item for b, ids in by_bucket.items() for item in pack_rest(b, ids)]
    rider_ids = by_bucket[rider_bucket]
    pool = rider_ids[np.argsort(view.tokens[rider_ids], kind="stable")].tolist()  # shortest first
    rider_tokens = view.rep_tokens(rider_bucket)
    items: list[Item] = []
    rest = dict(by_bucket)
    saving = 0.0

    def gain_per_rider(b: int) -> float:
        return plans[b].saving * plans[b].hosts / plans[b].riders

    for b in sorted(plans, key=gain_per_rider, reverse=True):
        plan, ids = plans[b], by_bucket[b]
        ids = ids[np.argsort(-view.tokens[ids], kind="stable")].tolist()
        at = 0
        while at < len(ids) and pool:
            host = ids[at : at + plan.hosts]
            room = plan.riders * rider_tokens + plan.hosts * view.rep_tokens(b)
            room -= int(view.tokens[host].sum())
            riders = take_riders(pool, view.tokens, room)
            items.append(fit_host(table, plan.option, host, riders, pool))
            saving += plan.saving * len(host)
            at += plan.hosts
        rest[b] = np.asarray(ids[at:], dtype=np.int64)
    if saving < min_saving:  # too little to pay for the coarser grain and the search
        return [item for b, ids in by_bucket.items() for item in pack_rest(b, ids)]
    rest[rider_bucket] = np.asarray(pool, dtype=np.int64)
    for b, ids in rest.items():
        if len(ids):
            items += pack_rest(b, ids)
    return items


def take_riders(pool: list[int], tokens: np.ndarray, room: int) -> list[int]:
    """Riders off the end of ``pool`` (the longest left) while their tokens fit in
    ``room``; at least one."""
    riders = [pool.pop()]
    used = int(tokens[riders[0]])
    while pool and used + int(tokens[pool[-1]]) <= room:
        riders.append(pool.pop())
        used += int(tokens[riders[-1]])
    return riders


def fit_host(
    table: OptionTable, option: BucketOption, host: list[int], riders: list[int], pool: list[int]
) -> Item:
    """The mixed micro-batch of ``host`` and ``riders``, riders given back to ``pool``
    (shortest last) until it fits the plan's cap on ``option``'s SP size, recomputation
    and split."""
    while riders and not table.fits(
        host + riders, option.sp_size, option.recompute, option.ring_size
    ):
        drop = max(1, len(riders) // 8)
        pool.extend(reversed(riders[-drop:]))
        riders = riders[:-drop]
    return make_item(table, host + riders)
