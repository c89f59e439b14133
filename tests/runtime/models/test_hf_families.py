"""Transformers families beyond the dense shape: mixture-of-experts router losses,
multi-head latent attention, and the families that are refused before ranks start.

Every model is a tiny config of a transformers config class with random weights
(nothing is downloaded). References are the unmodified model's own forward and loss
(``labels=``: cross-entropy plus, with ``output_router_logits=True``, its router
auxiliary loss), one sample at a time.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from datacentric.batch import IGNORE_INDEX  # noqa: E402
from datacentric.data import StdlibCorpus  # noqa: E402
from datacentric.models.hf import HFCausalLM, small_copy  # noqa: E402
from datacentric.models.hf_attention import UnsupportedModelFeature  # noqa: E402
from datacentric.settings import TrainConfig  # noqa: E402
from datacentric.train.build import build_dataset, check_model  # noqa: E402
from datacentric.train.data_centric import ulysses_sp_sizes  # noqa: E402
from datacentric.verify.equivalence import check_equivalence  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    vocab_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    use_cache=False,
)
ROUTER = dict(num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.5)

#: name -> (model type, config values beyond SMALL)
FAMILIES = {
    "qwen2_moe": (
        "qwen2_moe",
        dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, **ROUTER),
    ),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, moe_intermediate_size=32, **ROUTER)),
    "mixtral": ("mixtral", dict(num_local_experts=4, **ROUTER)),
    "olmoe": ("olmoe", dict(num_experts=4, **ROUTER)),
    "deepseek_v3": (  # multi-head latent attention: values 24 wide, queries/keys 16
        "deepseek_v3",
        dict(
            num_key_value_heads=4,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=24,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
    ),
    "nemotron": ("nemotron", dict()),
    "gpt_oss": (
        "gpt_oss",
        dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=16),
    ),
    "doge": ("doge", dict()),
    "minimax": ("minimax", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16)),
    "jetmoe": ("jetmoe", dict(num_local_experts=4, **ROUTER)),
}

#: families refused before ranks start, with words the one-line refusal must contain
REFUSED = {
    "nemotron": "do not pass them through",
    "gpt_oss": "s_aux",
    "doge": "attention mask of its own",
    "minimax": "linear_attention",
    "jetmoe": "output_router_logits=True",
}


def _config(name: str, **overrides):  # noqa: ANN202
    model_type, values = FAMILIES[name]
    return AutoConfig.for_model(model_type, **{**SMALL, **values, **overrides})


def _folder(tmp_path: Path, name: str, **overrides) -> str:
    folder = tmp_path / name
    _config(name, **overrides).save_pretrained(folder)
    return f"hf:{folder}"


def _dataset() -> StdlibCorpus:
    return StdlibCorpus(max_tokens=96, limit=20)


def _own_loss(hf_model, dataset: StdlibCorpus, sample_ids: list[int]) -> torch.Tensor:
    """The model's own loss (``labels=``, router loss included) on each sample alone,
    weighted by its loss tokens: the loss-token mean of the per-sample losses."""
    total, count = 0.0, 0
    for sample_id in sample_ids:
        one = dataset.pack([sample_id], 1)
        targets = torch.where(one.loss_mask, one.targets, IGNORE_INDEX)
        # transformers shifts labels by one itself: labels[t + 1] is token t's target
        labels = torch.cat([torch.tensor([IGNORE_INDEX]), targets[:-1]])
        assert targets[-1] == IGNORE_INDEX  # nothing is lost by the shift
        loss = hf_model(input_ids=one.inputs[None], labels=labels[None]).loss
        n = int(one.loss_mask.sum())
        total, count = total + loss * n, count + n
    return total / count


def _packed_and_own(name: str, **overrides) -> tuple[float, float, float]:
    """(our loss, the model's own loss, max relative gradient error) on three samples
    packed into one padded row."""
    config = _config(name, **overrides)
    torch.manual_seed(0)
    ours = HFCausalLM(AutoModelForCausalLM.from_config(copy.deepcopy(config)))
    own = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    own.load_state_dict(ours.hf.state_dict())
    dataset, ids = _dataset(), [0, 3, 5]
    batch = dataset.pack(ids, 8)
    assert batch.num_tokens > sum(dataset.shapes()[i].tokens for i in ids)  # padded
    loss = ours(batch).sum() / batch.loss_mask.sum()
    loss.backward()
    reference = _own_loss(own, dataset, ids)
    reference.backward()
    grads = dict(ours.hf.named_parameters())
    worst = 0.0
    for param_name, param in own.named_parameters():
        assert param.grad is not None and param.grad.norm() > 0, param_name
        diff = (grads[param_name].grad.double() - param.grad.double()).norm()
        worst = max(worst, float(diff / param.grad.double().norm()))
    return float(loss.detach()), float(reference.detach()), worst


@pytest.mark.parametrize("name", ["qwen2_moe", "mixtral", "qwen3_moe", "olmoe"])
def test_router_aux_loss_is_the_models_own_per_sample_loss(name: str) -> None:
    loss, reference, worst = _packed_and_own(name)
    assert abs(loss - reference) <= 1e-6 * abs(reference)
    assert worst <= 1e-5, worst
    # the router term is in the loss: without it the model's own loss is another one
    _, without, _ = _packed_and_own(name, router_aux_loss_coef=0.0)
    assert abs(without - reference) > 1e-4


def test_multi_head_latent_attention_packed_equals_the_models_own_forward() -> None:
    _, _, worst = _packed_and_own("deepseek_v3")
    assert worst <= 1e-5, worst


def test_router_loss_and_latent_attention_match_at_world_2(tmp_path: Path) -> None:
    """One step at world 2 (the MoE models in groups of one, unequal accumulation;
    DeepSeek-V3 in one Ulysses group of 2) against the unmodified models, each sample
    alone, router loss included."""
    names = [_folder(tmp_path, n) for n in ("qwen2_moe", "mixtral", "deepseek_v3")]
    reports = check_equivalence(names, 2, timeout_s=240)
    assert [r["sp_sizes"] for r in reports] == [[1, 1], [1, 1], [2]]
    assert "router auxiliary loss" in reports[0]["reference"]
    for report in reports:
        assert report["passed"] and report["max_rel_grad_err"] <= 1e-5, report


def test_router_loss_never_runs_on_a_sequence_shard(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = HFCausalLM(AutoModelForCausalLM.from_config(_config("qwen2_moe")))
    assert ulysses_sp_sizes(model, 4) == [1]
    with pytest.raises(UnsupportedModelFeature, match="sequence shard"):
        batch = _dataset().pack([0], 2)
        model(batch.slice_tokens(0, batch.num_tokens // 2))
    with pytest.raises(ValueError, match="only up to SP size 1, not 2: output_router_logits"):
        check_equivalence([_folder(tmp_path, "qwen2_moe")], 2, phased=True)


def test_per_layer_widths_are_priced_and_the_model_exact_at_world_2() -> None:
    """Gemma3n (``hf:gemma3n``: ``intermediate_size`` a list, one width per layer; shared
    key/value layers; a sparse MLP): the cost model prices it (it raised TypeError at
    ``DataCentric(...)`` and in ``train``), the pre-check passes, and a step at world 2
    (one Ulysses group, recomputation) equals the unmodified model on each sample alone."""
    from datacentric.models.hf import build_hf_model
    from datacentric.planning.spec_derivation import spec_of_model

    config = TrainConfig(model="hf:gemma3n", dataset_limit=20, max_tokens=96, cost_model="analytic")
    dataset = build_dataset(config.data, config.job.seed)
    check_model(config.model, dataset, cost=config.cost)
    assert spec_of_model(build_hf_model("gemma3n")).ffn_hidden == 128  # the widest layer's
    (report,) = check_equivalence(["hf:gemma3n"], 2, timeout_s=240)
    assert report["sp_sizes"] == [2] and report["recomputed_blocks"] == [[4, 2]], report
    assert report["passed"] and report["max_rel_grad_err"] <= 1e-5, report


def test_small_copy_keeps_every_layer_type() -> None:
    def kept(name: str, **overrides) -> int:
        config = _config(name, num_hidden_layers=6, **overrides)
        with torch.device("meta"):
            model = HFCausalLM(AutoModelForCausalLM.from_config(config))
        return len(small_copy(model).blocks)

    assert kept("mixtral") == 1
    assert kept("qwen2_moe", decoder_sparse_step=3) == 3  # dense, dense, MoE
    assert kept("deepseek_v3", first_k_dense_replace=2) == 3
    layer_types = ["sliding_attention"] * 3 + ["full_attention"] * 3
    assert kept("gpt_oss", layer_types=layer_types) == 4


@pytest.mark.parametrize("name", [*REFUSED, "deepseek_v3", "qwen2_moe"])
def test_pre_check_refuses_by_name_before_ranks_start(tmp_path: Path, name: str) -> None:
    config = TrainConfig(
        model=_folder(tmp_path, name, num_hidden_layers=4), dataset_limit=20, max_tokens=96
    )
    dataset = build_dataset(config.data, config.job.seed)
    sections = {"lora": config.lora, "parallelism": config.parallelism, "cost": config.cost}
    if name not in REFUSED:
        check_model(config.model, dataset, **sections)
        return
    with pytest.raises(ValueError) as caught:
        check_model(config.model, dataset, **sections)
    message = str(caught.value)
    assert REFUSED[name] in message and "\n" not in message, message


def test_pre_check_runs_the_recomputation_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer that does not recompute as it ran (here: it saves a tensor of another
    shape on every other call) is refused by the pre-check's small-copy step with every
    block recomputed, naming it, instead of stopping inside the ranks (as Helios's
    recomputation did, with ``CheckpointError``)."""
    from transformers.models.llama import modeling_llama

    layer = modeling_llama.LlamaDecoderLayer
    original, calls = layer.forward, []

    def unsteady(self, hidden_states, *args, **kwargs):  # noqa: ANN001, ANN202
        calls.append(1)
        rows = hidden_states.shape[1] if len(calls) % 2 else 1
        hidden_states = hidden_states + 0 * hidden_states[:, :rows].exp().sum()
        return original(self, hidden_states, *args, **kwargs)

    config = TrainConfig(model="hf:llama", dataset_limit=20, max_tokens=96)
    dataset = build_dataset(config.data, config.job.seed)
    check_model(config.model, dataset)  # the layer as transformers wrote it passes
    monkeypatch.setattr(layer, "forward", unsteady)
    with pytest.raises(ValueError, match="with its blocks recomputed") as caught:
        check_model(config.model, dataset)
    assert "CheckpointError" in str(caught.value) and "\n" not in str(caught.value)


def test_train_refuses_attention_sinks_in_one_line(tmp_path: Path, capsys) -> None:
    from datacentric.cli.main import main

    argv = ["train", "--model", _folder(tmp_path, "gpt_oss"), "--dataset-limit", "20"]
    status = main([*argv, "--max-tokens", "96", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "s_aux" in lines[0] and "Traceback" not in err, lines
