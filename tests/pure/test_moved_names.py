"""Modules split by concern keep every name they had: each name that moved is importable
from its old module as the very object its new home defines, and the old module lists
(``__all__``) every public name it held and each private one imported from it before."""

from __future__ import annotations

import importlib

import pytest

DCP_OPT_MOVED = {
    "datacentric.scheduling.layout_search": [
        "NEIGHBOUR_LIMIT",
        "LAYOUT_ROUNDS",
        "PEAK_TOL",
        "SPLIT_GAP",
        "SPLIT_ROUNDS",
        "COST_ROUNDS",
        "MERGE_SHARE",
        "EXACT_IDLE",
        "lower_bound",
        "straggles",
        "cheaper_past_node",
        "preferred_class",
        "candidate_layouts",
        "one_group_per_big_item",
        "neighbour_layouts",
        "solve_iteration",
        "merge_small",
        "preference_views",
        "best_layout",
        "assign_on_layout",
        "beats",
        "idle_share",
        "refine_by_splitting",
    ],
    "datacentric.scheduling.step_phases": [
        "PHASE_GAIN",
        "TAIL_ROUNDS",
        "TAIL_GAIN",
        "solve_step",
        "node_times",
        "on_sizes",
        "two_phases",
        "tail_phase",
        "filled_phase",
        "_in_phases",
    ],
    "datacentric.scheduling.portfolio": [
        "PORTFOLIO_SAMPLES",
        "PEERS",
        "PEER_SAMPLES",
        "PEER_GAIN",
        "TokenPacked",
        "step_seconds",
        "Portfolio",
        "peers_run",
    ],
}
#: the names ``dcp_opt`` still defines itself: the policy's steps and their micro-batches
DCP_OPT_KEPT = [
    "TOKEN_PACKED_SAMPLES",
    "TOKEN_PACKED_STEP_WORK",
    "UNPACK_IDLE",
    "UNPACK_PER_RANK",
    "RIDE_CHECK",
    "RIDE_STEP_SHARE",
    "LAYOUT_PASSES",
    "make_items",
    "schedule",
    "stepwise",
    "own_step",
    "token_packed_runs",
]

#: each public name ``analytic`` held that moved out, by its new home (its private
#: helpers moved with them: nothing imported them from it)
ANALYTIC_MOVED = {
    "datacentric.planning.pass_work": [
        "Work",
        "weight_traffic_bytes",
        "attention_pairs",
        "shape_sums",
        "text_shape_sums",
    ],
    "datacentric.planning.analytic_formulas": ["ATTENTION_BACKWARD_FACTOR"],
    "datacentric.planning.analytic_ring": ["RING_KINDS"],
}
#: the public names ``analytic`` still defines: the cost model and its constants
ANALYTIC_KEPT = [
    "COMM_COLUMNS",
    "AnalyticCostModel",
    "analytic_model",
]
#: each name ``megatron_dyncp`` held that moved out, by its new home
MEGATRON_MOVED = {
    "datacentric.scheduling.megatron_groups": [
        "DELTA",
        "NoLayoutError",
        "CPGroup",
        "cp_min",
        "form_micro_batch",
        "best_place",
        "expand_once",
        "full_group",
        "megatron_micro_batches",
    ],
    "datacentric.scheduling.megatron_steps": [
        "cp_sizes",
        "cp_limits",
        "build_steps",
        "build_step",
        "one_layout",
    ],
}
#: the names ``megatron_dyncp`` still defines: the search, its caps and the policy
MEGATRON_KEPT = [
    "RECOMPUTATIONS",
    "FINALISTS",
    "default_tokens_per_rank",
    "rank_tokens",
    "cap_candidates",
    "search",
    "settings_searched",
    "Told",
    "finalists",
    "step_makers",
    "step_floors_s",
    "schedule",
]
#: each split module: (the names that moved out, by their new home; those it still defines)
SPLITS = {
    "datacentric.planning.analytic": (ANALYTIC_MOVED, ANALYTIC_KEPT),
    "datacentric.scheduling.dcp_opt": (DCP_OPT_MOVED, DCP_OPT_KEPT),
    "datacentric.scheduling.megatron_dyncp": (MEGATRON_MOVED, MEGATRON_KEPT),
}


@pytest.mark.parametrize("old", sorted(SPLITS))
def test_each_moved_name_is_the_object_its_new_home_defines(old):
    module = importlib.import_module(old)
    wrong = []
    for where, names in SPLITS[old][0].items():
        home = importlib.import_module(where)
        for name in names:
            value = getattr(home, name)
            defined_there = name.isupper() or value.__module__ == where
            if getattr(module, name, None) is not value or not defined_there:
                wrong.append(f"{where}.{name}")
    assert not wrong, f"not given by {old} as their home defines them: {wrong}"


@pytest.mark.parametrize("old", sorted(SPLITS))
def test_the_split_module_lists_every_name_it_had(old):
    module = importlib.import_module(old)
    moved, kept = SPLITS[old]
    assert sorted(module.__all__) == sorted(
        [*(n for names in moved.values() for n in names), *kept]
    )
    for name in kept:
        assert name.isupper() or getattr(module, name).__module__ == old
