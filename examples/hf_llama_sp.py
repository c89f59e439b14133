"""Train a randomly initialised Hugging Face Llama with data-centric parallelism, on a
schedule written by hand.

Every rank (under ``torchrun``; one process without it) runs a few optimizer steps on the
standard-library corpus with a mixed schedule: even steps put every rank in one Ulysses
SP group (the longest sample alone with every block recomputed, then two more samples),
odd steps give each rank its own group, rank ``r`` accumulating ``r + 1`` micro-batches.
``DataCentric.step(iteration)`` runs any iteration, not only the planner's. Only the
public API; nothing is downloaded.

    torchrun --standalone --nproc-per-node 2 examples/hf_llama_sp.py          # 2 ranks, 8 steps
    torchrun --standalone --nproc-per-node 4 examples/hf_llama_sp.py --steps 4
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from datacentric import DataCentric
from datacentric.data import StdlibCorpus
from datacentric.models import build_model_named
from datacentric.schedule import Assignment, Iteration, MicroBatch


def _micro_batch(ids: list[int], shapes: list, recompute: bool, blocks: int) -> MicroBatch:
    longest = max(shapes[i].tokens for i in ids)
    return MicroBatch(
        sample_ids=tuple(ids),
        bucket=f"t<={longest}",
        tokens=sum(shapes[i].tokens for i in ids),
        recompute=(recompute,) * blocks,
    )


def mixed_iterations(
    shapes: list, world: int, steps: int, num_blocks: int, seed: int = 0
) -> list[Iteration]:
    """``steps`` iterations alternating one SP group of all ranks and groups of one rank."""
    rng = random.Random(seed)
    order = list(range(len(shapes)))
    rng.shuffle(order)
    iterations, cursor = [], 0
    for index in range(steps):
        if index % 2 == 0:  # one SP group: the longest sample alone, recomputed; then two more
            ids = sorted(order[cursor : cursor + 3], key=lambda i: -shapes[i].tokens)
            cursor += 3
            micro = (
                _micro_batch(ids[:1], shapes, True, num_blocks),
                _micro_batch(ids[1:], shapes, False, num_blocks),
            )
            assignments = (Assignment(0, world, micro),)
        else:  # every rank its own group; rank r accumulates r + 1 micro-batches
            assignments = []
            for rank in range(world):
                micro = []
                for _ in range(rank + 1):
                    micro.append(
                        _micro_batch(order[cursor : cursor + 2], shapes, False, num_blocks)
                    )
                    cursor += 2
                assignments.append(Assignment(rank, 1, tuple(micro)))
            assignments = tuple(assignments)
        iteration = Iteration(index=index, assignments=assignments)
        iteration.validate(world)
        iterations.append(iteration)
    return iterations


def layout(iteration: Iteration, world: int) -> str:
    """Each rank's group size and micro-batch count, ``r0:sp2x2 r1:sp2x2``."""
    parts = []
    for rank in range(world):
        group = iteration.assignments_for_rank(rank)[0]
        parts.append(f"r{rank}:sp{group.sp_size}x{group.accumulation_steps}")
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dataset = StdlibCorpus(max_tokens=256, limit=40)  # the first 40 files, 256-byte samples
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = build_model_named("hf:llama")  # an unmodified LlamaForCausalLM, wrapped
    dc = DataCentric(model, dataset, shard="none")
    world = dc.groups.world_size
    iterations = mixed_iterations(dataset.shapes(), world, args.steps, len(model.blocks), args.seed)
    optimizer = torch.optim.AdamW(dc.model.parameters(), lr=args.lr, weight_decay=0.0)
    if dc.rank == 0:
        print(f"Hugging Face Llama, {world} rank(s), mixed SP / accumulation schedule")
        print("step  loss    tokens  groups (sp x micro-batches per rank)       time")
    losses = []
    for iteration in iterations:
        start = time.perf_counter()
        step = dc.step(iteration)
        for micro in step:
            micro.backward(dc.model(micro.batch))
        losses.append(step.finish())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dc.rank == 0:
            print(
                f"{iteration.index:4d}  {losses[-1]:.4f}  {iteration.num_tokens:6d}  "
                f"{layout(iteration, world):40s}  {time.perf_counter() - start:.2f} s"
            )
    if dc.rank == 0:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    dc.close()


if __name__ == "__main__":
    main()
