"""The start-up check catches the two silent mistakes of a hand-written model."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from wrong_positions import LocalPositions

from datacentric.models.attention import varlen_attention
from datacentric.verify.case_models import build_case
from datacentric.verify.model_contract import (
    ModelContractError,
    check_model_contract,
    current_attention,
)

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
    with pytest.raises(ModelContractError, match="positions"):
        check_model_contract(LocalPositions(model), dataset)
    assert current_attention(model) is varlen_attention


def test_attention_across_samples_is_caught() -> None:
    model, dataset = build_case("llama", 0, torch.float32)

    def whole_sequence(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, *, window=None):  # noqa: ANN001
        one = torch.tensor([0, q_SHD.shape[0]])
        return varlen_attention(q_SHD, k_SHD, v_SHD, one, causal)

    model.set_attention(whole_sequence)
    with pytest.raises(ModelContractError, match="attends across samples"):
        check_model_contract(model, dataset)


def test_a_model_without_attention_callable_is_named() -> None:
    class Opaque(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.loss_mode = "token"

        def set_attention(self, fn) -> None:  # noqa: ANN001
            pass

    with pytest.raises(ModelContractError, match="no attention callable found"):
        current_attention(Opaque())
