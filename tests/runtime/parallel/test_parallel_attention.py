"""Attention paths against the math reference, and Ulysses attention against one
process, forward and backward, on gloo ranks."""

from __future__ import annotations

import warnings

import pytest
import torch

from datacentric.models import attention as attention_module
from datacentric.models.attention import math_attention, varlen_attention
from datacentric.parallel import ulysses
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.sequence_shards import shard_bounds
from datacentric.parallel.ulysses import (
    SequenceParallelAttention,
    available_all_to_all_paths,
    check_sp_compatible,
)

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, HEAD_DIM = 4, 8


def _reference(q, k, v, grad_out, cu_seqlens, causal, window=None):
    """Single-process attention and its input gradients for ``sum(out * grad_out)``."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = math_attention(*leaves, cu_seqlens, causal, window=window)
    out.backward(grad_out)
    return out.detach(), [t.grad for t in leaves]


def _attention_worker() -> list[tuple[int, bool, int, float]]:
    """Every SP size the world allows, causal and not, with 4, 2 or 1 key/value heads
    (1: repeated for the group), with and without a sliding window; on every
    all-to-all path, which agree bit for bit."""
    groups = ProcessGroups()
    paths = available_all_to_all_paths()
    checked = []
    cases = [(False, HEADS, None), (True, HEADS, None), (True, HEADS // 2, None)]
    cases += [(True, 1, None), (True, HEADS // 2, 3)]
    for sp in groups.sizes:
        for causal, kv_heads, window in cases:
            # Same data on every rank: three samples and a padding segment.
            gen = torch.Generator().manual_seed(100 * sp + 10 * kv_heads + causal)
            real = 5 + 9 + 3
            full = -(-real // sp) * sp + sp  # pad to a multiple, always with some padding
            cu_seqlens = torch.tensor([0, 5, 14, 17, full])
            q, k, v, grad_out = (
                torch.randn(full, heads, HEAD_DIM, generator=gen, dtype=torch.float64)
                for heads in (HEADS, kv_heads, kv_heads, HEADS)
            )
            ref_out, ref_grads = _reference(q, k, v, grad_out, cu_seqlens, causal, window)

            start_rank = groups.rank - groups.rank % sp
            group = groups.group(start_rank, sp)
            lo, hi = shard_bounds(full, groups.rank - start_rank, sp)
            by_path = []
            for path in paths:
                sp_attention = SequenceParallelAttention(all_to_all=path)
                shards = [t[lo:hi].clone().requires_grad_(True) for t in (q, k, v)]
                with sp_attention.use(group):
                    assert sp_attention.sp_size == sp
                    out = sp_attention(*shards, cu_seqlens, causal, window=window)
                assert sp_attention.group is None  # restored after the block
                out.backward(grad_out[lo:hi])
                torch.testing.assert_close(out, ref_out[lo:hi])
                for name, shard, ref in zip("qkv", shards, ref_grads):
                    torch.testing.assert_close(
                        shard.grad, ref[lo:hi], msg=lambda m, n=name, p=path: f"{p} d{n}: {m}"
                    )
                by_path.append([out.detach(), *(t.grad for t in shards)])
                err = float((out - ref_out[lo:hi]).abs().max())
                checked.append((sp, causal, kv_heads, err, path))
            for other in by_path[1:]:  # pure data movement: identical bits on every path
                assert all(torch.equal(a, b) for a, b in zip(by_path[0], other))
    return checked


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_ulysses_matches_sdpa(world: int) -> None:
    results = spawn(_attention_worker, world, timeout_s=120)
    expected_sizes = [s for s in (1, 2, 4) if world % s == 0]
    for checked in results:
        assert sorted({sp for sp, *_ in checked}) == expected_sizes
        assert {causal for _, causal, *_ in checked} == {False, True}
        assert {kv for _, _, kv, *_ in checked} == {HEADS, HEADS // 2, 1}
        assert {path for *_, path in checked} == set(available_all_to_all_paths())
        assert max(err for *_, err, _ in checked) < 1e-10


def test_all_to_all_path_choice(monkeypatch) -> None:
    """The functional path where torch has it, ``c10d`` otherwise; forcing an unknown or
    missing path is an error, never a silent fallback."""
    monkeypatch.delenv(ulysses.ALL_TO_ALL_ENV, raising=False)
    has_functional = ulysses.all_to_all_single_autograd is not None  # torch >= 2.4
    assert ulysses.all_to_all_path() == ("functional" if has_functional else "c10d")
    assert SequenceParallelAttention(all_to_all="c10d").all_to_all == "c10d"
    monkeypatch.setenv(ulysses.ALL_TO_ALL_ENV, "c10d")
    assert SequenceParallelAttention().all_to_all == "c10d"
    with pytest.raises(ValueError, match="choose one of functional, c10d"):
        ulysses.all_to_all_path("nccl")
    monkeypatch.setattr(ulysses, "all_to_all_single_autograd", None)
    monkeypatch.delenv(ulysses.ALL_TO_ALL_ENV)
    assert ulysses.all_to_all_path() == "c10d"
    with pytest.raises(ValueError, match="'functional' is not in torch"):
        ulysses.all_to_all_path("functional")


def test_heads_not_divisible_by_sp_is_a_clear_error() -> None:
    check_sp_compatible(8, [1, 2, 4, 8])
    with pytest.raises(ValueError, match=r"6 attention heads, not divisible by SP size 4"):
        check_sp_compatible(6, [1, 2, 4])


def test_plain_attention_without_group() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, HEADS, HEAD_DIM, generator=gen) for _ in range(3))
    cu_seqlens = torch.tensor([0, 7, 12])
    out = SequenceParallelAttention()(q, k, v, cu_seqlens, True)
    torch.testing.assert_close(out, varlen_attention(q, k, v, cu_seqlens, True))


CASES = [(False, 4, None), (True, 4, None), (True, 2, None), (True, 1, 3), (True, 2, 1)]


@pytest.mark.parametrize(("causal", "kv_heads", "window"), CASES)
@pytest.mark.parametrize("path", ["sdpa", "flex"])
def test_attention_paths_match_the_math_reference(path, causal, kv_heads, window) -> None:
    """Each path that runs on this device against the dense definition (FlexAttention
    runs forward only on CPU; its backward needs CUDA)."""
    if path == "flex" and attention_module.flex_attention is None:
        pytest.skip("FlexAttention is not in this torch")
    gen = torch.Generator().manual_seed(kv_heads + 10 * (window or 0))
    cu_seqlens = torch.tensor([0, 5, 14, 17, 20])
    q = torch.randn(20, HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(20, kv_heads, HEAD_DIM, generator=gen, dtype=torch.float64) for _ in "kv")
    ref = math_attention(q, k, v, cu_seqlens, causal, window=window)
    if path == "flex":
        with warnings.catch_warnings():  # eager FlexAttention: fine for a correctness check
            warnings.simplefilter("ignore")
            out = attention_module._flex_path(
                *(t.float() for t in (q, k, v)), cu_seqlens, causal, window
            )
        torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
        return
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = varlen_attention(*leaves, cu_seqlens, causal, window=window)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    math_attention(*ref_leaves, cu_seqlens, causal, window=window).sum().backward()
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad)


def test_cuda_never_loops_over_samples_when_a_varlen_kernel_exists(monkeypatch) -> None:
    """With a varlen kernel installed, a CUDA tensor goes to it in one call, and
    per-sample SDPA is never reached (the device check is faked: no GPU here)."""
    calls = []

    def fake_kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size, enable_gqa):
        calls.append((tuple(cu_q.tolist()), max_q, window_size, enable_gqa))
        return torch.zeros_like(q)

    def no_sdpa(*args, **kwargs):
        raise AssertionError("per-sample SDPA called although a varlen kernel exists")

    monkeypatch.setattr(attention_module, "_torch_varlen", fake_kernel)
    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", no_sdpa)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q = torch.randn(228 * 4, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    kv = torch.randn(228 * 4, 2, HEAD_DIM, dtype=torch.bfloat16)
    cu_seqlens = torch.arange(0, 228 * 4 + 1, 4)
    assert attention_module.attention_path(q) == "varlen"
    varlen_attention(q, kv, kv, cu_seqlens, True, window=3)
    assert calls == [(tuple(cu_seqlens.tolist()), 4, (2, 0), True)]


def test_cuda_runs_long_segments_as_their_own_sdpa_call(monkeypatch) -> None:
    """Where one SDPA call is measured faster (long segments), that segment takes it and
    every other segment still goes to the varlen kernel in one call; the result is the
    math reference's, values and gradients (device check faked, costs scaled down)."""
    calls = []

    def math_kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size, enable_gqa):
        calls.append(tuple(cu_q.tolist()))
        return math_attention(q, k, v, cu_q, True)

    monkeypatch.setattr(attention_module, "_torch_varlen", math_kernel)
    gain_per_unit = 1 / attention_module.VARLEN_UNITS_PER_S - 1 / attention_module.SDPA_UNITS_PER_S
    break_even = 20 * 20 * HEADS * HEAD_DIM * 0.5 * gain_per_unit  # at 20 causal tokens
    monkeypatch.setattr(attention_module, "SDPA_CALL_OVERHEAD_S", break_even)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    lengths = [3, 40, 2, 5, 30]  # 40 and 30 count as long at this overhead
    assert [attention_module.sdpa_is_faster(n, HEADS, HEAD_DIM, True) for n in lengths] == [
        False, True, False, False, True
    ]  # fmt: skip
    cu_seqlens = torch.tensor([0, 3, 43, 45, 50, 80])
    gen = torch.Generator().manual_seed(0)
    leaves = [
        torch.randn(80, h, HEAD_DIM, generator=gen, dtype=torch.bfloat16).requires_grad_()
        for h in (HEADS, 2, 2)
    ]
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    out = varlen_attention(*leaves, cu_seqlens, True)
    assert calls == [(0, 3, 5, 10)]  # the short segments, in one call
    want = math_attention(*ref_leaves, cu_seqlens, True)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    out.float().square().sum().backward()
    want.square().sum().backward()
    for got, ref in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad.float(), ref.grad, atol=5e-2, rtol=5e-2)


def test_forcing_an_unavailable_path_is_an_error(monkeypatch) -> None:
    monkeypatch.setenv(attention_module.PATH_ENV, "varlen")
    q = torch.zeros(4, HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="'varlen' cannot run torch.float32 on cpu"):
        varlen_attention(q, q, q, torch.tensor([0, 4]), True)
    with pytest.raises(ValueError, match="'flash' cannot run"):
        varlen_attention(q, q, q, torch.tensor([0, 4]), True, path="flash")
    monkeypatch.setenv(attention_module.PATH_ENV, "sdpa")
    assert attention_module.attention_path(q) == "sdpa"
