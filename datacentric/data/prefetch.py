"""Pack the next micro-batches in the background, and measure the time spent waiting.

A :class:`Prefetcher` is a drop-in ``pack(sample_ids, pad_to_multiple)`` callable (what
the runtime calls for every micro-batch). Tell it what this rank will pack, in order
(:meth:`Prefetcher.expect`, e.g. with :func:`rank_requests` of a schedule); worker
threads then pack up to ``depth`` micro-batches ahead, pinning their tensors on CUDA
machines so the copy to the device can overlap. A call for the micro-batch at the head
of the queue waits for its result; any other call packs it now (still correct, just
not ahead). Either way the seconds spent inside the call are the *data wait*, read and
reset per step with :meth:`Prefetcher.take_wait_s`.

Workers are threads: packing is numpy/torch work and file reads, which release the
interpreter lock, and threads share the dataset's memory maps without copying.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import fields, replace

import torch

from datacentric.batch import PackedBatch
from datacentric.data.base import Pack
from datacentric.schedule import Iteration

Request = tuple[tuple[int, ...], int]
"""(sample ids, pad_to_multiple) of one micro-batch."""


def rank_requests(iterations: Iterable[Iteration], rank: int) -> list[Request]:
    """What ``rank`` packs for ``iterations``, in order: (sample ids, its group's SP size)."""
    out: list[Request] = []
    for iteration in iterations:
        for assignment, micro_batch in iteration.micro_batches_of_rank(rank):
            out.append((tuple(micro_batch.sample_ids), assignment.sp_size))
    return out


def pin_batch(batch: PackedBatch) -> PackedBatch:
    """The batch with every tensor in page-locked memory (fast, asynchronous H2D copies)."""
    pinned = {
        f.name: getattr(batch, f.name).pin_memory()
        for f in fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, **pinned)


class Prefetcher:
    """Background packing of expected micro-batches; call it as ``pack``."""

    def __init__(
        self,
        pack: Pack,
        *,
        depth: int = 2,
        workers: int = 1,
        pin_memory: bool | None = None,
    ) -> None:
        if depth < 1 or workers < 1:
            raise ValueError(f"depth and workers must be >= 1, got {depth} and {workers}")
        self._pack = pack
        self.depth = depth
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prefetch")
        self._waiting: deque[Request] = deque()
        self._running: deque[tuple[Request, Future[PackedBatch]]] = deque()
        self._wait_s = 0.0
        self.hits = 0
        self.misses = 0

    def expect(self, requests: Iterable[Request], pack: Pack | None = None) -> None:
        """Forget what was expected, then expect ``requests`` in order (and pack with
        ``pack`` from now on, e.g. the next epoch's ``epoch_pack``)."""
        self._cancel()
        if pack is not None:
            self._pack = pack
        self._waiting.extend((tuple(int(i) for i in ids), int(pad)) for ids, pad in requests)
        self._fill()

    def __call__(self, sample_ids: Sequence[int], pad_to_multiple: int = 1) -> PackedBatch:
        """The packed micro-batch: the prefetched one if it is next, else packed now."""
        key = (tuple(int(i) for i in sample_ids), int(pad_to_multiple))
        start = time.perf_counter()
        try:
            if self._running and self._running[0][0] == key:
                batch = self._running.popleft()[1].result()
                self.hits += 1
                self._fill()
                return batch
            self.misses += 1
            self._cancel()  # the expected order no longer holds
            return self._make(key)
        finally:
            self._wait_s += time.perf_counter() - start

    def take_wait_s(self) -> float:
        """Seconds spent waiting for data since the last call (e.g. per step)."""
        wait, self._wait_s = self._wait_s, 0.0
        return wait

    def close(self) -> None:
        """Drop pending work and stop the workers."""
        self._cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self, key: Request) -> PackedBatch:
        batch = self._pack(list(key[0]), key[1])
        return pin_batch(batch) if self.pin_memory else batch

    def _fill(self) -> None:
        while self._waiting and len(self._running) < self.depth:
            key = self._waiting.popleft()
            self._running.append((key, self._pool.submit(self._make, key)))

    def _cancel(self) -> None:
        for _, future in self._running:
            future.cancel()
        self._running.clear()
        self._waiting.clear()
