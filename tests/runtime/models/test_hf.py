"""A Hugging Face Llama trained data-centrically equals the same model in one process.

The distributed side runs :class:`~datacentric.models.hf.HFCausalLM` (attention
routed through transformers' attention interface to Ulysses attention) under
:class:`DataCentricRuntime` on gloo ranks; the reference is the unmodified
``LlamaForCausalLM`` with transformers' own SDPA attention on the whole global
batch packed into one row (transformers finds the samples from the restarting
``position_ids``), with the mean loss over loss tokens computed here.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from datacentric.batch import IGNORE_INDEX  # noqa: E402
from datacentric.data import StdlibCorpus  # noqa: E402
from datacentric.models.attention import varlen_attention  # noqa: E402
from datacentric.models.hf import (  # noqa: E402
    HFCausalLM,
    build_hf_llama,
    build_hf_model,
)
from datacentric.models.hf_attention import (  # noqa: E402
    ATTENTION_NAME,
    UnsupportedModelFeature,
    packed_attention_forward,
)
from datacentric.models.token_metrics import loss_token_sums  # noqa: E402
from datacentric.parallel.groups import ProcessGroups  # noqa: E402
from datacentric.parallel.launch import spawn  # noqa: E402
from datacentric.parallel.loss import loss_tokens_function  # noqa: E402
from datacentric.parallel.runtime import DataCentricRuntime  # noqa: E402
from datacentric.parallel.step import run_step  # noqa: E402
from datacentric.schedule import Assignment, Iteration, MicroBatch  # noqa: E402
from datacentric.shapes import bucket_name  # noqa: E402
from datacentric.verify.equivalence import (  # noqa: E402
    StepResult,
    assert_gradients_close,
    mixed_iteration,
    relative_errors,
)

SEED = 0
NUM_LAYERS = 4
TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    """Tiny matmuls: one intra-op thread is much faster than several on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _dataset() -> StdlibCorpus:
    return StdlibCorpus(max_tokens=96, limit=20)


def _build(seed: int = SEED, name: str = "llama") -> HFCausalLM:
    torch.manual_seed(seed)
    return build_hf_model(name, num_hidden_layers=NUM_LAYERS)


def sp_iteration(world_size: int, seed: int = SEED) -> Iteration:
    """All ranks in one SP group running two micro-batches (2 samples, then 1) with
    recomputation of every block, then of every other block."""
    shapes = _dataset().shapes()
    ids = random.Random(seed + 1).sample(range(len(shapes)), 3)
    patterns = [(True,) * NUM_LAYERS, tuple(b % 2 == 0 for b in range(NUM_LAYERS))]
    micro_batches = []
    for chunk, recompute in zip((ids[:2], ids[2:]), patterns):
        micro_batches.append(
            MicroBatch(
                sample_ids=tuple(chunk),
                bucket=bucket_name(max((shapes[i] for i in chunk), key=lambda s: s.tokens)),
                tokens=sum(shapes[i].tokens for i in chunk),
                recompute=recompute,
            )
        )
    iteration = Iteration(index=0, assignments=(Assignment(0, world_size, tuple(micro_batches)),))
    iteration.validate(world_size)
    return iteration


def _hf_worker(
    iterations: list[dict], seed: int, name: str
) -> list[tuple[float, dict[str, torch.Tensor], tuple[float | None, float | None]]]:
    groups = ProcessGroups()
    dataset = _dataset()
    out = []
    for iteration_json in iterations:
        model = _build(seed, name)
        runtime = DataCentricRuntime(
            model, groups, dataset.pack, loss_tokens_function(dataset), sp_sizes=groups.sizes
        )
        runtime.token_metrics = True
        step = run_step(runtime, Iteration.from_json(iteration_json))
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        out.append((step.loss, grads, (step.token_accuracy, step.entropy)))
    return out


@torch.no_grad()
def reference_token_metrics(iteration: Iteration, seed: int = SEED, name: str = "llama"):
    """The argmax accuracy and mean entropy over the global batch's loss tokens, from
    the logits of the whole batch in one row (as TRL's metrics define them)."""
    model = _build(seed, name)
    batch = _dataset().pack(iteration.sample_ids(), 1)
    logits_SV = model.logits(batch).float()[batch.loss_mask]
    targets = batch.targets[batch.loss_mask]
    log_p = logits_SV.log_softmax(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    correct = logits_SV.argmax(-1) == targets
    return float(correct.double().mean()), float(entropy.double().mean()), int(correct.sum())


def run_reference(iteration: Iteration, seed: int = SEED, name: str = "llama") -> StepResult:
    """transformers' own SDPA attention (and its own sliding-window mask) on the global
    batch packed into one row."""
    model = _build(seed, name)
    model.hf.set_attn_implementation("sdpa")
    batch = _dataset().pack(iteration.sample_ids(), 1)
    logits_SV = model.hf(
        input_ids=batch.inputs[None], position_ids=batch.position_ids[None], use_cache=False
    ).logits[0]
    loss = F.cross_entropy(
        logits_SV.float(), batch.targets, ignore_index=IGNORE_INDEX, reduction="sum"
    ) / int(batch.loss_mask.sum())
    loss.backward()
    return StepResult(
        loss=float(loss.detach()),
        grads={n: p.grad.detach().clone() for n, p in model.named_parameters()},
    )


def _check(world: int, iterations: list[Iteration], name: str = "llama") -> float:
    payload = [it.to_json() for it in iterations]
    results = spawn(_hf_worker, world, payload, SEED, name, timeout_s=240)
    worst = 0.0
    for index, iteration in enumerate(iterations):
        reference = run_reference(iteration, name=name)
        loss, grads, (accuracy, entropy) = results[0][index]
        for rank in range(1, world):
            for param, grad in grads.items():
                assert torch.equal(grad, results[rank][index][1][param]), f"rank {rank}: {param}"
            assert results[rank][index][2] == (accuracy, entropy)  # every rank: the totals
        want_accuracy, want_entropy, _ = reference_token_metrics(iteration, name=name)
        assert accuracy == pytest.approx(want_accuracy, abs=1e-12)
        assert entropy == pytest.approx(want_entropy, rel=1e-6)
        result = StepResult(loss=loss, grads=grads)
        for param, ref in reference.grads.items():
            assert ref.abs().sum() > 0, f"{param} has no reference gradient"
        assert_gradients_close(result, reference)
        worst = max(worst, max(relative_errors(grads, reference.grads).values()))
    assert worst <= TOLERANCE
    return worst


def test_hf_llama_sp_and_accumulation_match_one_process_at_world_2() -> None:
    shapes = _dataset().shapes()
    sp = sp_iteration(2)
    mixed = mixed_iteration(shapes, 2, NUM_LAYERS, SEED, sizes=[1, 1])
    assert [a.sp_size for a in sp.assignments] == [2]
    assert [a.accumulation_steps for a in mixed.assignments] == [1, 2]
    # An odd total makes the packer pad an SP micro-batch: padding crosses the shards.
    assert any(mb.tokens % 2 for mb in sp.assignments[0].micro_batches)
    worst = _check(2, [sp, mixed])
    print(f"world 2: max relative gradient error {worst:.2e}")


def test_loss_token_sums_add_up_over_any_split() -> None:
    """Argmax hits (first index on ties), entropy (0 on a -inf logit) and loss tokens: the
    sums of any split of the tokens (shards, chunks of rows) are the whole batch's."""
    generator = torch.Generator().manual_seed(SEED)
    logits_SV = torch.randn(11, 7, generator=generator)
    targets = torch.randint(0, 7, (11,), generator=generator)
    logits_SV[:4] = 0.0
    logits_SV[:4, 2] = 1.0
    logits_SV[:4, 5] = 1.0  # a tie: the first index is the argmax
    targets[:4] = torch.tensor([2, 5, 2, 3])
    logits_SV[4, 0] = -torch.inf
    mask = torch.ones(11, dtype=torch.bool)
    mask[[3, 9]] = False
    whole = loss_token_sums(logits_SV, targets, mask)
    p = logits_SV.softmax(-1)
    entropy = -(p * p.clamp(min=1e-30).log()).sum(-1)
    hits = logits_SV.argmax(-1) == targets
    assert whole[0] == 9 and whole[1] == int(hits[mask].sum()) and whole[1] >= 2
    assert float(whole[2]) == pytest.approx(float(entropy[mask].double().sum()), rel=1e-6)
    split = loss_token_sums(logits_SV[:5], targets[:5], mask[:5], rows=2)
    split += loss_token_sums(logits_SV[5:], targets[5:], mask[5:], rows=4)
    assert torch.equal(split[:2], whole[:2])  # counts: exact
    assert float(split[2]) == pytest.approx(float(whole[2]), rel=1e-6)


def test_sliding_window_reaches_attention() -> None:
    """The window changes Mistral's loss (so the equivalence above tests it), and an
    attention callable that cannot take it fails loudly instead of dropping it."""
    batch = _dataset().pack([0, 1], 1)
    assert batch.num_tokens > 16
    losses = []
    for window in (16, None):
        model = _build(name="mistral")
        model.hf.config.sliding_window = window
        for layer in model.blocks:
            layer.self_attn.config.sliding_window = window
        losses.append(model(batch).detach())
    assert not torch.allclose(losses[0], losses[1])
    model = _build(name="mistral")

    def no_window(q_SHD, k_SHD, v_SHD, cu_seqlens, causal):  # type: ignore[no-untyped-def]
        return varlen_attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal)

    model.set_attention(no_window)
    with pytest.raises(TypeError, match="window"):
        model(batch)


@pytest.mark.parametrize(
    ("name", "overrides", "setting"),
    [
        ("llama", {"attention_dropout": 0.1}, "attention_dropout"),
        ("gpt2", {"attn_pdrop": 0.1}, "attn_pdrop"),
        ("gpt2", {"add_cross_attention": True}, "add_cross_attention"),
        ("llama", {"num_key_value_heads": 3}, "num_key_value_heads"),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic NTK"),
    ],
)
def test_unsupported_features_are_refused_at_construction(name, overrides, setting) -> None:
    with pytest.raises(UnsupportedModelFeature, match=setting):
        build_hf_model(name, **overrides)


def test_gemma2_softcap_is_refused_and_allowed_without_it() -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    values = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        sliding_window=16,
    )
    with pytest.raises(UnsupportedModelFeature, match="attn_logit_softcapping=50.0"):
        HFCausalLM(Gemma2ForCausalLM(Gemma2Config(**values, attn_logit_softcapping=50.0)))
    model = HFCausalLM(Gemma2ForCausalLM(Gemma2Config(**values, attn_logit_softcapping=None)))
    assert len(model.blocks) == 2 and model.num_kv_heads == 2


def test_adapter_contract_and_attention_routing() -> None:
    model = _build()
    assert model.hf.config._attn_implementation == ATTENTION_NAME
    assert model.num_heads == 4 and model.loss_mode == "token"
    assert len(model.blocks) == NUM_LAYERS
    calls = []

    def counting(q_SHD, k_SHD, v_SHD, cu_seqlens, causal):  # type: ignore[no-untyped-def]
        calls.append((tuple(q_SHD.shape), cu_seqlens.tolist(), causal))
        return varlen_attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal)

    model.set_attention(counting)
    batch = _dataset().pack([0, 1], 1)
    loss_S = model(batch)
    assert loss_S.shape == (batch.num_tokens,)
    assert torch.all(loss_S[~batch.loss_mask] == 0) and torch.all(loss_S[batch.loss_mask] > 0)
    assert len(calls) == NUM_LAYERS
    assert calls[0] == ((batch.num_tokens, 4, 16), batch.cu_seqlens.tolist(), True)

    class ModuleAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unused = torch.nn.Parameter(torch.ones(()))

        def forward(self, q_SHD, k_SHD, v_SHD, cu_seqlens, causal):  # type: ignore[no-untyped-def]
            return varlen_attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal)

    names = [n for n, _ in model.named_parameters()]
    model.set_attention(ModuleAttention())
    assert [n for n, _ in model.named_parameters()] == names
    torch.testing.assert_close(model(batch), loss_S)


def test_shard_positions_are_global() -> None:
    """RoPE on a shard uses the batch's global positions: with an attention that
    returns the rotated queries (per token), a shard's loss rows equal the full
    sequence's rows, and differ when the shard's positions are made local."""

    def rotated_queries(q_SHD, k_SHD, v_SHD, cu_seqlens, causal):  # type: ignore[no-untyped-def]
        return q_SHD

    model = _build()
    model.set_attention(rotated_queries)
    batch = _dataset().pack([2], 2)
    half = batch.num_tokens // 2
    full_S = model(batch).detach()
    shard = batch.slice_tokens(half, batch.num_tokens)
    torch.testing.assert_close(model(shard).detach(), full_S[half:], rtol=1e-6, atol=1e-6)
    local = replace(shard, position_ids=shard.position_ids - half)
    assert not torch.allclose(model(local).detach(), full_S[half:])


def test_gqa_and_errors() -> None:
    torch.manual_seed(1)
    gqa = build_hf_llama(num_hidden_layers=1, num_key_value_heads=2)
    batch = _dataset().pack([3], 1)
    ours = gqa(batch)
    gqa.hf.set_attn_implementation("sdpa")
    logits = gqa.hf(
        input_ids=batch.inputs[None], position_ids=batch.position_ids[None], use_cache=False
    ).logits[0]
    theirs = F.cross_entropy(
        logits.float(), batch.targets, ignore_index=IGNORE_INDEX, reduction="none"
    )
    torch.testing.assert_close(ours, theirs)
    q = torch.zeros(1, 4, 8, 16)
    with pytest.raises(ValueError, match="cu_seqlens"):
        packed_attention_forward(gqa.hf, q, q, q, None)
    with pytest.raises(ValueError, match="dropout"):
        packed_attention_forward(
            gqa.hf, q, q, q, None, dropout=0.1, cu_seqlens=torch.tensor([0, 8])
        )


SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256)

#: (model type, config values, words the refusal must contain: the real feature)
REFUSED = [
    ("bloom", dict(n_layer=2, n_head=4), "ALiBi"),
    ("mpt", dict(d_model=64, n_heads=4, n_layers=2), "ALiBi"),
    ("falcon", dict(num_attention_heads=4, alibi=True), "ALiBi"),
    ("falcon", dict(num_attention_heads=4), "not through transformers' attention interface"),
    (
        "gpt_neo",
        dict(num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]]),
        "local attention",
    ),
    (
        "gpt_neo",
        dict(num_layers=2, num_heads=4, attention_types=[[["global"], 2]]),
        "attention interface",
    ),
    ("llama4_text", dict(num_attention_heads=4), "chunked attention"),
    ("llama4_text", dict(num_attention_heads=4, attention_chunk_size=None), "temperature tuning"),
    ("gemma2", dict(num_attention_heads=4, head_dim=16), "softcapping"),
    (
        "phi3",
        dict(
            num_attention_heads=4,
            pad_token_id=0,
            original_max_position_embeddings=64,
            rope_scaling={
                "rope_type": "longrope",
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
                "original_max_position_embeddings": 64,
            },
        ),
        "LongRoPE",
    ),
    (
        "llama",
        dict(num_attention_heads=4, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        "dynamic NTK",
    ),
]


def test_every_unsupported_model_is_refused_at_construction_naming_its_feature() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    for model_type, values, feature in REFUSED:
        config = AutoConfig.for_model(model_type, **{**SMALL, **values})
        with pytest.raises(UnsupportedModelFeature) as caught:
            HFCausalLM(AutoModelForCausalLM.from_config(config))
        message = str(caught.value)
        assert feature in message and "\n" not in message, (model_type, message)
    # position-local rotary scalings are accepted
    for rope in (
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "llama3",
            "factor": 2.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ):
        build_hf_llama(num_hidden_layers=1, max_position_embeddings=128, rope_scaling=rope)


def test_dropout_outside_attention_runs_in_training_and_is_off_in_eval() -> None:
    """GPT-2's residual and embedding dropout run as the model defines them (the
    masks come from the torch random stream); ``eval()`` turns them off."""
    torch.manual_seed(0)
    model = build_hf_model("gpt2", resid_pdrop=0.5, embd_pdrop=0.5)
    batch = _dataset().pack([0], 1)
    first, second = model(batch).detach(), model(batch).detach()
    assert not torch.allclose(first, second)
    model.eval()
    torch.testing.assert_close(model(batch), model(batch))


def test_allowed_sp_sizes_repeat_key_value_heads_as_far_as_a_group_needs() -> None:
    from datacentric.planning.heads import allowed_sp_sizes, check_sp_sizes, kv_head_repeat

    assert allowed_sp_sizes(4, 2) == [1, 2, 4]
    assert allowed_sp_sizes(32, 8) == [1, 2, 4, 8, 16, 32]
    assert [kv_head_repeat(4, 2, sp) for sp in (1, 2, 4)] == [1, 1, 2]
    assert kv_head_repeat(32, 8, 16) == 2 and kv_head_repeat(12, 4, 6) == 3
    check_sp_sizes(4, 2, [1, 2, 4])
    with pytest.raises(ValueError, match="6 attention heads, not divisible by SP size 4"):
        check_sp_sizes(6, 2, [2, 4])
    with pytest.raises(ValueError, match="not a multiple of 3 key/value heads"):
        allowed_sp_sizes(4, 3)
