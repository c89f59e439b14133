"""Datasets: the stdlib corpus (order, chunking, nothing dropped), packing invariants,
determinism of synthetic data by sample id, and the video latent-grid arithmetic."""

from __future__ import annotations

import pytest
import torch

from datacentric.batch import IGNORE_INDEX, PackedBatch
from datacentric.data import (
    DEFAULT_MAX_TOKENS,
    Dataset,
    StdlibCorpus,
    SyntheticTextDataset,
    SyntheticVideoDataset,
    benchmark_video_shapes,
    latent_grid,
    padded_length,
    video_shape,
)
from datacentric.data.base import DataError
from datacentric.data.stdlib import TEST_DIRS, chunk_bounds, list_source_files, stdlib_root
from datacentric.data.video import grid_positions
from datacentric.shapes import SampleShape

VIDEO_SHAPES = [SampleShape.video(*g) for g in ((1, 3, 4), (2, 3, 3), (3, 2, 5), (1, 1, 1))]


@pytest.fixture(scope="module")
def corpus() -> StdlibCorpus:
    return StdlibCorpus()


def check_layout(batch: PackedBatch, lengths: list[int], multiple: int) -> None:
    """Invariants every packed batch satisfies."""
    S = batch.num_tokens
    real = sum(lengths)
    assert S == padded_length(real, multiple) and S % multiple == 0
    expected = [0]
    for n in lengths + ([S - real] if S > real else []):
        expected.append(expected[-1] + n)
    assert batch.cu_seqlens.tolist() == expected
    assert batch.cu_seqlens.dtype == torch.long and batch.full_length == S
    for name in ("targets", "position_ids", "segment_ids", "loss_mask"):
        assert getattr(batch, name).shape[0] == S, name
    for i, (start, end) in enumerate(zip(expected[:-1], expected[1:])):
        seg = batch.segment_ids[start:end]
        assert (seg == (i if i < len(lengths) else -1)).all()
    padding = batch.segment_ids < 0
    assert int(padding.sum()) == S - real
    assert not batch.loss_mask[padding].any()


def test_corpus_order_and_files(corpus: StdlibCorpus) -> None:
    assert corpus.root == stdlib_root()
    assert corpus.max_tokens == DEFAULT_MAX_TOKENS == 8192
    listed = list_source_files(corpus.root)
    assert listed == sorted(listed) and len(listed) > 300
    assert not any(set(p.split("/")[:-1]) & (TEST_DIRS | {"site-packages"}) for p in listed)
    assert corpus.files == [p for p in listed if p not in corpus.skipped_empty]
    for path in corpus.skipped_empty:  # skipped files really are empty, and are reported
        assert (corpus.root / path).stat().st_size == 0
    assert corpus.summary()["skipped_empty"] == len(corpus.skipped_empty)
    assert corpus.summary()["files"] == len(corpus.files)
    # Deterministic: a second instance is the same corpus.
    assert StdlibCorpus().shapes() == corpus.shapes()


def test_corpus_chunks_cover_every_byte(corpus: StdlibCorpus) -> None:
    shapes = corpus.shapes()
    assert len(shapes) == len(corpus) and max(s.tokens for s in shapes) <= corpus.max_tokens
    by_file: dict[str, list] = {}
    for i in range(len(corpus)):
        info = corpus.describe(i)
        assert info.tokens == shapes[i].tokens >= 1
        by_file.setdefault(info.path, []).append(info)
    assert list(by_file) == corpus.files  # samples follow file order
    for path, size in zip(corpus.files, corpus.file_lengths):
        chunks = by_file[path]
        assert [c.chunk for c in chunks] == list(range(len(chunks)))
        assert all(c.num_chunks == len(chunks) for c in chunks)
        assert chunks[0].start == 0 and chunks[-1].end == size
        assert all(a.end == b.start for a, b in zip(chunks, chunks[1:]))
        assert len(chunks) == -(-size // corpus.max_tokens)
    assert sum(s.tokens for s in shapes) == sum(corpus.file_lengths)
    # The longest file is split into near-equal chunks.
    longest = max(range(len(corpus.files)), key=corpus.file_lengths.__getitem__)
    sizes = {c.tokens for c in by_file[corpus.files[longest]]}
    assert max(sizes) - min(sizes) <= 1


def test_corpus_samples_are_the_file_bytes(corpus: StdlibCorpus) -> None:
    split = next(i for i in range(len(corpus)) if corpus.describe(i).num_chunks > 1)
    for i in (0, split, split + 1, len(corpus) - 1):
        info = corpus.describe(i)
        data = (corpus.root / info.path).read_bytes()[info.start : info.end]
        sample = corpus.sample(i)
        assert sample.dtype == torch.uint8
        assert bytes(sample.tolist()) == data


def test_chunk_bounds() -> None:
    assert chunk_bounds(10, 10) == [(0, 10)]
    assert chunk_bounds(11, 10) == [(0, 5), (5, 11)]
    for length in (1, 7, 100, 8193, 99_999):
        for cap in (1, 3, 64, 8192):
            bounds = chunk_bounds(length, cap)
            assert bounds[0][0] == 0 and bounds[-1][1] == length
            assert all(0 < e - s <= cap for s, e in bounds)


def test_corpus_limit_cap_and_errors() -> None:
    small = StdlibCorpus(max_tokens=256, limit=5)
    assert len(small.files) + len(small.skipped_empty) == 5
    assert max(s.tokens for s in small.shapes()) <= 256
    with pytest.raises(ValueError, match="max_tokens"):
        StdlibCorpus(max_tokens=0)
    with pytest.raises(IndexError, match="out of range"):
        small.pack([len(small)])
    with pytest.raises(ValueError, match="empty list"):
        small.pack([])
    with pytest.raises(ValueError, match="pad_to_multiple"):
        small.pack([0], pad_to_multiple=0)


def test_corpus_long_file_rules() -> None:
    """--long-docs applies to the standard-library corpus as to every text source."""
    chunked = StdlibCorpus(max_tokens=4096, limit=16)
    sizes = dict(zip(chunked.files, chunked.file_lengths))
    long = [p for p, n in sizes.items() if n > 4096]
    assert long
    skipped = StdlibCorpus(max_tokens=4096, limit=16, long_docs="skip")
    assert skipped.skipped_long == long
    assert skipped.summary()["samples_skipped"] == len(long) + len(skipped.skipped_empty)
    assert sorted(s.tokens for s in skipped.shapes()) == sorted(
        n for n in sizes.values() if n <= 4096
    )
    truncated = StdlibCorpus(max_tokens=4096, limit=16, long_docs="truncate")
    assert len(truncated) == len(sizes)
    assert max(s.tokens for s in truncated.shapes()) == 4096
    first = truncated.files.index(long[0])
    with open(truncated.root / long[0], "rb") as handle:
        assert truncated.sample(first).tolist() == list(handle.read(4096))
    with pytest.raises(DataError, match=f"stdlib {long[0]}: file of {sizes[long[0]]} bytes"):
        StdlibCorpus(max_tokens=4096, limit=16, long_docs="error")


def test_text_packing_invariants() -> None:
    corpus = StdlibCorpus(max_tokens=64, limit=4)
    ids = [3, 0, len(corpus) - 1, 5]
    for multiple in (1, 2, 4, 7, 64):
        batch = corpus.pack(ids, pad_to_multiple=multiple)
        lengths = [corpus.shapes()[i].tokens for i in ids]
        check_layout(batch, lengths, multiple)
        assert batch.sample_ids == tuple(ids) and batch.sample_cond is None
        assert batch.inputs.dtype == torch.long
        bounds = batch.cu_seqlens.tolist()
        for k, i in enumerate(ids):
            start, end = bounds[k], bounds[k + 1]
            data = corpus.sample(i).long()
            assert torch.equal(batch.inputs[start:end], data)
            assert torch.equal(batch.targets[start : end - 1], data[1:])  # next byte
            assert batch.targets[end - 1] == IGNORE_INDEX  # no target past the sample
            assert torch.equal(batch.position_ids[start:end], torch.arange(end - start))
        assert torch.equal(batch.loss_mask, batch.targets != IGNORE_INDEX)
        assert int(batch.loss_mask.sum()) == sum(n - 1 for n in lengths)


def test_synthetic_text_is_deterministic_by_id() -> None:
    shapes = [SampleShape.text(n) for n in (5, 9, 3)]
    a, b = SyntheticTextDataset(shapes, seed=1), SyntheticTextDataset(shapes[::-1], seed=1)
    assert torch.equal(a.sample(1), b.sample(1))  # same id, same tokens
    assert not torch.equal(a.sample(1), SyntheticTextDataset(shapes, seed=2).sample(1))
    assert int(a.sample(0).max()) < 256
    check_layout(a.pack([2, 0], pad_to_multiple=4), [3, 5], 4)
    with pytest.raises(ValueError, match="video shapes"):
        SyntheticTextDataset([SampleShape.video(1, 2, 2)])


def test_video_packing_invariants() -> None:
    data = SyntheticVideoDataset(VIDEO_SHAPES, seed=5)
    assert data.token_dim == 16
    ids = [2, 0, 3]
    for multiple in (1, 4, 16):
        batch = data.pack(ids, pad_to_multiple=multiple)
        lengths = [VIDEO_SHAPES[i].tokens for i in ids]
        check_layout(batch, lengths, multiple)
        assert batch.inputs.shape == (batch.num_tokens, 16) == batch.targets.shape
        assert batch.position_ids.shape == (batch.num_tokens, 3)
        assert torch.equal(batch.loss_mask, batch.segment_ids >= 0)
        assert batch.sample_cond is not None and batch.sample_cond.shape == (len(ids),)
        assert ((batch.sample_cond >= 0) & (batch.sample_cond < 1)).all()
        bounds = batch.cu_seqlens.tolist()
        for k, i in enumerate(ids):
            rows = slice(bounds[k], bounds[k + 1])
            s = data.sample(i)
            assert batch.sample_cond[k] == pytest.approx(s.t)
            # Rectified flow: x_t = (1 - t) x0 + t eps, target = eps - x0.
            torch.testing.assert_close(batch.inputs[rows], (1 - s.t) * s.x0 + s.t * s.noise)
            torch.testing.assert_close(batch.targets[rows], s.noise - s.x0)
            assert torch.equal(batch.position_ids[rows], grid_positions(VIDEO_SHAPES[i].grid))
        pad = batch.segment_ids < 0
        assert (batch.inputs[pad] == 0).all() and (batch.targets[pad] == 0).all()


def test_video_is_deterministic_by_sample_id() -> None:
    a = SyntheticVideoDataset(VIDEO_SHAPES, seed=5)
    b = SyntheticVideoDataset(VIDEO_SHAPES, seed=5)
    for i in range(len(a)):
        sa, sb = a.sample(i), b.sample(i)
        assert sa.t == sb.t and torch.equal(sa.x0, sb.x0) and torch.equal(sa.noise, sb.noise)
    # A sample's rows do not depend on what it is packed with or on padding.
    alone = a.pack([1])
    mixed = a.pack([3, 1, 0], pad_to_multiple=8)
    rows = slice(int(mixed.cu_seqlens[1]), int(mixed.cu_seqlens[2]))
    assert torch.equal(mixed.inputs[rows], alone.inputs)
    assert torch.equal(mixed.targets[rows], alone.targets)
    assert mixed.sample_cond[1] == alone.sample_cond[0]
    # Different ids and different seeds draw different data; latents are smooth-ish.
    c = SyntheticVideoDataset(VIDEO_SHAPES, seed=6)
    assert a.sample(0).t != a.sample(1).t and a.sample(0).t != c.sample(0).t
    big = SyntheticVideoDataset([SampleShape.video(4, 8, 8)]).sample(0)
    assert 0.3 < float(big.x0.std()) < 2.0 and 0.8 < float(big.noise.std()) < 1.2


def test_latent_grid_follows_the_benchmark() -> None:
    assert latent_grid(144, 256, 1) == (1, 9, 16)
    assert latent_grid(240, 426, 51) == (15, 15, 27)  # 426 // 8 = 53 -> 27 patches
    assert latent_grid(480, 854, 102) == (30, 30, 53)  # 854 // 8 = 106
    assert latent_grid(720, 1280, 408) == (120, 45, 80)
    assert latent_grid(64, 64, 3) == (1, 4, 4)  # very short clips keep one latent frame
    assert video_shape("720p", 408).tokens == 432_000
    shapes = benchmark_video_shapes()
    assert len(shapes) == 25 and shapes[("240p", 1)] == SampleShape.video(1, 15, 27)
    with pytest.raises(KeyError, match="1080p"):
        video_shape("1080p", 1)
    with pytest.raises(ValueError, match="text shapes"):
        SyntheticVideoDataset([SampleShape.text(4)])


def test_datasets_follow_the_protocol(corpus: StdlibCorpus) -> None:
    for dataset in (
        corpus,
        SyntheticTextDataset([SampleShape.text(3)]),
        SyntheticVideoDataset(VIDEO_SHAPES),
    ):
        assert isinstance(dataset, Dataset)
        assert len(dataset.shapes()) == len(dataset)
        for i in (0, len(dataset) - 1):
            batch = dataset.pack([i], pad_to_multiple=2)
            assert isinstance(batch, PackedBatch)
            assert dataset.loss_tokens(i) == int(batch.loss_mask.sum())
