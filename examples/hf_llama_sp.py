"""Train a randomly initialised Hugging Face Llama with data-centric parallelism.

Two gloo ranks (CPU) run a few optimizer steps on the standard-library corpus
with a mixed schedule: even steps put every rank in one Ulysses SP group (the
long files, split across ranks, blocks recomputed), odd steps give each rank
its own group with a different number of accumulated micro-batches. Attention
runs through transformers' attention interface (``datacentric.models.hf``);
nothing is downloaded.

    python examples/hf_llama_sp.py            # 2 ranks, 8 steps
    python examples/hf_llama_sp.py --world 4 --steps 4
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from datacentric.data import StdlibCorpus
from datacentric.models.hf import build_hf_llama
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import run_step
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.shapes import SampleShape, bucket_name


def corpus() -> StdlibCorpus:
    """The first 40 standard-library files, in samples of at most 256 bytes."""
    return StdlibCorpus(max_tokens=256, limit=40)


def _micro_batch(ids: list[int], shapes: list[SampleShape], recompute: bool, blocks: int):
    return MicroBatch(
        sample_ids=tuple(ids),
        bucket=bucket_name(max((shapes[i] for i in ids), key=lambda s: s.tokens)),
        tokens=sum(shapes[i].tokens for i in ids),
        recompute=(recompute,) * blocks,
    )


def mixed_iterations(
    shapes: list[SampleShape], world: int, steps: int, num_blocks: int, seed: int = 0
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


def train(iterations: list[dict], lr: float, seed: int) -> list[dict]:
    """One rank's training loop (run on every rank by ``spawn``)."""
    groups = ProcessGroups()
    dataset = corpus()
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = build_hf_llama()
    runtime = DataCentricRuntime(
        model, groups, dataset.pack, loss_tokens_function(dataset), sp_sizes=groups.sizes
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    log = []
    for iteration_json in iterations:
        iteration = Iteration.from_json(iteration_json)
        optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        stats = run_step(runtime, iteration).stats
        loss = runtime.global_loss(stats)
        optimizer.step()
        log.append(
            {
                "step": iteration.index,
                "loss": loss,
                "sp_size": stats.sp_size,
                "micro_batches": stats.accumulation_steps,
                "tokens": iteration.num_tokens,
                "time_s": time.perf_counter() - start,
            }
        )
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="gloo ranks (divides 4 heads)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    shapes = corpus().shapes()
    num_blocks = len(build_hf_llama(device="meta").blocks)
    iterations = mixed_iterations(shapes, args.world, args.steps, num_blocks, args.seed)
    logs = spawn(
        train, args.world, [it.to_json() for it in iterations], args.lr, args.seed, timeout_s=600
    )
    print(f"Hugging Face Llama, {args.world} gloo ranks, mixed SP / accumulation schedule")
    print("step  loss    tokens  groups (sp x micro-batches per rank)       time")
    for step, entries in enumerate(zip(*logs)):
        layout = " ".join(
            f"r{r}:sp{e['sp_size']}x{e['micro_batches']}" for r, e in enumerate(entries)
        )
        slowest = max(e["time_s"] for e in entries)
        first = entries[0]
        print(
            f"{step:4d}  {first['loss']:.4f}  {first['tokens']:6d}  {layout:40s}  {slowest:.2f} s"
        )
    losses = [entry["loss"] for entry in logs[0]]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
