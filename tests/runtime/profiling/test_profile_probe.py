"""A reused profile is probed: one measured on a different or busier machine (here: a
doctored one) is measured again, with a note, never reused silently."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from test_planning_profiler import make_profile, runs_from_law

from datacentric.profiling import autoprofile, profiler
from datacentric.profiling.autoprofile import (
    PROBE_MIN_TOLERANCE,
    PROBE_TOLERANCE,
    ProbeResult,
    ensure_profile,
    probe_cases,
    probe_tolerance,
    reusable,
    validation_report,
)
from datacentric.profiling.factory import fitted_cost_model, get_model_spec
from datacentric.profiling.profiler import ProfileSettings, RunCase, RunResult
from datacentric.profiling.store import (
    PROFILE_FILE,
    Profile,
    ProfileError,
    fresh_profile,
    last_checked,
    load_profile,
    save_probe,
    save_profile,
)
from datacentric.settings.sections import CostConfig
from datacentric.shapes import SampleShape

TEXT = SampleShape.text
SETTINGS = ProfileSettings(
    model="llama",
    world_size=1,
    cost=CostConfig(warmup=2, repeats=3),
    spec=get_model_spec("llama"),  # as a run hands it down (RunModel.profile_spec)
)


def test_probe_cases_take_the_largest_micro_batch_per_sp_size() -> None:
    profile = make_profile()
    cases = probe_cases(profile, count=2)
    assert [(c.sp_size, c.shapes, c.depth, c.recompute) for c, _ in cases] == [
        (1, (TEXT(4096),), 2, False),
        (2, (TEXT(4096),), 2, False),
    ]
    for case, seconds in cases:
        point = next(
            p for p in profile.points if p.shapes == case.shapes and p.sp_size == case.sp_size
        )
        assert seconds == pytest.approx(point.base_time_s + 2 * point.block_time_s)


def test_probe_result_compares_against_the_tolerance() -> None:
    case = RunCase((TEXT(64),), 1, 2, False)
    assert ProbeResult(((case, 1.0, 1.2), (case, 2.0, 1.9))).agrees(0.25)
    off = ProbeResult(((case, 1.0, 1.2), (case, 2.0, 2.6)))
    assert off.worst_rel_diff == pytest.approx(0.3)
    assert not off.agrees(0.25)
    assert "64 tokens@SP1: 2000.0 -> 2600.0 ms" in off.describe()


def test_a_recently_checked_profile_is_trusted_without_a_probe(tmp_path, monkeypatch) -> None:
    save_profile(make_profile(world=1), tmp_path)
    old = 1_000_000.0
    os.utime(tmp_path / PROFILE_FILE, (old, old))
    assert last_checked(tmp_path) == old
    save_probe(tmp_path, 0.05)
    assert last_checked(tmp_path) > old

    def no_measure(*args, **kwargs):
        raise AssertionError("a recently checked profile was probed")

    monkeypatch.setattr(autoprofile, "measure", no_measure)
    assert reusable(make_profile(world=1), SETTINGS, tmp_path)


def test_a_saved_profile_is_read_with_when_it_was_checked_only_while_fresh(tmp_path) -> None:
    assert fresh_profile(tmp_path, {}) == (None, 0.0)  # none saved
    saved = make_profile(world=1)
    save_profile(saved, tmp_path)
    save_probe(tmp_path, 0.05)
    profile, checked = fresh_profile(tmp_path, dict(saved.fingerprint))
    assert profile == load_profile(tmp_path) and checked == last_checked(tmp_path) > 0
    stale = {**saved.fingerprint, "world_size": 8}
    assert fresh_profile(tmp_path, stale) == (None, 0.0)


def test_a_model_the_profiler_cannot_describe_is_refused_before_anything_runs(monkeypatch):
    """The profile's block count and attention come from the spec the caller handed,
    checked before the first case runs (a second block kind is refused at once)."""
    from dataclasses import replace

    from datacentric.profiling.factory import get_model_spec

    spec = get_model_spec("llama")
    mixed = replace(spec, block_kinds=("causal", "full") * (spec.num_blocks // 2))

    def no_measure(*args, **kwargs):
        raise AssertionError("measured a model it then refused")

    monkeypatch.setattr(profiler, "measure", no_measure)
    with pytest.raises(ValueError, match="one block kind"):
        profiler.measure_profile(SETTINGS, [TEXT(64)], [1], {}, mixed)


@pytest.mark.slow
def test_a_doctored_profile_is_measured_again_with_a_note(tmp_path, capsys) -> None:
    shapes = [TEXT(64), TEXT(256)]
    measured = ensure_profile(tmp_path, SETTINGS, shapes)
    # As if measured on a machine four times slower (or four times busier), long ago.
    doctored = dataclasses.replace(
        measured,
        points=tuple(
            dataclasses.replace(
                p,
                base_time_s=4 * p.base_time_s,
                block_time_s=4 * p.block_time_s,
                recompute_time_s=4 * p.recompute_time_s,
            )
            for p in measured.points
        ),
    )
    save_profile(doctored, tmp_path)
    os.utime(tmp_path / PROFILE_FILE, (1_000_000.0, 1_000_000.0))
    capsys.readouterr()
    again = ensure_profile(tmp_path, SETTINGS, shapes)
    note = capsys.readouterr().err
    assert "off on this machine now" in note and "measuring it again" in note, note
    assert again != doctored
    assert load_profile(tmp_path) == again
    for case, seconds in probe_cases(again):
        then = next(
            p for p in doctored.points if p.shapes == case.shapes and p.sp_size == case.sp_size
        )
        assert seconds < (then.base_time_s + 2 * then.block_time_s) / 2


def test_probe_tolerance_is_the_spread_the_validation_measured() -> None:
    profile = make_profile()
    assert probe_tolerance(profile) == PROBE_TOLERANCE  # not validated: no spread known

    def validated(spread: float):
        return dataclasses.replace(profile, validation={"time_noise_rel": spread})

    assert probe_tolerance(validated(0.12)) == pytest.approx(0.12)
    assert probe_tolerance(validated(0.001)) == PROBE_MIN_TOLERANCE
    assert probe_tolerance(validated(0.9)) == PROBE_TOLERANCE


@pytest.mark.parametrize(("spread", "reused"), [(0.04, False), (0.15, True)])
def test_a_probe_must_agree_within_the_validated_spread(
    tmp_path, monkeypatch, capsys, spread, reused
) -> None:
    profile = dataclasses.replace(make_profile(world=1), validation={"time_noise_rel": spread})
    save_profile(profile, tmp_path)
    os.utime(tmp_path / PROFILE_FILE, (1_000_000.0, 1_000_000.0))  # long ago: probe
    case = RunCase((TEXT(4096),), 1, 2, False)
    monkeypatch.setattr(
        autoprofile, "probe_profile", lambda *a, **k: ProbeResult(((case, 1.0, 1.1),))
    )
    assert reusable(profile, SETTINGS, tmp_path) is reused
    note = capsys.readouterr().err
    assert ("more than its 5% tolerance" in note) is not reused, note


def test_validation_reports_the_spread_between_sessions() -> None:
    dual = runs_from_law(0.01, 0.2, 0.07, 1000, 5000, 300, 4000)
    case = RunCase(dual[0].case.shapes, 2, 8, False)
    predicted = 0.01 + 8 * 0.2

    def session(seconds: float) -> list[RunResult]:
        return [RunResult(case=case, time_s=seconds, times=(seconds,), memory_bytes=41000)]

    cost = fitted_cost_model(make_profile())
    report = validation_report(cost, [session(1.5), session(1.8), session(1.6)], dual)
    (row,) = report["buckets"]
    assert row["measured_times_s"] == [1.5, 1.8, 1.6]
    assert row["measured_time_s"] == pytest.approx(1.6)  # the median
    assert row["time_noise_rel"] == pytest.approx(0.2)
    assert row["time_rel_err"] == pytest.approx(abs(predicted - 1.6) / 1.6)
    assert report["time_noise_rel"] == pytest.approx(0.2)
    assert report["sessions"] == 3
    assert report["memory_rel_err"] == pytest.approx(0.0)


def test_a_runs_profile_without_the_spec_of_its_model_refuses_before_measuring(tmp_path) -> None:
    """ensure_profile (a training run's) measures with the spec the run read off its
    model (ProfileSettings.spec) and looks nothing up by name: without one it refuses
    before measuring."""
    with pytest.raises(ValueError, match="needs its spec"):
        ensure_profile(tmp_path, dataclasses.replace(SETTINGS, spec=None), [TEXT(64)])


def test_a_resumed_run_keeps_its_saved_profile_however_the_machine_runs_now(
    tmp_path, monkeypatch, capsys
) -> None:
    """A resume rebuilds the schedule its checkpoint's steps ran from the profile that
    made it: a probe finding the machine busier now re-measured it, the rebuilt schedule
    differed and the resume was refused ('resume with the same settings', which it had)."""
    saved = dataclasses.replace(
        make_profile(world=1), fingerprint=autoprofile._fingerprint(SETTINGS, 1)
    )
    save_profile(saved, tmp_path)
    os.utime(tmp_path / PROFILE_FILE, (1_000_000.0, 1_000_000.0))  # long ago: probed
    case = RunCase((TEXT(4096),), 1, 2, False)
    monkeypatch.setattr(  # twice as slow now: off by far more than the tolerance
        autoprofile, "probe_profile", lambda *a, **k: ProbeResult(((case, 1.0, 2.0),))
    )

    def measured_again(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(autoprofile, "measure_profile", measured_again)
    assert ensure_profile(tmp_path, SETTINGS, [TEXT(64)], probe=False) == saved
    assert load_profile(tmp_path) == saved and "off on this machine" not in capsys.readouterr().err
    with pytest.raises(AssertionError, match="measured again"):  # a fresh run measures it
        ensure_profile(tmp_path, SETTINGS, [TEXT(64)])


def _ensure_in_own_folder(root: str) -> tuple[Profile, str]:
    """ensure_profile on a rank of two whose profile folder is its own (as on nodes
    without a shared filesystem): rank 0's holds a fresh profile, rank 1's none; then
    where rank 0's profile.json is a folder (what each rank is told)."""
    import torch.distributed as dist

    settings = dataclasses.replace(SETTINGS, world_size=2)
    found = ensure_profile(Path(root) / f"rank-{dist.get_rank()}", settings, [TEXT(64)])
    try:
        ensure_profile(Path(root) / f"unread-{dist.get_rank()}", settings, [TEXT(64)])
    except ProfileError as err:
        return found, str(err)
    return found, "read"


def test_every_rank_takes_the_profile_rank_0_reads(tmp_path) -> None:
    """Each rank read its own folder: rank 1 measured while rank 0 reused its profile,
    and their collectives crossed until the collective timeout. A profile.json rank 0
    cannot read (a folder) stopped rank 0 alone with a traceback (IsADirectoryError)
    while rank 1 waited for what it read."""
    from datacentric.parallel.launch import spawn

    settings = dataclasses.replace(SETTINGS, world_size=2)
    saved = dataclasses.replace(
        make_profile(world=2), fingerprint=autoprofile._fingerprint(settings, 2)
    )
    save_profile(saved, tmp_path / "rank-0")  # measured now: trusted without a probe
    (tmp_path / "unread-0" / PROFILE_FILE).mkdir(parents=True)
    found = spawn(_ensure_in_own_folder, 2, str(tmp_path), timeout_s=60, collective_timeout_s=20)
    assert [profile for profile, _ in found] == [saved, saved]
    assert not (tmp_path / "rank-1").exists()  # rank 0 alone writes
    path = tmp_path / "unread-0" / PROFILE_FILE
    line = f"{path}: cannot read the profile (Is a directory); make it a readable file or "
    assert [told for _, told in found] == [line + "remove it to re-profile"] * 2, found


def test_a_profile_on_several_nodes_records_the_ranks_of_one_node(monkeypatch) -> None:
    """Measured on 2 nodes of 2 ranks under torchrun, the profile recorded a node of 4
    GPUs (the world), so the plan took groups of 4, across both nodes, as within one.
    The node is the one the run's process groups read (ProfileSettings.ranks_per_node);
    without one, the whole world runs on this machine, as a spawn starts it."""
    from tests.runtime.profiling.test_profile_by_name import measured_without_ranks

    monkeypatch.setattr(profiler, "measure", measured_without_ranks)
    spec = SETTINGS.spec
    for node, recorded in ((2, 2), (None, 4)):
        settings = dataclasses.replace(SETTINGS, world_size=4, ranks_per_node=node)
        found, _ = profiler.measure_profile(settings, [TEXT(64)], [1, 2, 4], {}, spec)
        assert found.gpus_per_node == recorded
        assert autoprofile._fingerprint(settings, 4)["ranks_per_node"] == recorded


def test_a_profile_of_one_node_is_not_reused_on_nodes_of_fewer_ranks(
    tmp_path, monkeypatch, capsys
) -> None:
    """A profile measured on 1 node of 4 ranks (its node: 4) was reused on 2 nodes of 2
    with the same world, where its groups of 4 cross nodes: its fingerprint lacked the
    ranks per node."""
    settings = dataclasses.replace(SETTINGS, world_size=4, ranks_per_node=4)
    saved = dataclasses.replace(
        make_profile(world=4), fingerprint=autoprofile._fingerprint(settings, 4)
    )
    assert saved.fingerprint["ranks_per_node"] == 4
    save_profile(saved, tmp_path)  # measured now: trusted without a probe

    def measured_again(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(autoprofile, "measure_profile", measured_again)
    assert ensure_profile(tmp_path, settings, [TEXT(64)]) == saved  # the same layout
    capsys.readouterr()
    with pytest.raises(AssertionError, match="measured again"):
        ensure_profile(tmp_path, dataclasses.replace(settings, ranks_per_node=2), [TEXT(64)])
    note = "measured with 4 ranks per node and this run has 2: measuring it again"
    assert note in capsys.readouterr().err
