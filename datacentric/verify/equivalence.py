"""The equivalence check: one data-centric optimizer step equals one single-process step.

A case is a model (a preset, a tiny Hugging Face model or a user's factory: see
:mod:`datacentric.verify.case_models`), a small dataset and one :class:`Iteration` that mixes
what data-centric parallelism varies: SP group sizes (at world 4: one group of 2
and two groups of 1), accumulation counts (1, 2, 3, ... micro-batches per group),
micro-batch sizes (1 or 2 packed samples) and per-block recomputation (all,
every other, none). The distributed run executes it on ``world`` gloo ranks
through :class:`~datacentric.parallel.runtime.DataCentricRuntime`. The reference
is independent of all of that (:mod:`datacentric.verify.reference`): a fresh,
unmodified model built from the same seed runs its own ``forward`` on each sample
alone, in one process, and the global-batch loss is combined from the per-sample
sums as the loss mode says (mean over loss tokens, or mean over samples of
per-sample means). Both sides run in ``eval()`` mode: every dropout is off (the
report says so). ``datacentric equivalence`` prints the comparison.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from datacentric.models.lora import LoraSpec
from datacentric.parallel.grad_sync import shard_fsdp2, wrap_ddp
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import run_step
from datacentric.planning.heads import (
    allowed_sp_sizes,
    check_max_ring_size,
    check_max_sp_size,
    check_sp_sizes,
)
from datacentric.schedule import Assignment, Iteration, MicroBatch, group_sizes
from datacentric.shapes import SampleShape, bucket_name
from datacentric.verify.case_models import build_case, build_reference, num_blocks
from datacentric.verify.model_contract import check_small_copy
from datacentric.verify.reference import reference_grads, reference_loss

TOLERANCE = 1e-5
"""Largest accepted ``max_rel_grad_err`` in float32."""

ZERO_GRAD_FLOOR = 1e-6
"""A gradient below this fraction of the whole gradient's norm is zero up to float32
rounding: :func:`relative_errors` divides by this floor, not by its own norm."""

WRAPPERS = ("none", "ddp", "fsdp2")
"""How the distributed run holds the model: plain, DDP or FSDP2."""


def mixed_iteration(
    shapes: Sequence[SampleShape],
    world_size: int,
    num_blocks: int,
    seed: int = 0,
    *,
    sizes: Sequence[int] | None = None,
    phases: Sequence[Sequence[int]] | None = None,
) -> Iteration:
    """One iteration mixing SP sizes, accumulation counts and recomputation.

    At ``world_size >= 4`` the first ranks form one SP group (the largest power
    of two that divides the world and is at most half of it) and every other rank
    is a group of one; at world 2 both ranks form one SP group of 2 that runs two
    micro-batches; at world 3 all groups have one rank (so their accumulation
    counts differ). Otherwise group ``g`` runs ``g + 1`` micro-batches of 2 or
    1 samples (alternating) drawn at random (``seed``) from ``shapes``; the SP
    group gets the longest samples. Recomputation cycles through all blocks,
    every other block and none. ``sizes`` replaces the layout (SP size per group,
    in rank order), e.g. ``[1, 1]`` for unequal accumulation at world 2; ``phases``
    gives one such layout per phase of the step (the group layout changing between
    micro-batches), each phase drawing its own samples.
    """
    if phases is None:
        phases = [sizes] if sizes is not None else [default_layout(world_size)]
    layouts = [list(layout) for layout in phases]
    counts = [[g + 1 for g in range(len(lay))] if len(lay) > 1 else [2] for lay in layouts]
    per_batch = [2 - (i % 2) for i in range(sum(map(sum, counts)))]
    needed = sum(per_batch)
    if needed > len(shapes):
        raise ValueError(f"the case needs {needed} samples, the dataset has {len(shapes)}")
    chosen = random.Random(seed).sample(range(len(shapes)), needed)
    patterns = [
        (True,) * num_blocks,
        tuple(b % 2 == 0 for b in range(num_blocks)),
        (False,) * num_blocks,
    ]
    assignments, next_sample, next_batch = [], 0, 0
    for phase, (layout, phase_counts) in enumerate(zip(layouts, counts)):
        size = sum(per_batch[next_batch : next_batch + sum(phase_counts)])
        mine = chosen[next_sample : next_sample + size]
        mine.sort(key=lambda i: -shapes[i].tokens)  # longest first: they go to the SP group
        order = sorted(range(len(layout)), key=lambda g: -layout[g])  # largest group first
        taken = {g: [] for g in order}
        at = 0
        for g in order:
            for _ in range(phase_counts[g]):
                ids = tuple(mine[at : at + per_batch[next_batch]])
                taken[g].append((ids, patterns[next_batch % len(patterns)]))
                at += len(ids)
                next_batch += 1
        next_sample += size
        rank = 0
        for g, sp in enumerate(layout):
            micro_batches = tuple(
                MicroBatch(
                    sample_ids=ids,
                    bucket=bucket_name(max((shapes[i] for i in ids), key=lambda s: s.tokens)),
                    tokens=sum(shapes[i].tokens for i in ids),
                    recompute=recompute,
                )
                for ids, recompute in taken[g]
            )
            assignments.append(Assignment(rank, sp, micro_batches, phase=phase))
            rank += sp
    iteration = Iteration(index=0, assignments=tuple(assignments))
    iteration.validate(world_size)
    return iteration


def split_phases(
    world_size: int, sp_split: tuple[int, int], then: list[int] | None = None
) -> list[list[int]]:
    """The layouts of an ``--sp-split u,r`` step: one group of ``u x r`` (and groups of
    one for the other ranks), then ``then`` (unset: :func:`default_layout`);
    ``ValueError`` when ``u x r`` does not divide the world."""
    ulysses, ring = sp_split
    size = ulysses * ring
    if ulysses < 1 or ring < 1 or world_size % size:
        raise ValueError(
            f"--sp-split {ulysses},{ring} makes a group of {size} ranks, which must divide "
            f"--world {world_size} (both degrees at least 1)"
        )
    return [[size] + [1] * (world_size - size), then or default_layout(world_size)]


def with_ring(iteration: Iteration, *, phase: int, rank_start: int, ring_size: int) -> Iteration:
    """``iteration`` with every micro-batch of the group at ``rank_start`` in ``phase`` run
    on a ring of ``ring_size`` positions (Ulysses over the rest of the group)."""
    assignments = tuple(
        replace(
            a,
            micro_batches=tuple(replace(mb, ring_size=ring_size) for mb in a.micro_batches),
        )
        if (a.phase, a.rank_start) == (phase, rank_start)
        else a
        for a in iteration.assignments
    )
    return replace(iteration, assignments=assignments)


def default_layout(world_size: int, runs: Collection[int] | None = None) -> list[int]:
    """:func:`mixed_iteration`'s group sizes (see there) in rank order; ``runs``: the SP
    sizes the model's heads split among (unset: any), so its SP group is of such a size
    (groups of one rank each when it runs none that fits)."""

    def fits(size: int) -> bool:
        return size == 1 or runs is None or size in runs

    if world_size >= 4:
        sp = max(
            s
            for s in group_sizes(world_size)
            if s <= world_size // 2 and s & (s - 1) == 0 and fits(s)
        )
        return [sp] + [1] * (world_size - sp)
    if world_size == 2 and fits(2):
        return [2]
    return [1] * world_size


@dataclass(frozen=True)
class StepResult:
    """Loss and every parameter gradient of one optimizer step."""

    loss: float
    grads: dict[str, torch.Tensor]
    #: whether every rank ended with bit-identical gradients (True for one process)
    ranks_agree: bool = True


def _full_grad(param: nn.Parameter) -> torch.Tensor:
    grad = param.grad
    if hasattr(grad, "full_tensor"):  # a sharded FSDP2 gradient (collective)
        grad = grad.full_tensor()
    return grad.detach().clone()


def _distributed_worker(
    cases: list[tuple[str, dict[str, Any]]],
    seed: int,
    dtype: torch.dtype,
    wrapper: str,
    model_args: dict[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> list[tuple[float, dict[str, torch.Tensor]]]:
    groups = ProcessGroups()
    out = []
    for model_name, iteration_json in cases:
        model, dataset = build_case(model_name, seed, dtype, model_args, lora)
        model.eval()  # every dropout off, as in the reference
        if wrapper == "ddp":
            model = wrap_ddp(model)
        elif wrapper == "fsdp2":
            model = shard_fsdp2(model, groups)
        iteration = Iteration.from_json(iteration_json)
        runtime = DataCentricRuntime(model, groups, dataset.pack, loss_tokens_function(dataset))
        runtime.check_schedule([iteration])
        loss = run_step(runtime, iteration).loss
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        names = [n.removeprefix("module.") for n, _ in trained]
        grads = [_full_grad(p) for _, p in trained]
        out.append((loss, dict(zip(names, grads))))
    return out


def run_distributed(
    cases: Sequence[tuple[str, Iteration]],
    world_size: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    wrapper: str = "none",
    timeout_s: float = 300.0,
    model_args: dict[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> list[StepResult]:
    """Run each ``(model, iteration)`` case on ``world_size`` spawned gloo ranks (one spawn).

    ``wrapper`` holds the model as is (``"none"``: one gradient all-reduce), in
    DDP (``"ddp"``) or sharded with FSDP2 (``"fsdp2"``).
    """
    if wrapper not in WRAPPERS:
        raise ValueError(f"wrapper must be one of {WRAPPERS}, got {wrapper!r}")
    payload = [(model, iteration.to_json()) for model, iteration in cases]
    per_rank = spawn(
        _distributed_worker,
        world_size,
        payload,
        seed,
        dtype,
        wrapper,
        model_args,
        lora,
        timeout_s=timeout_s,
    )
    results = []
    for case_index in range(len(cases)):
        loss, grads = per_rank[0][case_index]
        agree = all(
            all(torch.equal(grads[n], other[case_index][1][n]) for n in grads)
            for other in per_rank[1:]
        )
        results.append(StepResult(loss=loss, grads=grads, ranks_agree=agree))
    return results


def run_reference(
    model_name: str,
    iteration: Iteration,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    model_args: dict[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> StepResult:
    """The same global batch in one process: the unmodified model on each sample alone
    (:func:`~datacentric.verify.case_models.build_reference`), dropout off; with
    ``lora``, adapted by peft itself."""
    return _reference_step(model_name, iteration, seed, dtype, model_args, lora)[0]


def _reference_step(
    model_name: str,
    iteration: Iteration,
    seed: int,
    dtype: torch.dtype,
    model_args: dict[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> tuple[StepResult, str]:
    """:func:`run_reference`'s result and which code it ran, in words."""
    reference, _ = build_reference(model_name, seed, dtype, model_args, lora)
    loss = reference_loss(reference, iteration.sample_ids())
    loss.backward()
    result = StepResult(loss=float(loss.detach()), grads=reference_grads(reference))
    return result, reference.description


def relative_errors(
    grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]
) -> dict[str, float]:
    """``||g - g_ref|| / ||g_ref||`` per parameter (computed in float64). A parameter
    whose reference gradient is zero up to float32 rounding (a key bias that the
    softmax cancels: its norm below :data:`ZERO_GRAD_FLOOR` times the whole reference
    gradient's) is measured against that floor instead of its own norm."""
    total = sum(float(ref.double().norm()) ** 2 for ref in reference.values()) ** 0.5
    out = {}
    for name, ref in reference.items():
        diff = float((grads[name].double() - ref.double()).norm())
        norm = max(float(ref.double().norm()), ZERO_GRAD_FLOOR * total)
        out[name] = diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))
    return out


def assert_gradients_close(
    result: StepResult, reference: StepResult, *, rtol: float = 1e-5, atol: float = 1e-7
) -> None:
    """``torch.testing.assert_close`` on the loss and on every parameter gradient."""
    if result.grads.keys() != reference.grads.keys():
        raise AssertionError(
            f"parameter names differ: {sorted(set(result.grads) ^ set(reference.grads))[:5]}"
        )
    torch.testing.assert_close(
        torch.tensor(result.loss), torch.tensor(reference.loss), rtol=1e-6, atol=0.0
    )
    for name, ref in reference.grads.items():
        torch.testing.assert_close(
            result.grads[name], ref, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


def check_equivalence(
    models: Sequence[str],
    world_size: int,
    *,
    seed: int = 0,
    tolerance: float = TOLERANCE,
    wrapper: str = "none",
    timeout_s: float = 300.0,
    progress: Callable[[str], None] | None = None,
    phased: bool = False,
    sp_split: tuple[int, int] | None = None,
    model_args: dict[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> list[dict[str, Any]]:
    """Run the distributed step and the reference for each model; one JSON-able report
    each. ``phased``: the step changes its group layout once, from
    :func:`mixed_iteration`'s layout to one group per rank (two phases). ``sp_split``
    ``(u, r)``: a first phase with one group of ``u x r`` ranks running Ulysses over
    ``u`` inside a ring of ``r`` (:func:`split_phases`), then :func:`mixed_iteration`'s
    Ulysses layout. ``model_args``: the model's keyword arguments (``--model-arg``);
    ``lora``: only LoRA adapters train (their gradients are compared)."""
    if sp_split is not None:
        split_phases(world_size, sp_split)  # a split that does not divide the world: first
    cases = [
        (name, _case_iteration(name, world_size, seed, phased, sp_split, model_args, lora))
        for name in models
    ]
    start = time.perf_counter()
    distributed = run_distributed(
        cases,
        world_size,
        seed=seed,
        wrapper=wrapper,
        timeout_s=timeout_s,
        model_args=model_args,
        lora=lora,
    )
    dist_time = time.perf_counter() - start
    reports = []
    for (name, iteration), result in zip(cases, distributed):
        if progress:
            progress(f"{name}: distributed step done, running the single-process reference")
        reference, description = _reference_step(
            name, iteration, seed, torch.float32, model_args, lora
        )
        report = {"model": name, "world": world_size, "wrapper": wrapper}
        report |= _iteration_report(iteration)
        report |= {
            "dtype": "float32",
            "dropout": "off (eval mode, both sides)",
            "lora": lora.to_json() if lora is not None else None,
            "reference": description,
        }
        report |= _comparison_report(result, reference, tolerance)
        reports.append(report | {"distributed_time_s": round(dist_time, 3)})
    return reports


def _case_iteration(
    name: str,
    world_size: int,
    seed: int,
    phased: bool,
    sp_split: tuple[int, int] | None,
    model_args: dict[str, Any] | None,
    lora: LoraSpec | None,
) -> Iteration:
    """The iteration :func:`check_equivalence` runs for model ``name`` (its SP groups of
    sizes the model's heads split among: :func:`default_layout`), checked against the
    model's heads and its SP and ring limits before any rank starts."""
    model, dataset = build_case(name, seed, torch.float32, model_args, lora)
    check_small_copy(model, dataset)  # refusals that show only when it runs
    blocks = num_blocks(model, name)
    heads = int(model.num_heads)
    kv_heads = int(getattr(model, "num_kv_heads", heads))
    base = default_layout(world_size, allowed_sp_sizes(heads, kv_heads))
    layout = [base, [1] * world_size] if phased else None
    if sp_split is not None:
        layout = split_phases(world_size, sp_split, base)
    if layout is None and getattr(model, "max_sp_size", None) == 1:
        layout = [[1] * world_size]  # whole samples only: every group is one rank
    iteration = mixed_iteration(dataset.shapes(), world_size, blocks, seed, phases=layout or [base])
    if sp_split is not None:
        iteration = with_ring(iteration, phase=0, rank_start=0, ring_size=sp_split[1])
    splits = [split for a in iteration.assignments for split in a.splits]
    check_sp_sizes(heads, kv_heads, [u for u, _ in splits])  # before ranks, as they check
    check_max_sp_size(model, [a.sp_size for a in iteration.assignments])
    check_max_ring_size(model, [r for _, r in splits])
    return iteration


def _iteration_report(iteration: Iteration) -> dict[str, Any]:
    """The layout of a checked iteration, as the report gives it."""
    assignments = iteration.assignments
    return {
        "phases": iteration.num_phases,
        "sp_sizes": [a.sp_size for a in assignments],
        "sp_splits": [[list(s) for s in a.splits] for a in assignments],
        "accumulation_counts": [a.accumulation_steps for a in assignments],
        "samples_per_micro_batch": [
            [len(mb.sample_ids) for mb in a.micro_batches] for a in assignments
        ],
        "recomputed_blocks": [[mb.num_recomputed for mb in a.micro_batches] for a in assignments],
        "num_samples": len(iteration.sample_ids()),
        "num_tokens": iteration.num_tokens,
    }


def _comparison_report(
    result: StepResult, reference: StepResult, tolerance: float
) -> dict[str, Any]:
    """The distributed step against the reference: losses, the worst relative gradient
    error and whether it passes."""
    errors = relative_errors(result.grads, reference.grads)
    worst = max(errors, key=errors.__getitem__)
    return {
        "loss_distributed": result.loss,
        "loss_reference": reference.loss,
        "max_rel_grad_err": errors[worst],
        "worst_parameter": worst,
        "num_parameters": len(errors),
        "ranks_agree": result.ranks_agree,
        "tolerance": tolerance,
        "passed": errors[worst] <= tolerance and result.ranks_agree,
    }
