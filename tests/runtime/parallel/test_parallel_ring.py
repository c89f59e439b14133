"""Ring and hybrid (Ulysses x ring) attention against one process, forward and every
input gradient, on gloo ranks; the zigzag layout's invariants without ranks."""

from __future__ import annotations

import pytest
import torch

from datacentric.models.attention import math_attention
from datacentric.parallel.groups import ProcessGroups, RingGroup, split_position
from datacentric.parallel.launch import spawn
from datacentric.parallel.ring import merge_partial, ring_attention, ring_kernel
from datacentric.parallel.ring_layout import ring_layout
from datacentric.parallel.ulysses import SequenceParallelAttention

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, HEAD_DIM = 4, 8
#: three samples of awkward lengths (one shorter than 2r) and a padding segment
LENGTHS = (23, 5, 2, 30)


def _offsets(lengths, multiple: int) -> tuple[int, ...]:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    offsets.append(-(-offsets[-1] // multiple) * multiple + multiple)  # padding segment
    return tuple(offsets)


def _definition_mask(offsets, causal, window=None) -> torch.Tensor:
    total = offsets[-1]
    seg = torch.bucketize(torch.arange(total), torch.tensor(offsets[1:]), right=True)
    i = torch.arange(total)
    keep = seg[:, None] == seg[None, :]
    if causal:
        keep &= i[:, None] >= i[None, :]
    if window is not None:
        keep &= i[:, None] - i[None, :] < window
    return keep


@pytest.mark.parametrize("ring", [1, 2, 3, 4])
def test_layout_is_a_balanced_partition_and_its_pairs_are_the_mask(ring: int) -> None:
    offsets = _offsets(LENGTHS + (17, 64), 2 * ring)
    layout = ring_layout(offsets, ring)
    every = torch.cat([layout.tokens(j) for j in range(ring)])
    assert sorted(every.tolist()) == list(range(offsets[-1]))  # each token exactly once
    assert {layout.num_local(j) for j in range(ring)} == {offsets[-1] // ring}
    for j in range(ring):  # the local order follows the global one
        assert torch.all(layout.tokens(j)[1:] > layout.tokens(j)[:-1])
    for causal in (False, True):
        mask = _definition_mask(offsets, causal)
        for qi in range(ring):
            for kj in range(ring):
                want = mask[layout.tokens(qi)][:, layout.tokens(kj)]
                got = torch.zeros_like(want)
                for pair in layout.block_pairs(qi, kj, causal):
                    (qa, qb), (ka, kb) = pair.q, pair.k
                    block = torch.ones(qb - qa, kb - ka, dtype=torch.bool)
                    if pair.causal:
                        assert (qa, qb) == (ka, kb) and qi == kj
                        block = torch.tril(block)
                    assert not got[qa:qb, ka:kb].any()  # pairs do not overlap
                    got[qa:qb, ka:kb] = block
                assert torch.equal(got, want), (causal, qi, kj)


def test_zigzag_balances_causal_work() -> None:
    """Causal (query, key) pairs per position differ by little; a contiguous split of
    the same layout gives one position about 3x another's."""
    offsets = _offsets((400, 250, 90), 8)
    layout, mask = ring_layout(offsets, 4), _definition_mask(offsets, True)
    work = [int(mask[layout.tokens(j)].sum()) for j in range(4)]
    assert max(work) / min(work) < 1.05, work
    contiguous = [int(mask[j * len(mask) // 4 : (j + 1) * len(mask) // 4].sum()) for j in range(4)]
    assert max(contiguous) / min(contiguous) > 2.5


def test_layout_refuses_a_length_the_ring_does_not_divide() -> None:
    with pytest.raises(ValueError, match="cannot be split over a ring of 4"):
        ring_layout((0, 5, 10), 4)


def test_merge_of_partials_is_softmax_over_the_union() -> None:
    """Two blocks' partial results merge into attention over both, including queries
    that see no key in one block (lse = -inf)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    s = torch.einsum("qhd,khd->hqk", q, k)
    keep = torch.rand(2, 6, 6, generator=gen) > 0.3
    keep[:, :, 0] = True  # every query sees some key overall
    parts = []
    for cols in (slice(0, 3), slice(3, 6)):
        sb = s[:, :, cols].masked_fill(~keep[:, :, cols], float("-inf"))
        lse = torch.logsumexp(sb, -1)
        p = torch.exp(sb - torch.where(lse.isinf(), 0.0, lse)[..., None])
        parts.append((torch.einsum("hqk,khd->qhd", p, v[cols]), lse))
    out, lse = merge_partial(*parts[0], *parts[1])
    full = s.masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(out, torch.einsum("hqk,khd->qhd", full.softmax(-1), v))
    torch.testing.assert_close(lse, torch.logsumexp(full, -1))


def test_kernel_choice() -> None:
    q = torch.zeros(4, 2, 8)
    assert ring_kernel(q, None) == "math"  # CPU: the definition
    with pytest.raises(ValueError, match="'flash' cannot run torch.float32 on cpu"):
        ring_kernel(q, None, "flash")
    with pytest.raises(ValueError, match="choose one of flash, math"):
        ring_kernel(q, None, "fast")


def test_one_position_ring_is_attention() -> None:
    """A ring of one (no communication) is plain attention, forward and backward."""
    offsets = _offsets(LENGTHS, 2)
    cu = torch.tensor(offsets)
    gen = torch.Generator().manual_seed(1)
    q, dout = (torch.randn(offsets[-1], HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    k, v = (torch.randn(offsets[-1], 2, HEAD_DIM, generator=gen) for _ in range(2))
    for causal, window in ((False, None), (True, None), (True, 4)):
        ref_out, ref_grads = _reference(q, k, v, dout, cu, causal, window)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = ring_attention(*leaves, cu, causal, RingGroup((0,), 0), window=window)
        out.backward(dout)
        torch.testing.assert_close(out, ref_out)
        for leaf, ref in zip(leaves, ref_grads):
            torch.testing.assert_close(leaf.grad, ref)


def _reference(q, k, v, grad_out, cu_seqlens, causal, window=None):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = math_attention(*leaves, cu_seqlens, causal, window=window)
    out.backward(grad_out)
    return out.detach(), [t.grad for t in leaves]


def _ring_worker(splits: list[tuple[int, int]]) -> list[tuple]:
    """Every (u, r) split in ``splits`` of the whole world: causal and not, grouped
    key/value heads, a sliding window; each rank returns its tokens' outputs and input
    gradients for the parent to compare with one process."""
    groups = ProcessGroups()
    results = []
    for ulysses, ring in splits:
        sp = ulysses * ring
        for causal, kv_heads, window in ((False, HEADS, None), (True, 2, None), (True, 1, 5)):
            offsets = _offsets(LENGTHS, 2 * sp)
            cu = torch.tensor(offsets)
            gen = torch.Generator().manual_seed(7 * sp + kv_heads)
            q, dout = (torch.randn(offsets[-1], HEADS, HEAD_DIM, generator=gen) for _ in range(2))
            k, v = (torch.randn(offsets[-1], kv_heads, HEAD_DIM, generator=gen) for _ in range(2))
            group, ring_group = groups.split(0, sp, ring)
            position, ulysses_rank = split_position(groups.rank, sp, ring)
            tokens = ring_layout(offsets, ring).tokens(position)
            piece = len(tokens) // ulysses
            mine = tokens[ulysses_rank * piece : (ulysses_rank + 1) * piece]
            leaves = [t[mine].clone().requires_grad_(True) for t in (q, k, v)]
            attention = SequenceParallelAttention()
            with attention.use(group, ring_group):
                assert attention.sp_size == sp
                out = attention(*leaves, cu, causal, window=window)
                out.backward(dout[mine])
            grads = [t.grad for t in leaves]
            results.append(((ulysses, ring, causal, kv_heads, window), mine, out.detach(), grads))
    return results


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "splits"), [(2, [(1, 2)]), (4, [(1, 4), (2, 2)])], ids=["world2", "world4"]
)
def test_ring_and_hybrid_match_one_process(world: int, splits) -> None:
    per_rank = spawn(_ring_worker, world, splits, timeout_s=120)
    for case in range(len(per_rank[0])):
        (ulysses, ring, causal, kv_heads, window), *_ = per_rank[0][case]
        offsets = _offsets(LENGTHS, 2 * ulysses * ring)
        gen = torch.Generator().manual_seed(7 * ulysses * ring + kv_heads)
        q, dout = (torch.randn(offsets[-1], HEADS, HEAD_DIM, generator=gen) for _ in range(2))
        k, v = (torch.randn(offsets[-1], kv_heads, HEAD_DIM, generator=gen) for _ in range(2))
        ref_out, ref_grads = _reference(q, k, v, dout, torch.tensor(offsets), causal, window)
        seen = torch.zeros(offsets[-1], dtype=torch.bool)
        for rank_results in per_rank:
            _, mine, out, grads = rank_results[case]
            seen[mine] = True
            msg = f"u={ulysses} r={ring} causal={causal} kv={kv_heads} window={window}"
            torch.testing.assert_close(out, ref_out[mine], msg=lambda m, c=msg: f"{c} out: {m}")
            for name, grad, ref in zip("qkv", grads, ref_grads):
                torch.testing.assert_close(
                    grad, ref[mine], msg=lambda m, n=name, c=msg: f"{c} d{n}: {m}"
                )
        assert seen.all()  # the shards cover the sequence
