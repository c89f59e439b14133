"""Video latents from files (npy, safetensors, pt), buckets, per-epoch draws, errors;
and the prefetcher's data wait. Fixtures are built on the fly."""

from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest
import torch

from datacentric.cli.main import main
from datacentric.data import DataConfig, open_dataset
from datacentric.data.base import DataError
from datacentric.data.latent_files import read_latent_listing
from datacentric.data.latents import LatentDataset
from datacentric.data.prefetch import Prefetcher, rank_requests
from datacentric.data.sources import skipped_samples
from datacentric.data.text import SyntheticTextDataset
from datacentric.shapes import SampleShape


def save_safetensors(path, array: np.ndarray) -> None:
    header = {"latent": {"dtype": "F32", "shape": list(array.shape), "data_offsets": [0, 0]}}
    header["latent"]["data_offsets"][1] = array.astype(np.float32).nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + array.astype(np.float32).tobytes())


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "latents"
    root.mkdir()
    np.save(root / "a.npy", rng.standard_normal((3, 4, 6, 8)).astype(np.float32))
    np.save(root / "a.text.npy", np.ones((5, 7), dtype=np.float32))
    save_safetensors(root / "b.safetensors", rng.standard_normal((1, 4, 5, 5)))
    torch.save({"latent": torch.randn(2, 4, 4, 4)}, root / "c.pt")
    return root


def test_folder_shapes_from_headers_and_packing(folder):
    ds = open_dataset(f"latents:{folder}")
    assert [s.grid for s in ds.shapes()] == [(3, 3, 4), (1, 3, 3), (2, 2, 2)]
    assert ds.token_dim == 16 and ds.loss_tokens(1) == 9
    assert ds.text_embedding(0).shape == (5, 7) and ds.text_embedding(1) is None
    batch = ds.pack([0, 2], pad_to_multiple=4)
    assert batch.inputs.shape == (36 + 8, 16) and batch.cu_seqlens.tolist() == [0, 36, 44]
    # the clean latents are the file's: velocity + noisy input recover x0 at t
    x0 = np.load(folder / "a.npy")
    s = ds.sample(0)
    assert torch.allclose(s.x0[0, ::4], torch.from_numpy(x0[0, :, 0, 0]))  # (C, 1, 2, 2) per token
    again = ds.pack([0, 2], pad_to_multiple=4)
    assert torch.equal(batch.inputs, again.inputs)  # same (seed, epoch, id): same draws
    other = ds.pack([0, 2], pad_to_multiple=4, epoch=1)
    assert not torch.equal(batch.sample_cond, other.sample_cond)


def test_manifest_and_bucket_config(folder, tmp_path):
    manifest = folder / "manifest.jsonl"
    manifest.write_text('{"latent": "a.npy"}\n{"latent": "c.pt", "text": "a.text.npy"}\n')
    ds = LatentDataset(str(folder))
    assert len(ds) == 2 and ds.text_files[1] is not None
    manifest.unlink()
    config = tmp_path / "buckets.json"
    # latent pixels are pixels / 8: a 32x32 bucket is 4x4 latent pixels
    config.write_text(
        json.dumps(
            {
                "buckets": {"tiny": {"1": 1.0, "10": [1.0, 4], "34": 1.0}},
                "aspect_ratios": {"tiny": {"1.00": [32, 32]}},
            }
        )
    )
    np.save(folder / "d.npy", np.zeros((1, 4, 2, 2), dtype=np.float32))  # below every bucket
    ds = open_dataset(f"latents:{folder}", DataConfig(bucket_config=str(config)))
    # 10 frames are 2 latent frames, 34 are 10: a (3 frames) and c (2) go to 10 frames,
    # cropped to 4x4 latent pixels; the image b to the 1-frame bucket; d fits none.
    assert skipped_samples(ds) == 1 and ds.summary()["samples_skipped"] == 1
    assert [s.grid for s in ds.shapes()] == [(2, 2, 2), (1, 2, 2), (2, 2, 2)]
    assert ds.bucket_names == ["tiny-1.00-10f", "tiny-1.00-1f", "tiny-1.00-10f"]
    assert ds.pack([0, 1]).inputs.shape == (12, 16)


def test_corrupt_and_missing_latents(tmp_path, capsys):
    root = tmp_path / "bad"
    root.mkdir()
    with pytest.raises(DataError, match="folder has no"):
        open_dataset(f"latents:{root}")
    (root / "x.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(DataError, match=r"x\.npy: corrupt or unreadable latent"):
        open_dataset(f"latents:{root}")
    np.save(root / "x.npy", np.zeros((2, 4, 4, 4), dtype=np.float32))
    data = (root / "x.npy").read_bytes()
    (root / "x.npy").write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"x\.npy: corrupt latent file \(truncated"):
        open_dataset(f"latents:{root}")
    (root / "x.npy").unlink()
    (root / "y.safetensors").write_bytes(struct.pack("<Q", 10**9))
    argv = ["schedule", "--dataset", f"latents:{root}", "--world", "2", "--policy", "static"]
    assert main([*argv, "--model", "stdit-1.1b", "--hardware", "h100-sxm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("datacentric schedule: ") and "y.safetensors: corrupt" in err


class SlowPack(SyntheticTextDataset):
    """Packing takes 20 ms per micro-batch (a slow disk or decoder)."""

    def pack(self, sample_ids, pad_to_multiple=1, *, epoch=0):
        time.sleep(0.02)
        return super().pack(sample_ids, pad_to_multiple, epoch=epoch)


def test_prefetch_shrinks_the_data_wait_per_step():
    ds = SlowPack([SampleShape.text(64)] * 16)
    requests = [((i, i + 1), 2) for i in range(0, 16, 2)]

    def run(prefetch: bool) -> float:
        waits = []
        with Prefetcher(ds.pack, depth=2, pin_memory=False) as pack:
            if prefetch:
                pack.expect(requests)
            for ids, sp in requests:
                batch = pack(ids, sp)
                assert batch.sample_ids == ids
                time.sleep(0.03)  # the step's compute, during which workers pack ahead
                waits.append(pack.take_wait_s())
        return sum(waits[1:]) / (len(waits) - 1)  # after the first (cold) step

    without, with_prefetch = run(False), run(True)
    assert without > 0.015
    assert with_prefetch < without / 3


def test_prefetch_out_of_order_still_packs_right():
    ds = SyntheticTextDataset([SampleShape.text(8)] * 4)
    with Prefetcher(ds.pack, depth=2, pin_memory=False) as pack:
        pack.expect([((0,), 1), ((1,), 1)])
        assert torch.equal(pack((2, 3), 2).inputs, ds.pack([2, 3], 2).inputs)
        assert pack.misses == 1 and pack((0,), 1).sample_ids == (0,)


def test_rank_requests_follow_the_schedule():
    from datacentric.schedule import Assignment, Iteration, MicroBatch

    iteration = Iteration(
        index=0,
        assignments=(
            Assignment(
                rank_start=0,
                sp_size=2,
                micro_batches=(MicroBatch((3, 1), "b", 16), MicroBatch((2,), "b", 8)),
            ),
        ),
    )
    assert rank_requests([iteration], 1) == [((3, 1), 2), ((2,), 2)]


def test_a_folder_s_symlinked_shard_of_latents_is_read(folder, tmp_path):
    shard = tmp_path / "shard"
    shard.mkdir()
    np.save(shard / "d.npy", np.zeros((1, 4, 2, 2), dtype=np.float32))
    (folder / "linked").symlink_to(shard)
    names = [e.latent.name for e in read_latent_listing(str(folder))]
    assert names == ["a.npy", "b.safetensors", "c.pt", "d.npy"]


def test_manifest_lines_split_at_line_feed_only(folder):
    # a hand-written manifest (BOM, CRLF) whose JSON strings hold raw U+2028 and U+0085:
    # str.splitlines would cut both lines in two and refuse them as broken JSON
    manifest = folder / "manifest.jsonl"
    lines = [
        '{"latent": "a.npy", "caption": "one\u2028two"}',
        '{"latent": "c.pt", "text": "a.text.npy", "caption": "x\u0085y"}',
    ]
    manifest.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8"))
    ds = LatentDataset(str(folder))
    assert len(ds) == 2 and ds.text_files[1] == folder / "a.text.npy"
    assert [e.where for e in read_latent_listing(str(folder))] == [
        f"{manifest}:1",
        f"{manifest}:2",
    ]


def test_a_bad_bucket_config_is_refused_before_the_listing_is_read(folder, monkeypatch):
    """The settings' bucket config is loaded first: a bad one is named without reading
    the manifest (which may list a million latents)."""
    import datacentric.data.latents as latents

    config = folder / "buckets.json"
    config.write_text("{not json", encoding="utf-8")
    read = []
    monkeypatch.setattr(latents, "read_latent_listing", lambda source: read.append(source))
    with pytest.raises(DataError, match="buckets.json"):
        LatentDataset(str(folder), bucket_config=str(config))
    assert read == []
