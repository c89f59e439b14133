"""FlexAttention block masks of packed layouts: built block by block, never S x S."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from datacentric.models import attention as attention_module
from datacentric.models.attention import FLEX_BLOCK, document_block_mask, math_attention

pytestmark = pytest.mark.skipif(
    attention_module.flex_attention is None, reason="FlexAttention is not in this torch"
)
LAYOUTS = [(0, 100, 356, 357, 600), (0, 128, 256, 640), (0, 700)]
CASES = [(False, None), (True, None), (True, 50), (True, 200)]


class LargestTensor(TorchDispatchMode):
    """Bytes of the largest tensor any operator creates, and of all of them together."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                size = t.numel() * t.element_size()
                self.largest, self.total = max(self.largest, size), self.total + size
        return out


@pytest.mark.parametrize("offsets", LAYOUTS)
@pytest.mark.parametrize(("causal", "window"), CASES)
def test_blockwise_mask_matches_the_definition(offsets, causal, window):
    gen = torch.Generator().manual_seed(len(offsets))
    q, k, v = (torch.randn(offsets[-1], 2, 8, generator=gen) for _ in "qkv")
    cu_seqlens = torch.tensor(offsets)
    with warnings.catch_warnings():  # eager FlexAttention: fine for a correctness check
        warnings.simplefilter("ignore")
        out = attention_module._flex_path(q, k, v, cu_seqlens, causal, window)
    ref = math_attention(q, k, v, cu_seqlens, causal, window=window)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("causal", "window"), CASES)
def test_blocks_cover_what_the_dense_builder_keeps(causal, window):
    """Every block the S x S builder keeps is kept, and no block is called full (mask
    skipped) that the dense builder finds partly masked."""
    from torch.nn.attention.flex_attention import create_block_mask

    offsets = LAYOUTS[0]
    mask = document_block_mask(offsets, causal, window, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dense = create_block_mask(mask.mask_mod, None, None, offsets[-1], offsets[-1], "cpu")
    kept, dense_kept = mask.to_dense().bool(), dense.to_dense().bool()
    assert torch.all(kept | ~dense_kept)
    full = torch.zeros_like(kept)
    n = mask.full_kv_num_blocks[0, 0]
    for row in range(full.shape[2]):
        full[0, 0, row, mask.full_kv_indices[0, 0, row, : n[row]].long()] = True
    dense_full = torch.zeros_like(kept)
    n = dense.full_kv_num_blocks[0, 0]
    for row in range(full.shape[2]):
        dense_full[0, 0, row, dense.full_kv_indices[0, 0, row, : n[row]].long()] = True
    assert torch.all(dense_full | ~full)


def test_a_32k_token_mask_holds_blocks_not_token_pairs():
    """32,768 tokens in 32 causal segments: no tensor beyond (S / 128)^2 block entries
    and O(S) token ids (256 KiB each), where an S x S boolean mask is 1 GiB."""
    total, segments = 32768, 32
    offsets = tuple(round(i * total / segments) for i in range(segments + 1))
    with LargestTensor() as seen:
        mask = document_block_mask(offsets, True, None, "cpu")
    blocks = (total // FLEX_BLOCK) ** 2
    assert seen.largest <= 8 * max(blocks, total)  # one int64 per block pair or token
    # every tensor made, live or not (14 MB at 32K): the kv lists, their transposes for
    # the backward, and O(S) ids
    assert seen.total <= 256 * (blocks + total)
    assert seen.total < total * total / 50  # against 1 GiB for the S x S mask
    assert mask.kv_indices.shape[-2:] == (total // FLEX_BLOCK, total // FLEX_BLOCK)
    assert int(mask.full_kv_num_blocks.sum()) > 0  # whole in-segment blocks skip the mask
