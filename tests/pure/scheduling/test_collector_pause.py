"""An epoch is built with Python's cyclic garbage collector paused (``COLLECTOR_PAUSE``):
off while each step is built, on again between steps the runtime takes and after the
build, and left off where it was off before; nested and concurrent builds share one
pause."""

from __future__ import annotations

import gc
import multiprocessing
import threading

import numpy as np

from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import dcp_opt
from datacentric.scheduling.epoch import COLLECTOR_PAUSE, STEPWISE, CollectorPause
from datacentric.scheduling.pipeline import Pipeline
from datacentric.settings import SchedulingConfig
from datacentric.shapes import SampleShape


def pipeline() -> Pipeline:
    rng = np.random.default_rng(5)
    lengths = np.minimum(20_000, 32 + rng.lognormal(6.0, 1.3, size=80)).astype(int)
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=2)
    options = SchedulingConfig(global_batch_tokens=32_000)
    shapes = [SampleShape.text(int(n)) for n in lengths]
    return Pipeline(shapes, cost, world_size=2, memory_cap_bytes=140_000_000_000, options=options)


def test_steps_are_built_with_the_collector_off_and_it_runs_between_them(monkeypatch) -> None:
    seen: list[bool] = []

    def watched(inp):
        steps = dcp_opt.stepwise(inp)
        inner = steps.steps

        def each():
            for it in inner:
                seen.append(gc.isenabled())
                yield it

        steps.steps = each()
        return steps

    monkeypatch.setitem(STEPWISE, "dcp-opt", watched)
    assert gc.isenabled()
    stream = pipeline().stream(0, policy="dcp-opt", measure=False)
    assert gc.isenabled()
    between = [gc.isenabled() for _ in stream]
    assert stream.schedule().iterations and gc.isenabled()
    assert len(seen) == len(between) > 1
    assert not any(seen) and all(between)  # off while built, on while the runtime runs


def test_the_pause_nests_across_threads_and_keeps_a_collector_that_was_off() -> None:
    pause = CollectorPause()
    started, release = threading.Event(), threading.Event()

    def other() -> None:
        with pause:
            started.set()
            release.wait(5)

    with pause:
        thread = threading.Thread(target=other)
        thread.start()
        started.wait(5)
    assert not gc.isenabled()  # the other build still runs
    release.set()
    thread.join(5)
    assert gc.isenabled()
    gc.disable()
    try:
        with pause, COLLECTOR_PAUSE:
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_a_child_forked_during_a_build_runs_its_collector() -> None:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()

    def report(conn) -> None:
        on = gc.isenabled()
        with COLLECTOR_PAUSE:  # its own builds pause and resume (no lock held)
            off = not gc.isenabled()
        conn.send((on, off, gc.isenabled()))

    with COLLECTOR_PAUSE:
        process = ctx.Process(target=report, args=(child,))
        process.start()
        assert not gc.isenabled()
    assert parent.recv() == (True, True, True)
    process.join(10)
    assert gc.isenabled()
