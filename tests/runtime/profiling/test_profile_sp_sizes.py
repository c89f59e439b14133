"""The SP sizes ``datacentric profile`` measures when none are given are those its model
runs: a size its heads do not split among was measured on the ranks, and refused there."""

from __future__ import annotations

import json

import pytest

import datacentric.profiling.profiler as profiler
from datacentric.cli.main import main
from datacentric.profiling.autoprofile import profiled_sp_sizes
from datacentric.profiling.factory import named_spec

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_model_whose_heads_do_not_split_in_two_is_profiled_on_the_sizes_it_runs(
    tmp_path, monkeypatch, capsys
):
    """A 3-head model at --world 2: the profile measured SP 2 as well (every power of two
    dividing the world), and its ranks stopped ('the model has 3 attention heads, not
    divisible by SP size 2'), with no setting to choose the sizes; it measures SP 1."""
    from tests.runtime.profiling.test_profile_by_name import measured_without_ranks

    sizes: set[int] = set()

    def measured(cases, settings):
        sizes.update(case.sp_size for case in cases)
        return measured_without_ranks(cases, settings)

    monkeypatch.setattr(profiler, "measure", measured)
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("40\n100\n250\n", encoding="utf-8")
    argv = ["profile", "--model", "tests.user_models:tiny_gpt", "--lengths", str(lengths)]
    argv += ["--model-arg", "heads=3", "--model-arg", "width=48", "--world", "2"]
    argv += ["--memory-gb", "1", "--profile-dir", str(tmp_path / "p"), "--validate", "0"]
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["profile_reused"] is False
    assert sizes == {1}


def test_the_sizes_follow_the_heads_within_the_powers_of_two_of_the_world():
    four = named_spec("llama")  # 4 heads
    three = named_spec("tests.user_models:tiny_gpt", {"heads": 3, "width": 48})
    assert (four.heads, three.heads) == (4, 3)
    assert profiled_sp_sizes(four, 8) == [1, 2, 4]
    assert profiled_sp_sizes(four, 6) == [1, 2]  # 6 itself is no power of two
    assert profiled_sp_sizes(three, 2) == [1] and profiled_sp_sizes(three, 1) == [1]
