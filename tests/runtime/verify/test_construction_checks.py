"""What DataCentric checks and derives when it is built: a cost model from the model's
own config, SP sizes the heads allow, and the packing contract."""

from __future__ import annotations

import pytest
import torch
from wrong_positions import LocalPositions

from datacentric import DataCentric
from datacentric.data import StdlibCorpus
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.planning.memory_cap import device_memory_of, resolve_memory_cap
from datacentric.profiling.factory import analytic_cost_model, get_model_spec
from datacentric.scheduling.pipeline import Pipeline
from datacentric.train.data_centric import ulysses_sp_sizes
from datacentric.verify.model_contract import ModelContractError

pytestmark = pytest.mark.usefixtures("one_thread")


def corpus() -> StdlibCorpus:
    return StdlibCorpus(max_tokens=96, limit=6)


def test_hf_model_without_preset_gets_a_cost_model_from_its_config() -> None:
    pytest.importorskip("transformers")
    from datacentric.models.hf import build_hf_model

    torch.manual_seed(0)
    model = build_hf_model("qwen2")
    dc = DataCentric(model, corpus(), groups=ProcessGroups.local(), tokens_per_iteration=512)
    spec = dc.pipeline.cost_model.spec
    assert (spec.heads, spec.kv_heads, spec.num_blocks) == (4, 2, 4)
    step = next(dc.steps(iterations=1))
    for micro in step:
        micro.backward(model(micro.batch))
    assert torch.isfinite(torch.tensor(step.finish()))
    dc.close()


def test_a_model_the_library_cannot_price_is_named() -> None:
    class Plain(torch.nn.Module):
        num_heads = 4

    with pytest.raises(ValueError, match="'Plain': cannot read its cost without .blocks"):
        DataCentric(Plain(), corpus(), groups=ProcessGroups.local())


def test_sp_sizes_follow_the_heads() -> None:
    six = build_model("llama", num_heads=6, hidden_size=96)
    assert ulysses_sp_sizes(six, 8) == [1, 2]
    assert ulysses_sp_sizes(build_model("llama"), 8) == [1, 2, 4]
    cost = analytic_cost_model(get_model_spec("llama"), "h200-sxm")
    shapes = StdlibCorpus(max_tokens=8192, limit=40).shapes()

    def planned(**kwargs) -> set[tuple[int, int]]:  # noqa: ANN003
        budget = resolve_memory_cap(None, device_memory_of(cost))
        plan = Pipeline(shapes, cost, world_size=8, memory_cap_bytes=budget, **kwargs).plan
        return {(o.sp_size, o.ring_size) for b in plan.buckets.values() for o in b.options}

    def planned_sizes(**kwargs) -> set[int]:  # noqa: ANN003
        return {sp for sp, _ in planned(**kwargs)}

    # unrestricted, the plan would use SP 4 with Ulysses, SP 2 with Ulysses or as a ring
    # inside the node, and SP 8 (past the 4 heads) only with a ring (Ulysses over 4 inside a
    # ring of 2)
    assert planned() == {(1, 1), (2, 1), (2, 2), (4, 1), (8, 2)}
    assert planned_sizes(sp_sizes=ulysses_sp_sizes(six, 8)) == {1, 2}


def test_wrong_positions_are_refused_at_construction() -> None:
    torch.manual_seed(0)
    model = LocalPositions(build_model("llama"))
    with pytest.raises(ModelContractError, match="computes positions itself"):
        DataCentric(model, corpus(), preset="llama", groups=ProcessGroups.local())
