"""Forward-only passes over a schedule: the held-out loss, the same on any world.

:func:`evaluate_schedule` runs every micro-batch of a schedule's iterations that this
rank holds, forward only (``torch.no_grad``, the model in eval mode, no block
recomputes), through the same sequence-parallel attention and sequence shards as
training, and weights each token as :class:`~datacentric.parallel.loss.LossWeights`
says for the *whole* set of samples (per token: the mean over every loss token of the
set; per sample: the mean over samples of each one's mean). Every loss token lives on
exactly one rank in exactly one micro-batch, so the SUM over ranks of each rank's
weighted sum is the loss a single process computes on the whole set, whatever the
groups and micro-batches (the argument of :mod:`datacentric.parallel.loss`).

Nothing here touches gradients, optimizer state or the random streams: the caller's
generators are restored afterwards (:func:`torch.random.fork_rng`), so a run with
validation trains bitwise as the same run without it. Model state held with FSDP2 is
gathered once before the passes and freed after them (every rank the same collectives,
whatever number of micro-batches it holds); DDP's forward under ``no_grad`` issues none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from datacentric.batch import PackedBatch
from datacentric.parallel.grad_sync import is_fsdp2
from datacentric.parallel.groups import agree_max
from datacentric.parallel.loss import LossWeights
from datacentric.parallel.runtime import DataCentricRuntime, unwrap
from datacentric.parallel.sequence_shards import shard_batch
from datacentric.schedule import Iteration

Pack = Callable[[Sequence[int], int], PackedBatch]
T = TypeVar("T")


def evaluate_schedule(
    runtime: DataCentricRuntime,
    iterations: Sequence[Iteration],
    pack: Pack,
    weights: LossWeights,
    *,
    autocast: AbstractContextManager | None = None,
    on_iteration: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> float | None:
    """The weighted loss of every sample of ``iterations`` under ``weights`` (collective
    over the world: every rank calls it with the same iterations); ``pack`` builds a
    whole micro-batch, ``on_iteration(k)`` is called after iteration ``k``. ``stop()``
    (this rank's stop signal) is agreed before each iteration (one small all-reduce):
    once it is true on any rank, no rank starts another iteration and the loss, not
    whole, is ``None`` on every rank."""
    groups = runtime.groups
    model = runtime.model
    total = torch.zeros((), dtype=torch.float64, device=groups.device)
    devices = [groups.device] if groups.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), _gathered(model):
        was_training = model.training
        model.eval()
        try:
            for k, iteration in enumerate(iterations):
                if stop is not None and agree_max(groups, int(stop()))[0]:
                    return None  # on every rank, at the same iteration
                iteration.validate(groups.world_size)
                for assignment, micro_batch in iteration.micro_batches_of_rank(groups.rank):
                    sp, ring = assignment.sp_size, micro_batch.ring_size
                    group, ring_group = groups.split(assignment.rank_start, sp, ring)
                    full = pack(micro_batch.sample_ids, sp)
                    weights.check_batch(full)
                    shard = shard_batch(full, groups.rank - assignment.rank_start, sp, ring)
                    shard = shard.to(groups.device)
                    with (
                        runtime.attention.use(group, ring_group),
                        runtime.recompute.use(()),
                        autocast or nullcontext(),
                    ):
                        loss_S = model(shard)
                    total += weights.weighted_sum(loss_S.float(), shard).to(torch.float64)
                if on_iteration is not None:
                    on_iteration(k)
        finally:
            model.train(was_training)
    if groups.distributed and groups.world_size > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=groups.world)
    return float(total.item())


class _gathered:
    """FSDP2: every unit's parameters gathered for the passes (kept gathered after each
    forward), then freed and the units' ``reshard_after_forward`` restored (the blocks'
    is the run's setting, the root's off: :func:`~datacentric.parallel.grad_sync.shard_fsdp2`);
    nothing for other models."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.units = [m for m in model.modules() if is_fsdp2(m)]

    def __enter__(self) -> None:
        for unit in self.units:
            unit.set_reshard_after_forward(False, recurse=False)
        for unit in self.units:  # the same collectives, in the same order, on every rank
            unit.unshard()

    def __exit__(self, *exc: object) -> None:
        blocks = bool(getattr(self.model, "_datacentric_equal_passes", False))
        for unit in self.units:
            unit.reshard()
            unit.set_reshard_after_forward(blocks and unit is not self.model, recurse=False)
            _forget_forward_order(unit)


def _forget_forward_order(unit: nn.Module) -> None:
    """Forget the order FSDP2 recorded the passes' forwards in: it keeps each forward's
    order for the next backward's prefetches (private lists only a backward clears), and
    these passes have none, so a rank that ran fewer of them (fewer prompts than ranks)
    would prefetch other all-gathers than the others in the next step's backward: a
    hang. Every rank now starts that step with none recorded."""
    group = getattr(unit._get_fsdp_state(), "_fsdp_param_group", None)
    if group is None:
        return
    indices = getattr(group, "_post_forward_indices", None)  # private: absent, nothing kept
    if indices is not None:
        indices.clear()
    order = getattr(getattr(group, "comm_ctx", None), "post_forward_order", None)
    if order is not None:  # set at FSDP's first forward
        order.clear()


def each_prompt_alone(
    runtime: DataCentricRuntime,
    count: int,
    run: Callable[[nn.Module, int], T],
    stop: Callable[[], bool] | None = None,
) -> list[T | None]:
    """``[run(module, k) for k in range(count)]``, spread over the ranks: prompt ``k`` runs
    on rank ``k % world``, alone (its own SP group of one), forward only, with the model
    in eval mode (FSDP2 state gathered once, the random streams restored after);
    ``module`` is the unwrapped model. Collective (every rank calls it with the same
    ``count``); every rank gets every result. ``stop()`` (this rank's stop signal) is
    agreed before each round of prompts (one on each rank; one small all-reduce): once
    it is true on any rank, no rank starts another prompt, and those not run are
    ``None`` (a rank that was not signalled finishes the prompt it is running, not all
    of its own)."""
    groups = runtime.groups
    model = runtime.model
    module = unwrap(model)
    group, ring = groups.split(groups.rank, 1, 1)
    mine: dict[int, T] = {}
    devices = [groups.device] if groups.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), _gathered(model):
        was_training = model.training
        model.eval()
        try:
            for first in range(0, count, groups.world_size):  # a round: a prompt a rank
                if stop is not None and agree_max(groups, int(stop()))[0]:
                    break
                k = first + groups.rank
                if k < count:
                    with runtime.attention.use(group, ring), runtime.recompute.use(()):
                        mine[k] = run(module, k)
        finally:
            model.train(was_training)
    if groups.distributed and groups.world_size > 1:
        every: list[dict[int, T]] = [{} for _ in range(groups.world_size)]
        dist.all_gather_object(every, mine, group=groups.world)
        mine = {k: v for part in every for k, v in part.items()}
    return [mine.get(k) for k in range(count)]


def generate_tokens(
    runtime: DataCentricRuntime,
    prompts: Sequence[Sequence[int]],
    settings: Sequence[tuple[int, float, torch.Generator]],
    *,
    autocast: AbstractContextManager | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[list[int] | None]:
    """The continuation of each prompt's token ids, ``settings[k] = (new tokens,
    temperature, generator)`` (temperature 0: greedy; else sampled with the generator):
    each prompt runs alone on its rank (:func:`each_prompt_alone`), the model's
    next-token logits (``logits(batch)``) recomputed on the whole sequence per token (no
    cache); collective, every rank gets every continuation. ``stop()`` is asked before
    each token: once it is true, a rank's prompts not yet finished are ``None`` (a stop
    signal waits for one token's forward, not for every prompt's tokens)."""
    device = runtime.groups.device
    return each_prompt_alone(
        runtime,
        len(prompts),
        lambda module, k: _continue(module, list(prompts[k]), *settings[k], autocast, device, stop),
        stop,
    )


def _continue(
    module: nn.Module,
    ids: list[int],
    new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    autocast: AbstractContextManager | None,
    device: torch.device,
    stop: Callable[[], bool] | None = None,
) -> list[int] | None:
    """``new_tokens`` more tokens after ``ids`` from ``module.logits`` (see above);
    ``None`` once ``stop()`` is true."""
    start = len(ids)
    for _ in range(new_tokens):
        if stop is not None and stop():
            return None
        n = len(ids)
        tokens = torch.tensor(ids, dtype=torch.long)
        batch = PackedBatch(
            sample_ids=(0,),
            cu_seqlens=torch.tensor([0, n], dtype=torch.long),
            inputs=tokens,
            targets=tokens,
            position_ids=torch.arange(n, dtype=torch.long),
            segment_ids=torch.zeros(n, dtype=torch.long),
            loss_mask=torch.ones(n, dtype=torch.bool),
        ).to(device)
        with autocast or nullcontext():
            logits = module.logits(batch)[-1].float().cpu()
        if temperature == 0:
            ids.append(int(logits.argmax()))
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    return ids[start:]
