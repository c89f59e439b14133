"""Per-block recomputation: counted recomputed work, saved bytes, unchanged gradients."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from datacentric.data import SyntheticTextDataset
from datacentric.models.presets import build_model
from datacentric.parallel.recompute import BlockRecompute, compile_blocks, is_compiled
from datacentric.shapes import SampleShape

pytestmark = pytest.mark.usefixtures("one_thread")

NUM_BLOCKS = 4


def _setup():
    torch.manual_seed(0)
    model = build_model("llama", num_layers=NUM_BLOCKS)
    batch = SyntheticTextDataset([SampleShape.text(n) for n in (40, 25)]).pack([0, 1])
    calls = [0] * NUM_BLOCKS
    for i, block in enumerate(model.blocks):
        # A hook on a sub-module fires on the first forward and on the recomputation.
        block.attn.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return model, batch, calls


def _step(model, batch, recompute: BlockRecompute, setting):
    saved_bytes = 0

    def pack_hook(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved_bytes
        saved_bytes += t.numel() * t.element_size()
        return t

    model.zero_grad()
    with recompute.use(setting), torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        model(batch).sum().backward()
    return saved_bytes, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_switched_blocks_recompute_and_save_less() -> None:
    model, batch, calls = _setup()
    recompute = BlockRecompute.apply(model)
    results = {}
    for setting in [(), (True, False, True, False), (True,) * NUM_BLOCKS]:
        calls[:] = [0] * NUM_BLOCKS
        results[setting] = _step(model, batch, recompute, setting)
        expected = [2 if setting and setting[i] else 1 for i in range(NUM_BLOCKS)]
        assert calls == expected, f"recompute={setting}: forward calls per block {calls}"
    none, half, every = (results[s][0] for s in results)
    assert every < half < none, f"saved bytes: none {none}, half {half}, all {every}"
    reference = results[()][1]
    for setting, (_, grads) in results.items():
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference[name], msg=f"{setting} {name}")
    assert recompute.enabled == [False] * NUM_BLOCKS  # `use` restored the switches


def test_no_recomputation_without_grad_and_after_remove() -> None:
    model, batch, calls = _setup()
    recompute = BlockRecompute.apply(model)
    recompute.set((True,) * NUM_BLOCKS)
    with torch.no_grad():
        model(batch)
    assert calls == [1] * NUM_BLOCKS
    recompute.remove()
    calls[:] = [0] * NUM_BLOCKS
    model(batch).sum().backward()
    assert calls == [1] * NUM_BLOCKS
    assert "forward" not in model.blocks[0].__dict__
    BlockRecompute.apply(model)  # can be applied again after remove


def test_setting_length_must_match_blocks() -> None:
    model, _, _ = _setup()
    recompute = BlockRecompute.apply(model)
    with pytest.raises(ValueError, match="3 entries but the model has 4 blocks"):
        recompute.set((True, False, True))
    with pytest.raises(ValueError, match="already has switchable recomputation"):
        BlockRecompute(model.blocks)
    with pytest.raises(ValueError, match="no `blocks` attribute"):
        BlockRecompute.apply(torch.nn.Linear(2, 2))


def test_compiled_blocks_recompute_save_less_and_match_eager() -> None:
    """Blocks compiled with inductor: switching recomputation per pass costs no
    recompilation, saves less and gives the eager model's gradients."""
    model, batch, _ = _setup()
    eager = build_model("llama", num_layers=NUM_BLOCKS)
    eager.load_state_dict(model.state_dict())
    assert compile_blocks(model) == NUM_BLOCKS
    with pytest.raises(ValueError, match="block 0 is already compiled"):
        compile_blocks(model)
    recompute = BlockRecompute.apply(model)
    eager_recompute = BlockRecompute.apply(eager)
    _, reference = _step(eager, batch, eager_recompute, ())
    saved, graphs = {}, []
    for setting in [(), (True,) * NUM_BLOCKS, (True, False, True, False)]:
        saved[setting], grads = _step(model, batch, recompute, setting)
        graphs.append(counters["stats"]["unique_graphs"])
        for name, grad in grads.items():  # inductor fuses: equal up to rounding
            torch.testing.assert_close(grad, reference[name], rtol=1e-4, atol=1e-5, msg=name)
    none, every, half = saved.values()
    assert every < half < none, f"saved bytes: none {none}, half {half}, all {every}"
    assert graphs[0] > 0 and graphs[1:] == graphs[:1] * 2, f"graphs compiled: {graphs}"
    recompute.remove()  # the blocks stay compiled
    assert all(is_compiled(b) and "forward" in b.__dict__ for b in model.blocks)
    with pytest.raises(ValueError, match="already has switchable recomputation"):
        compile_blocks(eager)


def test_compilation_keeps_its_older_path() -> None:
    from datacentric.parallel import compiled, recompute

    names = ("BACKEND_ENV", "DEFAULT_BACKEND", "compile_backend", "compile_blocks", "is_compiled")
    assert all(getattr(compiled, name) is getattr(recompute, name) for name in names)
