"""dcp-opt's phases are solved on the rows of the time matrix their step made once."""

from __future__ import annotations

from datacentric.data.workloads import get_workload
from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import layout_search, placement, step_phases
from datacentric.scheduling.pipeline import Pipeline


def test_phases_read_the_step_s_node_times_instead_of_making_them_again(monkeypatch):
    """500 samples of opensora-long at 8 H100s: dcp-opt tries its step in phases (and
    keeps a second phase). No phase makes a time matrix on the sizes within a node but
    for the micro-batches it splits itself (new ones); before, each phase made its
    micro-batches' again (126 times in one run of opensora-balanced at 32 GPUs). The
    schedule is the one made with a matrix made again per phase."""
    wl = get_workload("opensora-long", seed=0, num_samples=500)
    cost = analytic_cost_model(wl.model, "h100-sxm", world_size=8)

    def schedule():
        pipe = Pipeline(list(wl.shapes), cost, world_size=8, memory_cap_bytes=56_000_000_000)
        return pipe.schedule(0, policy="dcp-opt", measure=False)

    inside = {"_in_phases": 0, "refine_by_splitting": 0}
    for module, name in ((step_phases, "_in_phases"), (layout_search, "refine_by_splitting")):
        monkeypatch.setattr(module, name, _counting(getattr(module, name), name, inside))
    made_again, time_matrix = [], placement.time_matrix

    def watched(table, items, sizes):
        again = inside["_in_phases"] and not inside["refine_by_splitting"]
        made_again.extend([len(items)] if again and list(sizes) == list(table.node_sizes) else [])
        return time_matrix(table, items, sizes)

    for module in (step_phases, layout_search):  # the phases' matrices and the layouts'
        monkeypatch.setattr(module, "time_matrix", watched)
    phases, in_phases = [], step_phases._in_phases
    monkeypatch.setattr(step_phases, "_in_phases", lambda *a: phases.append(a) or in_phases(*a))
    kept = schedule()
    assert phases and max(a.phase for it in kept.iterations for a in it.assignments) == 1
    assert made_again == []

    def without_node(inp, table, items, parts, k, node, *rest):
        return in_phases(inp, table, items, parts, k, None, *rest)

    monkeypatch.setattr(step_phases, "_in_phases", without_node)
    assert schedule().iterations == kept.iterations
    assert made_again  # the check sees a matrix made again


def _counting(function, name, inside):
    def counted(*args, **kwargs):
        inside[name] += 1
        try:
            return function(*args, **kwargs)
        finally:
            inside[name] -= 1

    return counted
