"""A model the user put in ``eval()`` before ``DataCentric(model, ...)`` stays so.

The start-up contract check runs its forward passes in ``eval()`` mode; afterwards each
module's own ``training`` flag is what the user set (GPT-2's dropout and PhiMoE's router
jitter stay off), so a step at world 2 equals the unmodified model in ``eval()`` on each
sample alone.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from datacentric.parallel.groups import ProcessGroups  # noqa: E402
from datacentric.parallel.launch import spawn  # noqa: E402
from datacentric.parallel.step import run_step  # noqa: E402
from datacentric.schedule import Iteration  # noqa: E402
from datacentric.train.data_centric import DataCentric  # noqa: E402
from datacentric.verify.case_models import build_case  # noqa: E402
from datacentric.verify.equivalence import (  # noqa: E402
    StepResult,
    assert_gradients_close,
    mixed_iteration,
    run_reference,
)
from datacentric.verify.model_contract import check_model_contract  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SEED = 0
#: GPT-2 with dropout everywhere outside attention (which the packed path refuses)
GPT2_DROPOUT = {"resid_pdrop": 0.5, "embd_pdrop": 0.5, "n_layer": 2}
#: PhiMoE, small: training mode adds random jitter to the router's input and choice
PHIMOE = {
    "model_type": "phimoe",
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "input_jitter_noise": 0.5,
    "router_jitter_noise": 0.5,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_cache": False,
}


def _phimoe_folder(tmp_path) -> str:  # noqa: ANN001
    from transformers import AutoConfig

    values = dict(PHIMOE)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    folder = tmp_path / "phimoe"
    config.save_pretrained(folder)  # a config alone: random weights from the seed
    return f"hf:{folder}"


def _flags(model: torch.nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


@pytest.mark.parametrize("case", ["gpt2", "phimoe"])
def test_the_contract_check_gives_each_module_its_own_training_flag_back(
    case: str, tmp_path
) -> None:
    name, args = ("hf:gpt2", GPT2_DROPOUT) if case == "gpt2" else (_phimoe_folder(tmp_path), {})
    model, dataset = build_case(name, SEED, torch.float32, args)
    model.hf.eval()  # the user's: the transformers model in eval(), the wrapper not
    model.blocks[0].train()  # and one layer back in training, as a user may leave it
    before = _flags(model)
    assert sorted(set(before.values())) == [False, True]
    check_model_contract(model, dataset)
    assert _flags(model) == before
    model.eval()
    check_model_contract(model, dataset)
    assert not any(_flags(model).values())


def _user_worker(name: str, args: dict, iteration_json: dict) -> tuple[float, dict]:
    groups = ProcessGroups()
    model, dataset = build_case(name, SEED, torch.float32, args)
    model.eval()  # before DataCentric, as a user turns dropout off
    dc = DataCentric(model, dataset, shard="none", groups=groups, prefetch=0, seed=SEED)
    assert not any(m.training for m in dc.module.modules())
    step = run_step(dc.runtime, Iteration.from_json(iteration_json))
    grads = {n: p.grad.detach().clone() for n, p in dc.module.named_parameters()}
    return step.loss, grads


@pytest.mark.parametrize("case", ["gpt2", "phimoe"])
def test_eval_before_wrapping_is_exact_at_world_2(case: str, tmp_path) -> None:
    name, args = ("hf:gpt2", GPT2_DROPOUT) if case == "gpt2" else (_phimoe_folder(tmp_path), {})
    _, dataset = build_case(name, SEED, torch.float32, args)
    iteration = mixed_iteration(dataset.shapes(), 2, 2, SEED)
    assert [a.sp_size for a in iteration.assignments] == [2]
    results = spawn(_user_worker, 2, name, args, iteration.to_json(), timeout_s=240)
    reference = run_reference(name, iteration, seed=SEED, model_args=args)
    loss, grads = results[0]
    for param, grad in grads.items():
        assert torch.equal(grad, results[1][1][param]), param
    assert_gradients_close(StepResult(loss=loss, grads=grads), reference)
