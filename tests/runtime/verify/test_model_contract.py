"""The start-up check catches the two silent mistakes of a hand-written model."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from repo_paths import ROOT
from torch import nn
from user_models import tiny_gpt
from wrong_positions import LocalPositions

from datacentric.data import DataError
from datacentric.models.attention import varlen_attention
from datacentric.shapes import SampleShape
from datacentric.verify.case_models import build_case
from datacentric.verify.model_contract import (
    ATTENTION_FIX,
    ATTENTION_RULE,
    BOUNDARY_RULE,
    PACK_RULE,
    POSITION_RULE,
    ModelContractError,
    check_model_contract,
    current_attention,
)

MODELS_DOC = ROOT / "docs" / "models.md"
DATA_DOC = ROOT / "docs" / "data.md"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", ["llama", "dit", "hf:gpt2", "hf:mistral"])
def test_models_that_follow_the_contract_pass(name: str) -> None:
    model, dataset = build_case(name, 0, torch.float32)
    before = current_attention(model)
    check_model_contract(model, dataset)
    assert current_attention(model) is before  # restored
    assert model.training


@pytest.mark.parametrize("name", ["llama", "hf:llama", "hf:gpt2"])
def test_local_positions_are_caught(name: str) -> None:
    model, dataset = build_case(name, 0, torch.float32)
    with pytest.raises(ModelContractError, match="positions") as caught:
        check_model_contract(LocalPositions(model), dataset)
    # Rotary models fail the shard rule; GPT-2's learned absolute positions already the
    # packing rule. Either way the error quotes the rule of docs/models.md.
    assert (POSITION_RULE if name != "hf:gpt2" else BOUNDARY_RULE) in str(caught.value)
    assert current_attention(model) is varlen_attention


def test_attention_across_samples_is_caught() -> None:
    model, dataset = build_case("llama", 0, torch.float32)

    def whole_sequence(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, *, window=None):  # noqa: ANN001
        one = torch.tensor([0, q_SHD.shape[0]])
        return varlen_attention(q_SHD, k_SHD, v_SHD, one, causal)

    model.set_attention(whole_sequence)
    with pytest.raises(ModelContractError, match="attends across samples") as caught:
        check_model_contract(model, dataset)
    assert BOUNDARY_RULE in str(caught.value)


def test_a_model_without_attention_callable_is_named() -> None:
    class Opaque(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.loss_mode = "token"

        def set_attention(self, fn) -> None:  # noqa: ANN001
            pass

    with pytest.raises(ModelContractError, match="no attention callable found") as caught:
        current_attention(Opaque())
    assert ATTENTION_FIX in str(caught.value) and ATTENTION_RULE in str(caught.value)


class OldFormLM(nn.Module):
    """A one-layer LM written to the 0.1.0 contract ("`set_attention(fn)` routes attention
    through fn"): it stores fn as ``self.attn_fn``, not ``self.attention``."""

    loss_mode = "token"

    def __init__(self, vocab: int = 256, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.num_heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)
        self.blocks = nn.ModuleList()
        self.set_attention(varlen_attention)

    def set_attention(self, fn) -> None:  # noqa: ANN001
        self.attn_fn = fn

    def forward(self, batch) -> torch.Tensor:  # noqa: ANN001
        x_SD = self.embed(batch.inputs)
        q_SHD, k_SHD, v_SHD = self.qkv(x_SD).unflatten(1, (3, self.num_heads, -1)).unbind(1)
        o_SHD = self.attn_fn(q_SHD, k_SHD, v_SHD, batch.cu_seqlens, True)
        logits_SV = self.head(x_SD + o_SHD.flatten(1)).float()
        loss_S = F.cross_entropy(
            logits_SV, batch.targets.long(), ignore_index=-100, reduction="none"
        )
        return loss_S * batch.loss_mask


def test_the_old_set_attention_form_passes_with_a_warning_naming_the_fix() -> None:
    _, dataset = build_case("llama", 0, torch.float32)
    torch.manual_seed(0)
    model = OldFormLM()
    with pytest.warns(FutureWarning, match=re.escape(ATTENTION_FIX)) as caught:
        check_model_contract(model, dataset)
    assert "`self.attn_fn`" in str(caught[0].message)
    assert model.attn_fn is varlen_attention  # restored after the check


def test_a_set_attention_that_keeps_fn_out_of_reach_is_an_error_naming_the_fix() -> None:
    _, dataset = build_case("llama", 0, torch.float32)
    model = OldFormLM()
    model.set_attention = lambda fn: setattr(model, "attn_fn", lambda *a, **k: fn(*a, **k))
    with pytest.raises(ModelContractError, match=re.escape(ATTENTION_FIX)):
        check_model_contract(model, dataset)


class _DrawsAnew:
    """A dataset whose ``pack`` draws each sample's tokens anew on every call."""

    def __init__(self, dataset) -> None:  # noqa: ANN001
        self.dataset = dataset
        self.calls = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def shapes(self):  # noqa: ANN201
        return self.dataset.shapes()

    def pack(self, ids, pad_to_multiple=1, *, epoch=0):  # noqa: ANN001, ANN201
        self.calls += 1
        batch = self.dataset.pack(ids, pad_to_multiple)
        return replace(batch, inputs=(batch.inputs + self.calls) % 256)


class _LongerThanItsShape(_DrawsAnew):
    """A dataset whose ``shapes()`` gives every sample one token more than ``pack``."""

    def shapes(self):  # noqa: ANN201
        return [SampleShape(s.tokens + 1) for s in self.dataset.shapes()]

    def pack(self, ids, pad_to_multiple=1, *, epoch=0):  # noqa: ANN001, ANN201
        return self.dataset.pack(ids, pad_to_multiple)


class _CountsOneMore(_LongerThanItsShape):
    """A dataset whose ``loss_tokens`` counts every token, the last one too."""

    def shapes(self):  # noqa: ANN201
        return self.dataset.shapes()

    def loss_tokens(self, sample_id: int) -> int:
        return self.dataset.shapes()[sample_id].tokens


def test_a_dataset_that_breaks_the_packing_rule_is_named_not_the_model() -> None:
    """A ``pack`` that draws anew on each call once failed as a model that "attends across
    samples or ignores batch.position_ids"; it is the dataset's fault, named as such."""
    model, dataset = build_case("llama", 0, torch.float32)
    with pytest.raises(DataError, match="_DrawsAnew: sample .* gets other inputs") as caught:
        check_model_contract(model, _DrawsAnew(dataset))
    assert PACK_RULE in str(caught.value) and PACK_RULE in DATA_DOC.read_text()
    with pytest.raises(DataError, match=r"shapes\(\) gives sample \d+ \d+ tokens and pack"):
        check_model_contract(model, _LongerThanItsShape(dataset))
    # refused at construction, where the runtime found it at the first micro-batch
    with pytest.raises(DataError, match=r"_CountsOneMore: loss_tokens\(\d+\) gives \d+ and pack"):
        check_model_contract(model, _CountsOneMore(dataset))


class _BatchCentred(nn.Module):
    """A model that normalizes its embeddings over the batch's tokens (a batch norm):
    samples mixed outside attention."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.blocks, self.num_heads, self.loss_mode = model.blocks, model.num_heads, "token"
        self.set_attention = model.set_attention

    def forward(self, batch):  # noqa: ANN001, ANN201
        hook = self.model.embed.register_forward_hook(
            lambda m, i, out: (out - out.mean(0)) / out.std(0)
        )
        try:
            return self.model(batch)
        finally:
            hook.remove()


def test_a_model_that_mixes_samples_outside_attention_is_told_so() -> None:
    """Both rules' errors name a norm over the batch's tokens (they named attention across
    samples and positions only): the boundary rule's where the losses show it (a model of
    one's own), the shard rule's where they barely move (our Llama at its start)."""
    _, dataset = build_case("llama", 0, torch.float32)
    torch.manual_seed(0)
    with pytest.raises(ModelContractError, match="mixes them otherwise .a norm or mean") as caught:
        check_model_contract(_BatchCentred(tiny_gpt()), dataset)
    assert BOUNDARY_RULE in str(caught.value)
    model = build_case("llama", 0, torch.float32)[0]
    with pytest.raises(ModelContractError, match="or mixes tokens outside attention .a norm"):
        check_model_contract(_BatchCentred(model), dataset)


def test_docs_state_every_rule_the_check_quotes() -> None:
    doc = MODELS_DOC.read_text()
    for rule in (ATTENTION_RULE, BOUNDARY_RULE, POSITION_RULE):
        assert f'"{rule}"' in doc, rule
    assert f"no attention callable found: {ATTENTION_FIX}" in doc
