"""What a peer of ``dcp-opt``'s portfolio could reach at best, per step: its search
runs only where it could still win a step.

Every step a policy runs of a global batch is a valid schedule of its samples, so
its makespan is at least the step's proved bound
(:func:`~datacentric.scheduling.measures.step_bound_s`: the samples' proved
GPU-seconds over the world, or the slowest sample's fastest run alone). A peer that
runs only some configurations is bounded by the same proved prices restricted to
them: ``static`` runs every sample on one SP size with one recomputation setting
(none, or every block), so each step is at least the least such bound over the
settings its search may choose (:func:`step_floors`). To the makespan a step adds
its exposed gradient sync, at least nothing where the sync overlaps the last
backward and the whole reduction where it does not. A peer whose floor on every step
is not below the best step the portfolio holds cannot give a step: its search is
skipped (``settings["peers_skipped"]``), and the result is what running it would
have given.
"""

from __future__ import annotations

import numpy as np

from datacentric.planning.proved_price import has_floor
from datacentric.scheduling.measures import overlaps_grad_sync, step_bound_s
from datacentric.scheduling.policy_input import PolicyInput
from datacentric.scheduling.static import uniform_sizes


def sync_floor_s(inp: PolicyInput) -> float:
    """The least exposed gradient sync of a step: the whole reduction where it is
    not overlapped with the last backward, else nothing."""
    world = inp.world_size
    if overlaps_grad_sync(inp.cost_model, world):
        return 0.0
    return max(0.0, float(inp.cost_model.grad_sync_time_s(world)))


def static_settings(inp: PolicyInput) -> list[tuple[str, int]]:
    """The (recomputation, SP size) pairs ``static``'s search may choose: none or
    every block, on each SP size where every active bucket fits under it."""
    out = []
    tables = {"none": inp.table("none", lambda o: not any(o.recompute)), "full": inp.full_table()}
    for name, table in tables.items():
        if all(table.options(b) for b in inp.active_buckets()):
            out += [(name, s) for s in uniform_sizes(inp, table)]
    return out


def step_floors(inp: PolicyInput, name: str, chunks: list[np.ndarray]) -> list[float] | None:
    """Per step of ``chunks``, a lower bound on the makespan plus exposed sync of any
    step the peer ``name`` could run (module doc); None where no bound is known (a
    cost model without the floor the proved price needs)."""
    table = inp.pac_table()
    if not has_floor(inp.cost_model):
        return None
    world, sync = inp.world_size, sync_floor_s(inp)
    if name != "static":
        return [step_bound_s(table, chunk, world) + sync for chunk in chunks]
    settings = static_settings(inp)
    if not settings:
        return None
    return [
        min(step_bound_s(table, c, world, sizes=[s], recompute=rc) for rc, s in settings) + sync
        for c in chunks
    ]


def could_win(floors: list[float] | None, best: list[float], gain: float) -> bool:
    """Whether a peer whose steps are at least ``floors`` could beat ``best`` (the
    portfolio's step totals) by more than the relative ``gain`` on some step."""
    if floors is None:
        return True
    return any(f < b * (1 - gain) for f, b in zip(floors, best))
