"""One data-centric step of the reference models equals one single-process step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from datacentric.cli.main import main
from datacentric.verify import equivalence as equivalence_module
from datacentric.verify.case_models import build_case
from datacentric.verify.equivalence import (
    assert_gradients_close,
    mixed_iteration,
    relative_errors,
    run_distributed,
    run_reference,
)

# the repository (ranks import this module too, without tests/ on their path)
ROOT = Path(__file__).resolve().parents[3]
USER_MODULE = "tests.runtime.verify.test_equivalence"

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ("llama", "dit")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_both_models_match_the_single_process_step(world: int) -> None:
    cases = []
    for name in MODELS:
        model, dataset = build_case(name, 0, torch.float32)
        cases.append((name, mixed_iteration(dataset.shapes(), world, len(model.blocks))))
    _, iteration = cases[0]
    counts = [a.accumulation_steps for a in iteration.assignments]
    if world == 4:
        assert len(set(counts)) >= 2
        assert sorted({a.sp_size for a in iteration.assignments}) == [1, 2]
    else:  # world 2: one SP-2 group accumulating two micro-batches
        assert [(a.sp_size, a.accumulation_steps) for a in iteration.assignments] == [(2, 2)]

    results = run_distributed(cases, world, timeout_s=180)
    for (name, iteration), result in zip(cases, results):
        reference = run_reference(name, iteration)
        assert result.ranks_agree, f"{name}: ranks disagree on the synchronised gradients"
        for param, ref in reference.grads.items():
            assert ref.abs().sum() > 0, f"{name}: {param} has no reference gradient"
        assert_gradients_close(result, reference)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "phases"), [(2, [[1, 1], [2]]), (4, [[2, 1, 1], [1, 1, 2], [4]])]
)
def test_a_step_that_changes_its_layout_between_phases_matches_one_process(
    world: int, phases: list[list[int]]
) -> None:
    cases = []
    for name in MODELS:
        model, dataset = build_case(name, 0, torch.float32)
        shapes = dataset.shapes()
        cases.append((name, mixed_iteration(shapes, world, len(model.blocks), phases=phases)))
    iteration = cases[0][1]
    assert iteration.num_phases == len(phases)
    assert [a.sp_size for a in iteration.assignments_for_rank(world - 1)] == [
        layout[-1] for layout in phases
    ]
    results = run_distributed(cases, world, timeout_s=180)
    for (name, iteration), result in zip(cases, results):
        reference = run_reference(name, iteration)
        assert result.ranks_agree, f"{name}: ranks disagree on the synchronised gradients"
        assert_gradients_close(result, reference)


def test_mixed_iteration_covers_the_world_with_distinct_settings() -> None:
    shapes = build_case("dit", 0, torch.float32)[1].shapes()
    iteration = mixed_iteration(shapes, 8, num_blocks=4, seed=3)
    iteration.validate(8)
    assert [a.sp_size for a in iteration.assignments] == [4, 1, 1, 1, 1]
    assert [a.accumulation_steps for a in iteration.assignments] == [1, 2, 3, 4, 5]
    recomputed = {mb.num_recomputed for a in iteration.assignments for mb in a.micro_batches}
    assert recomputed == {0, 2, 4}
    ids = iteration.sample_ids()
    assert len(ids) == len(set(ids))
    # The SP group holds the longest samples.
    longest = max(shapes[i].tokens for i in ids)
    assert longest in {shapes[i].tokens for i in iteration.assignments[0].sample_ids()}


def test_cli_prints_json_and_exits_by_tolerance(monkeypatch, capsys) -> None:
    report = {"model": "dit", "world": 2, "max_rel_grad_err": 3e-5, "passed": False}
    calls = []

    def fake_check(models, world, **kwargs):
        calls.append((models, world, kwargs["tolerance"]))
        return [dict(report)]

    # the command imports the check when it runs (its --help imports no torch)
    monkeypatch.setattr(equivalence_module, "check_equivalence", fake_check)
    assert main(["equivalence", "--model", "dit", "--world", "2", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == report
    assert calls == [(["dit"], 2, 1e-5)]


@pytest.mark.slow
def test_cli_end_to_end(capsys) -> None:
    # World 1 keeps it cheap; worlds 2 and 4 are checked above through the same functions.
    assert main(["equivalence", "--model", "llama", "--world", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("world", "sp_sizes", "accumulation_counts", "loss_distributed", "loss_reference"):
        assert key in report
    assert report["world"] == 1 and report["sp_sizes"] == [1]
    assert report["max_rel_grad_err"] <= 1e-5


@pytest.mark.slow
def test_cli_checks_a_step_in_two_phases(capsys) -> None:
    assert main(["equivalence", "--model", "dit", "--world", "2", "--phased"]) == 0
    out = capsys.readouterr().out
    assert "dit (none) at world 2, 2 phases: SP sizes [2, 1, 1]" in out
    assert "-> PASS" in out


def user_factory():  # type: ignore[no-untyped-def]
    """A user's factory (named below as ``tests.runtime.verify.test_equivalence:...``)."""
    from datacentric.models.presets import build_model

    return build_model("llama")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["diffusers:wan", f"{USER_MODULE}:user_factory"])
def test_cli_checks_other_models_at_world_2_with_sp_2(name, capsys, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    assert main(["equivalence", "--model", name, "--world", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == name and report["sp_sizes"] == [2]
    assert report["accumulation_counts"] == [2] and report["passed"]
    assert report["max_rel_grad_err"] <= 1e-5


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gpt5", "unknown model 'gpt5'"),
        ("hf:nope", "no folder 'nope'"),
        ("no_such_module_x:make", "cannot import 'no_such_module_x'"),
        ("json:nothing", "json has no callable 'nothing'"),
    ],
)
def test_cli_names_a_bad_model_in_one_line(name, message, capsys) -> None:
    assert main(["equivalence", "--model", name, "--world", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("datacentric equivalence: ") and message in err
    assert "\n" not in err


def _tiny_phi3(**overrides):  # type: ignore[no-untyped-def]
    """A tiny Phi-3 (head dim 16: 8 rotary pairs) wrapped for our runtime."""
    from transformers import Phi3Config, Phi3ForCausalLM

    from datacentric.models.hf import HFCausalLM
    from datacentric.models.hf_tiny import SMALL_LLAMA

    # SMALL_LLAMA's shapes, 2 layers, 2 key/value heads; token ids inside the vocabulary
    values = {**SMALL_LLAMA, "num_hidden_layers": 2, "num_key_value_heads": 2}
    values.update(max_position_embeddings=256, pad_token_id=0, bos_token_id=None)
    values["eos_token_id"] = None
    values.update(overrides)
    return HFCausalLM(Phi3ForCausalLM(Phi3Config(**values)))


def longrope_phi3():  # type: ignore[no-untyped-def]
    """Phi-3 with LongRoPE: short factors up to 112 positions, long ones beyond."""
    rope = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 8,
        "long_factor": [4.0] * 8,
        "original_max_position_embeddings": 112,
    }
    return _tiny_phi3(rope_scaling=rope, original_max_position_embeddings=112)


def yarn_llama():  # type: ignore[no-untyped-def]
    """Llama with YaRN scaling (position-local: frequencies fixed by the config)."""
    from datacentric.models.hf import build_hf_llama

    rope = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 112}
    return build_hf_llama(num_hidden_layers=2, max_position_embeddings=224, rope_scaling=rope)


def gemma2():  # type: ignore[no-untyped-def]
    """Gemma2 without attention-logit softcapping, a sliding window of 32 on every other
    layer: transformers gives its class no SDPA path, so its reference runs eager."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from datacentric.models.hf import HFCausalLM

    config = Gemma2Config(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=32,
        attn_logit_softcapping=None,
    )  # fmt: skip
    return HFCausalLM(Gemma2ForCausalLM(config))


def _packed_vs_each_alone(name: str) -> float:
    """Largest relative gradient error between the model on a short sample packed
    with a long one (our adapter, one process) and the unmodified model on each alone."""
    from datacentric.verify.case_models import build_reference
    from datacentric.verify.equivalence import relative_errors
    from datacentric.verify.reference import reference_grads, reference_loss

    model, dataset = build_case(name, 0, torch.float32)
    model.eval()
    tokens = [s.tokens for s in dataset.shapes()]
    ids = [tokens.index(min(tokens)), tokens.index(max(tokens))]  # 97 and 128 tokens
    assert tokens[ids[0]] <= 112 < tokens[ids[1]]
    batch = dataset.pack(ids, 1)
    loss_S = model(batch)
    (loss_S[batch.loss_mask].sum() / batch.loss_mask.sum()).backward()
    reference, _ = build_reference(name, 0, torch.float32)
    reference_loss(reference, ids).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return max(relative_errors(grads, reference_grads(reference)).values())


def test_longrope_is_refused_and_the_independent_reference_would_catch_it(
    capsys, monkeypatch
) -> None:
    pytest.importorskip("transformers")
    from datacentric.models import hf

    monkeypatch.syspath_prepend(str(ROOT))
    assert main(["equivalence", "--model", f"{USER_MODULE}:longrope_phi3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' warnings
    assert err.startswith("datacentric equivalence: ")
    assert "rope_type='longrope'" in err and "LongRoPE" in err
    # Let it through: packed with a long sample, the short one takes the long factors,
    # which the reference (each sample alone, unmodified) shows as a gradient error.
    monkeypatch.setattr(hf, "check_supported", lambda *args, **kwargs: None)
    assert _packed_vs_each_alone(f"{USER_MODULE}:longrope_phi3") > 1e-3  # 9.6e-3
    # YaRN's frequencies are fixed by the config: packing changes nothing.
    assert _packed_vs_each_alone(f"{USER_MODULE}:yarn_llama") <= 1e-5


def test_a_model_without_an_sdpa_path_is_checked_against_its_eager_attention(
    monkeypatch,
) -> None:
    """The reference asked transformers for SDPA whatever the class: Gemma2's refused it
    (`does not support an attention implementation through ... scaled_dot_product_attention`),
    so `datacentric equivalence --model hf:DIR` of a Gemma2 folder could not run."""
    pytest.importorskip("transformers")
    from datacentric.verify.case_models import build_reference

    monkeypatch.syspath_prepend(str(ROOT))
    reference, _ = build_reference(f"{USER_MODULE}:gemma2", 0, torch.float32)
    assert "(eager attention)" in reference.description
    assert _packed_vs_each_alone(f"{USER_MODULE}:gemma2") <= 1e-5


@pytest.mark.slow
def test_hf_models_at_world_4_match_the_unmodified_models_with_sp_4() -> None:
    """hf:mistral, hf:qwen2 and hf:gpt2 at SP sizes [2, 1, 1] accumulating 1, 2 and 3
    micro-batches (what ``datacentric equivalence --world 4`` runs), and the two models
    with 2 key/value heads on one SP-4 group (repeated to 4 for the group)."""
    pytest.importorskip("transformers")
    cases = []
    for name, layout in [
        ("hf:mistral", [2, 1, 1]),
        ("hf:qwen2", [2, 1, 1]),
        ("hf:gpt2", [2, 1, 1]),
        ("hf:mistral", [4]),
        ("hf:qwen2", [4]),
    ]:
        shapes = build_case(name, 0, torch.float32)[1].shapes()
        cases.append((name, mixed_iteration(shapes, 4, 4, sizes=layout)))
    assert [a.accumulation_steps for a in cases[0][1].assignments] == [1, 2, 3]
    assert [(a.sp_size, a.accumulation_steps) for a in cases[3][1].assignments] == [(4, 2)]
    results = run_distributed(cases, 4, timeout_s=240)
    for (name, iteration), result in zip(cases, results):
        reference = run_reference(name, iteration)
        assert result.ranks_agree, name
        errors = relative_errors(result.grads, reference.grads)
        assert max(errors.values()) <= 1e-5, (name, max(errors.values()))
        assert_gradients_close(result, reference)


@pytest.mark.slow
def test_cli_world_4_json_for_an_hf_model_with_grouped_heads(capsys) -> None:
    """What a user runs; hf:mistral and hf:gpt2 run the same function above."""
    pytest.importorskip("transformers")
    assert main(["equivalence", "--model", "hf:qwen2", "--world", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sp_sizes"] == [2, 1, 1] and report["accumulation_counts"] == [1, 2, 3]
    assert report["passed"] and report["max_rel_grad_err"] <= 1e-5
    assert report["dropout"].startswith("off")
    assert report["reference"].startswith("transformers Qwen2ForCausalLM.forward")
