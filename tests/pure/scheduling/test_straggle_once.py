"""dcp-opt asks whether a micro-batch straggles once per time matrix, not once per SP
size past a node (each ask is a pass over the step's micro-batches at every size)."""

from __future__ import annotations

import numpy as np

from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import Pipeline, layout_search, step_phases
from datacentric.shapes import SampleShape


def test_a_matrix_is_asked_once_whether_it_straggles(monkeypatch) -> None:
    asked: list[tuple[int, int]] = []  # (dcp-opt's solve of a step, sizes asked on)
    calls = [0]
    straggles, solve = layout_search.straggles, layout_search.solve_iteration

    def counted(times: np.ndarray, sizes: list[int], world: int) -> bool:
        asked.append((calls[0], len(sizes)))
        return straggles(times, sizes, world)

    def solving(*args, **kw):
        calls[0] += 1
        return solve(*args, **kw)

    monkeypatch.setattr(layout_search, "straggles", counted)
    monkeypatch.setattr(step_phases, "solve_iteration", solving)
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(8, 1.2, size=150).astype(int) + 16, 30_000)
    shapes = [SampleShape.text(int(n)) for n in lengths]
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
    pipe = Pipeline(
        shapes,
        cost,
        world_size=64,
        memory_cap_bytes=98_700_000_000,
        policy="dcp-opt",
    )
    pipe.schedule(measure=False)
    # sizes 16, 32 and 64 past a node of 8: asked once each matrix (a size appended: anew)
    assert asked and len(asked) == len(set(asked))
