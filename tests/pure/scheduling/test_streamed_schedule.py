"""An epoch's schedule streams (``Pipeline.stream``): its steps come in order, each
built when it is asked for, and they are the very steps of the whole-epoch build
(``build_schedule``), on every world and policy; a step's samples depend on neither."""

from __future__ import annotations

from multiprocessing import Pipe

import numpy as np
import pytest

from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import static
from datacentric.scheduling.epoch import EpochStream, build_schedule, send_stream
from datacentric.scheduling.pipeline import Pipeline
from datacentric.scheduling.resume import schedule_fingerprint
from datacentric.settings import SchedulingConfig
from datacentric.shapes import SampleShape

POLICIES = ("dcp-opt", "static", "dcp-pac", "megatron-dyncp", "packed")


def mixed_shapes() -> list[SampleShape]:
    """Chat turns of a few hundred tokens, a tail to 24K, and a few long documents."""
    rng = np.random.default_rng(3)
    lengths = np.minimum(24_000, 32 + rng.lognormal(6.0, 1.3, size=160)).astype(int)
    return [SampleShape.text(int(n)) for n in lengths] + [SampleShape.text(30_000)] * 4


def pipeline(world: int) -> Pipeline:
    """A fresh pipeline (its own plan: nothing memoised from another build)."""
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=world)
    options = SchedulingConfig(global_batch_tokens=32_000)
    return Pipeline(
        mixed_shapes(), cost, world_size=world, memory_cap_bytes=140_000_000_000, options=options
    )


def _meta(schedule) -> dict:
    return {k: v for k, v in schedule.meta.items() if k != "plan_seconds"}


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_streamed_epoch_is_the_whole_epochs_schedule(world, policy):
    whole = pipeline(world).schedule(0, policy=policy, measure=False)
    stream = pipeline(world).stream(0, policy=policy, measure=False)
    assert stream.num_steps == len(whole.iterations) > 4
    steps = list(stream)
    assert steps == list(whole.iterations)
    streamed = stream.schedule()
    assert schedule_fingerprint(streamed) == schedule_fingerprint(whole)
    assert streamed.iterations == whole.iterations
    assert _meta(streamed) == _meta(whole)
    streamed.validate()


def test_a_build_whose_loop_reads_no_more_stops_without_a_word(capfd):
    """A loop that stopped within the epoch (``steps(iterations=1)``, then its script
    ended) left the build process writing to a closed pipe: it printed three
    ``BrokenPipeError`` tracebacks on the loop's terminal. It now stops quietly."""
    reader, writer = Pipe(duplex=False)
    reader.close()
    send_stream(pipeline(1).stream(0, policy="static").spec, writer)
    assert capfd.readouterr().err == ""


def test_static_without_a_first_pass_candidate_builds_its_fallback(monkeypatch):
    """Where static's first pass finds no candidate covering the world (a model of 4
    heads at world 3, global batches of 256 tokens), its search falls back to one
    configuration, whose build told its progress to a finalist never counted: an
    ``IndexError`` (list index out of range) in place of the steps or a refusal in words."""
    monkeypatch.setattr(static, "first_pass", lambda inp, told=None: [])
    schedule = pipeline(2).schedule(0, policy="static", measure=False)
    assert len(schedule.iterations) > 4


def test_a_steps_samples_depend_on_neither_the_policy_nor_the_world():
    steps = {
        (world, policy): [
            sorted(it.sample_ids()) for it in pipeline(world).stream(0, policy=policy)
        ]
        for world in (1, 4)
        for policy in ("dcp-opt", "static")
    }
    first = next(iter(steps.values()))
    assert all(s == first for s in steps.values())


def test_dcp_opt_builds_each_step_when_it_is_asked_for():
    """dcp-opt's stream has built one step when its first is taken (the epoch's
    searches aside; the epoch's steps told before it, done 0), and a stream taken in
    parts ends in the whole build."""
    pipe = pipeline(2)
    heard: list[tuple[int, int]] = []
    stream = EpochStream(
        pipe.shapes,
        policy="dcp-opt",
        world_size=2,
        cost_model=pipe.cost_model,
        plan=pipe.plan,
        options=pipe.options,
        on_step=lambda done, total: heard.append((done, total)),
    )
    n = stream.num_steps
    steps = iter(stream)
    first = next(steps)
    assert heard == [(0, n), (1, n)]
    second = next(steps)
    assert heard == [(0, n), (1, n), (2, n)]
    schedule = stream.schedule()  # the rest, then the whole
    assert schedule.iterations[:2] == (first, second)
    assert schedule.iterations == pipeline(2).schedule(0).iterations


@pytest.mark.parametrize("policy", ["dcp-opt", "static"])
def test_a_stream_of_some_samples_is_their_whole_build(policy):
    """A segment re-planned for another world streams the samples left (``sample_ids``)."""
    pipe = pipeline(4)
    left = list(range(0, len(pipe.shapes), 3))
    whole = build_schedule(
        pipe.shapes,
        policy=policy,
        world_size=4,
        cost_model=pipe.cost_model,
        plan=pipe.plan,
        options=pipe.options,
        sample_ids=left,
    )
    stream = pipeline(4).stream(0, sample_ids=left, policy=policy)
    assert list(stream) == list(whole.iterations)
    assert stream.schedule().dropped_sample_ids == whole.dropped_sample_ids


@pytest.mark.parametrize("policy", ["static-reference", "dcp-intra", "dcp-inter"])
def test_every_other_policy_streams_its_whole_epoch(policy):
    """Policies that build their epoch whole stream it too: one step per global batch,
    known before it is built."""
    whole = pipeline(2).schedule(0, policy=policy, measure=False)
    stream = pipeline(2).stream(0, policy=policy, measure=False)
    assert stream.num_steps == len(whole.iterations)
    assert list(stream) == list(whole.iterations)
