"""Workload presets: determinism and the distribution facts they promise."""

from collections import Counter

import pytest

from datacentric.data.workloads import (
    apportion,
    get_workload,
    list_workloads,
    video_bucket_shapes,
    workload_from_lengths,
    zipf_weights,
)
from datacentric.shapes import SampleShape

OPENSORA = ["opensora-short", "opensora-balanced", "opensora-long"]


def test_list_has_every_preset():
    assert set(list_workloads()) >= {*OPENSORA, "sft-longtail", "stdlib-code"}


def test_unknown_preset_names_choices():
    with pytest.raises(ValueError, match="opensora-short"):
        get_workload("nope")


def test_apportion_sums_and_is_proportional():
    counts = apportion(1001, [3, 1, 1])
    assert sum(counts) == 1001 and counts[0] == 601
    assert apportion(0, [1, 2]) == [0, 0]


def test_zipf_weights_decrease_and_normalise():
    w = zipf_weights(20, 3.0, 5)
    assert abs(sum(w) - 1) < 1e-12
    assert all(a > b for a, b in zip(w, w[1:]))
    assert w[0] / w[1] == pytest.approx((7 / 6) ** 3)


@pytest.mark.parametrize("name", OPENSORA)
def test_opensora_determinism_and_mixing(name):
    a = get_workload(name, seed=3, num_samples=5100)
    b = get_workload(name, seed=3, num_samples=5100)
    c = get_workload(name, seed=4, num_samples=5100)
    assert a.shapes == b.shapes
    assert a.shapes != c.shapes and Counter(a.shapes) == Counter(c.shapes)
    assert len(a.shapes) == 5100
    videos = [s for s in a.shapes if s.grid[0] > 1]
    assert len(videos) == 100  # 50 images per video
    assert (a.model, a.hardware) == ("stdit-1.1b", "h100-sxm")


def test_opensora_shapes_shift_with_preset():
    images, videos = video_bucket_shapes()
    assert len(images) == 5 and len(videos) == 20
    assert videos[-1].grid == (120, 45, 80) and images[0].grid == (1, 9, 16)
    mean = {}
    for name in OPENSORA:
        shapes = get_workload(name).shapes
        vids = [s.tokens for s in shapes if s.grid[0] > 1]
        mean[name] = sum(vids) / len(vids)
        counts = Counter(shapes)
        if name == "opensora-balanced":
            assert len({counts[v] for v in videos}) == 1
        if name == "opensora-short":
            assert counts[videos[0]] > counts[videos[-1]] * 50
        if name == "opensora-long":
            assert counts[videos[-1]] > counts[videos[0]] * 50
    assert mean["opensora-short"] < mean["opensora-balanced"] < mean["opensora-long"]
    assert len(get_workload("opensora-short").shapes) == 2000 * 51


def test_sft_longtail_facts():
    w = get_workload("sft-longtail", seed=1, num_samples=20_000)
    assert w.shapes == get_workload("sft-longtail", seed=1, num_samples=20_000).shapes
    lengths = [s.tokens for s in w.shapes]
    long = [n for n in lengths if n >= 16_000]
    assert len(long) == 22  # 0.11% of 20,000
    assert 30_000 < sorted(long)[len(long) // 2] < 45_000
    short = sorted(n for n in lengths if n < 16_000)
    assert 900 < short[len(short) // 2] < 1150
    assert (w.model, w.hardware) == ("llama-7b", "h200-sxm")


def test_lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("# comment\n100\n2 3 4\n")
    w = workload_from_lengths(str(path))
    assert w.shapes == (SampleShape.text(100), SampleShape.video(2, 3, 4))
    assert w.model == "stdit-1.1b"
    path.write_text("7\n")
    assert workload_from_lengths(str(path), hardware="h100-sxm").hardware == "h100-sxm"
    assert workload_from_lengths(str(path)).model == "llama-7b"
