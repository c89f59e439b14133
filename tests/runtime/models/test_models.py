"""Reference models: shapes, per-token locality (the sharding contract), the attention
and recomputation hooks, presets and their parameter counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from datacentric.data import StdlibCorpus, SyntheticTextDataset, SyntheticVideoDataset
from datacentric.models import (
    MODEL_PRESETS,
    DiTConfig,
    LlamaConfig,
    build_model,
    list_models,
    model_facts,
    varlen_attention,
)
from datacentric.shapes import SampleShape

TEXT_SHAPES = [SampleShape.text(n) for n in (17, 40, 5, 64, 2, 33)]
VIDEO_SHAPES = [SampleShape.video(*g) for g in ((1, 3, 4), (2, 3, 3), (3, 2, 5), (1, 1, 1))]


def model_and_data(name: str):
    torch.manual_seed(0)
    model = build_model(name)
    if model.loss_mode == "token":
        return model, SyntheticTextDataset(TEXT_SHAPES, seed=3)
    return model, SyntheticVideoDataset(VIDEO_SHAPES, seed=3)


def identity_attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal):
    """A per-token stand-in for attention (returns v): makes the whole model per-token."""
    return v_SHD


@pytest.mark.parametrize("name", ["llama", "dit"])
def test_forward_shape_dtype_and_mask(name: str) -> None:
    model, data = model_and_data(name)
    batch = data.pack([0, 1, 2], pad_to_multiple=8)
    loss = model(batch)
    assert loss.shape == (batch.num_tokens,)
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss).all()
    assert (loss[~batch.loss_mask] == 0).all()
    assert (loss[batch.loss_mask] > 0).all()


@pytest.mark.parametrize("name", ["llama", "dit"])
def test_every_parameter_gets_a_gradient(name: str) -> None:
    # No zero-initialised layer: equivalence checks compare relative gradient errors.
    model, data = model_and_data(name)
    model(data.pack([0, 1, 3], pad_to_multiple=4)).sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", ["llama", "dit"])
def test_sample_loss_independent_of_packing_and_padding(name: str) -> None:
    model, data = model_and_data(name)
    alone = {i: model(data.pack([i])) for i in (1, 2)}
    for ids, multiple in (([0, 1, 2], 1), ([2, 3, 1], 8), ([1, 0, 2, 3], 16)):
        batch = data.pack(ids, pad_to_multiple=multiple)
        loss = model(batch)
        bounds = batch.cu_seqlens.tolist()
        for i, sample_id in enumerate(ids):
            if sample_id in alone:
                got = loss[bounds[i] : bounds[i + 1]]
                torch.testing.assert_close(got, alone[sample_id], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "dit"])
def test_everything_but_attention_is_per_token(name: str) -> None:
    # With a per-token attention stand-in, any contiguous shard (global positions,
    # segment ids, per-sample conditioning) must give exactly the rows of the full batch.
    model, data = model_and_data(name)
    model.set_attention(identity_attention)
    batch = data.pack([0, 1, 2, 3], pad_to_multiple=8)
    full = model(batch)
    S = batch.num_tokens
    for parts in (2, 4):
        step = S // parts
        shards = [model(batch.slice_tokens(r * step, (r + 1) * step)) for r in range(parts)]
        torch.testing.assert_close(torch.cat(shards), full, rtol=1e-5, atol=1e-6)
    odd = model(batch.slice_tokens(3, S - 5))
    torch.testing.assert_close(odd, full[3 : S - 5], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "dit"])
def test_set_attention_reaches_every_layer(name: str) -> None:
    model, data = model_and_data(name)
    batch = data.pack([0, 1])
    reference = model(batch)
    calls: list[tuple[int, bool]] = []

    class Recording(nn.Module):  # a module callable must not become a submodule
        def forward(self, q, k, v, cu_seqlens, causal):
            calls.append((q.shape[1], causal))
            return varlen_attention(q, k, v, cu_seqlens, causal)

    model.set_attention(Recording())
    torch.testing.assert_close(model(batch), reference)
    assert len(calls) == len(model.blocks) == 8
    assert {c for c in calls} == {(model.num_heads, model.loss_mode == "token")}
    assert not any(isinstance(m, Recording) for m in model.modules())
    model.set_attention(varlen_attention)  # and back to a plain function
    torch.testing.assert_close(model(batch), reference)


class Checkpointed(nn.Module):
    """Recomputation applied from outside, as the runtime does: ``block(x, *args)``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.calls = 0

    def forward(self, x, *args):
        def run(*inputs):
            self.calls += 1
            return self.block(*inputs)

        return checkpoint(run, x, *args, use_reentrant=False)


@pytest.mark.parametrize("name", ["llama", "dit"])
def test_blocks_can_be_wrapped_for_recomputation(name: str) -> None:
    model, data = model_and_data(name)
    batch = data.pack([0, 1, 2], pad_to_multiple=4)
    model(batch).sum().backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for i in (1, 4, 5):
        model.blocks[i] = Checkpointed(model.blocks[i])
    model(batch).sum().backward()
    for i in (1, 4, 5):
        assert model.blocks[i].calls == 2  # forward, then recomputed in backward
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, reference[n.replace(".block.", ".")])


@pytest.mark.parametrize("name", ["llama", "dit"])
def test_forward_creates_no_tensor_on_the_default_device(name: str) -> None:
    # On the meta device any tensor made on the CPU by mistake raises: this is the
    # CPU-only stand-in for "runs on CUDA" (attention is stubbed, varlen needs values).
    _, data = model_and_data(name)
    model = build_model(name, device="meta", attention=identity_attention)
    batch = data.pack([0, 1], pad_to_multiple=4).to("meta")
    loss = model(batch)
    assert loss.is_meta and loss.shape == (batch.num_tokens,)
    loss.sum().backward()


def test_low_precision_weights_still_give_float32_loss() -> None:
    torch.manual_seed(0)
    model = build_model("llama", dtype=torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16
    loss = model(SyntheticTextDataset(TEXT_SHAPES).pack([0, 1]))
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()


def test_llama_learns_the_stdlib_corpus_a_little() -> None:
    torch.manual_seed(0)
    model = build_model("llama", num_layers=2)
    corpus = StdlibCorpus(max_tokens=64, limit=3)
    batch = corpus.pack(range(6))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = model(batch).sum() / batch.loss_mask.sum()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.8 * losses[0]


def test_model_input_errors_are_clear() -> None:
    torch.manual_seed(0)
    dit = build_model("dit")
    video = SyntheticVideoDataset(VIDEO_SHAPES).pack([0])

    with pytest.raises(ValueError, match="sample_cond"):
        dit(dataclasses.replace(video, sample_cond=None))
    with pytest.raises(ValueError, match=r"\(S, 16\)"):
        dit(dataclasses.replace(video, inputs=video.inputs[:, :8]))
    text = SyntheticTextDataset(TEXT_SHAPES).pack([0])
    with pytest.raises(ValueError, match="token ids"):
        build_model("llama")(dataclasses.replace(text, inputs=video.inputs[:17]))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="not divisible by num_heads 3"):
        LlamaConfig(hidden_size=64, num_layers=2, num_heads=3, ffn_hidden_size=128)
    with pytest.raises(ValueError, match="too small for 3D rotary"):
        DiTConfig(hidden_size=16, num_layers=2, num_heads=4, ffn_hidden_size=32)


def test_presets_and_overrides() -> None:
    assert list_models() == ["llama", "llama-7b", "llama-13b", "dit", "dit3d-1b"]
    for name in ("llama", "dit"):
        facts = model_facts(name)
        assert facts.num_layers >= 8  # dual-layer profile validation needs >= 8 blocks
        for sp in (1, 2, 4):
            assert facts.num_heads % sp == 0
        assert facts.num_params < 5e6  # CPU-sized
    model = build_model("llama", num_layers=2, hidden_size=64)
    assert len(model.blocks) == 2 and model.config.hidden_size == 64
    with pytest.raises(TypeError, match="no field"):
        build_model("llama", depth=3)
    with pytest.raises(KeyError, match="unknown model 'gpt'"):
        build_model("gpt")


@pytest.mark.parametrize(
    ("name", "params", "layers", "heads"),
    [
        ("llama-7b", 6.74e9, 32, 32),
        ("llama-13b", 13.02e9, 40, 40),
        ("dit3d-1b", 1.20e9, 28, 24),
    ],
)
def test_realistic_presets_on_meta_device(name: str, params: float, layers: int, heads: int):
    facts = model_facts(name)
    assert facts.num_params == pytest.approx(params, rel=0.01)
    assert (facts.num_layers, facts.num_heads) == (layers, heads)
    model = build_model(name, device="meta")
    assert next(model.parameters()).is_meta
    assert facts.params_per_block * layers < facts.num_params
    expected_mode = "token" if isinstance(MODEL_PRESETS[name].config, LlamaConfig) else "sample"
    assert model.loss_mode == expected_mode


def test_model_facts_match_configs() -> None:
    facts = model_facts("llama-7b")
    assert (facts.hidden_size, facts.ffn_hidden_size, facts.vocab_size) == (4096, 11008, 32000)
    assert (facts.kind, facts.loss_mode, facts.causal, facts.ffn_matrices) == (
        "llama",
        "token",
        True,
        3,
    )
    dit = model_facts("dit")
    assert (dit.kind, dit.loss_mode, dit.causal, dit.vocab_size, dit.in_channels) == (
        "dit",
        "sample",
        False,
        0,
        16,
    )
