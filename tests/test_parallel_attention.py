"""Ulysses attention against single-process SDPA, forward and backward, on gloo ranks."""

from __future__ import annotations

import pytest
import torch

from datacentric.models.attention import varlen_attention
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.sharding import shard_bounds
from datacentric.parallel.ulysses import SequenceParallelAttention, check_sp_compatible

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, HEAD_DIM = 4, 8


def _gqa_attention(q, k, v, cu_seqlens, causal):
    """Grouped-query attention: each key/value head serves ``H_q / H_kv`` query heads."""
    repeat = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(repeat, dim=1) for t in (k, v))
    return varlen_attention(q, k, v, cu_seqlens, causal)


def _reference(q, k, v, grad_out, cu_seqlens, causal):
    """Single-process attention and its input gradients for ``sum(out * grad_out)``."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = _gqa_attention(*leaves, cu_seqlens, causal)
    out.backward(grad_out)
    return out.detach(), [t.grad for t in leaves]


def _attention_worker() -> list[tuple[int, bool, int, float]]:
    """Every SP size the world allows, causal and not, with 4 or 2 key/value heads."""
    groups = ProcessGroups()
    sp_attention = SequenceParallelAttention(_gqa_attention)
    checked = []
    for sp in groups.sizes:
        for causal, kv_heads in [(False, HEADS), (True, HEADS), (True, HEADS // 2)]:
            if kv_heads % sp:
                continue
            # Same data on every rank: three samples and a padding segment.
            gen = torch.Generator().manual_seed(100 * sp + 10 * kv_heads + causal)
            real = 5 + 9 + 3
            full = -(-real // sp) * sp + sp  # pad to a multiple, always with some padding
            cu_seqlens = torch.tensor([0, 5, 14, 17, full])
            q, k, v, grad_out = (
                torch.randn(full, heads, HEAD_DIM, generator=gen, dtype=torch.float64)
                for heads in (HEADS, kv_heads, kv_heads, HEADS)
            )
            ref_out, ref_grads = _reference(q, k, v, grad_out, cu_seqlens, causal)

            start_rank = groups.rank - groups.rank % sp
            group = groups.group(start_rank, sp)
            lo, hi = shard_bounds(full, groups.rank - start_rank, sp)
            shards = [t[lo:hi].clone().requires_grad_(True) for t in (q, k, v)]
            with sp_attention.use(group):
                assert sp_attention.sp_size == sp
                out = sp_attention(*shards, cu_seqlens, causal)
            assert sp_attention.group is None  # restored after the block
            out.backward(grad_out[lo:hi])
            torch.testing.assert_close(out, ref_out[lo:hi])
            for name, shard, ref in zip("qkv", shards, ref_grads):
                torch.testing.assert_close(
                    shard.grad, ref[lo:hi], msg=lambda m, n=name: f"d{n}: {m}"
                )
            err = float((out - ref_out[lo:hi]).abs().max())
            checked.append((sp, causal, kv_heads, err))
    return checked


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_ulysses_matches_sdpa(world: int) -> None:
    results = spawn(_attention_worker, world, timeout_s=120)
    expected_sizes = [s for s in (1, 2, 4) if world % s == 0]
    for checked in results:
        assert sorted({sp for sp, *_ in checked}) == expected_sizes
        assert {causal for _, causal, _, _ in checked} == {False, True}
        assert {kv for _, _, kv, _ in checked} == {HEADS, HEADS // 2}
        assert max(err for *_, err in checked) < 1e-10


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
