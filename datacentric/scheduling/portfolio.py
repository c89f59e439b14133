"""``dcp-opt``'s steps from other searches: per step, the fastest (estimated makespan
plus exposed gradient sync, :func:`step_seconds`) of its own step, the steps its peers
``static`` and ``dcp-pac`` run on the same global batch (:class:`Portfolio`, on epochs
of at most :data:`PORTFOLIO_SAMPLES` samples; :data:`PEERS`) and the step formed
token-packed as ``megatron-dyncp`` forms it (:class:`TokenPacked`). A search of another
policy runs only where its floor could still win a step
(:mod:`~datacentric.scheduling.peer_bounds`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from datacentric.schedule import Iteration
from datacentric.scheduling import dcp_pac, megatron_dyncp, peer_bounds, static
from datacentric.scheduling.measures import estimated_grad_sync_s, overlaps_grad_sync
from datacentric.scheduling.policy_input import PolicyInput, StepMaker
from datacentric.scheduling.search_steps import set_aside

#: Epochs of at most this many samples also try every step as the peers run it.
PORTFOLIO_SAMPLES = 200_000
#: The policies whose steps dcp-opt's portfolio tries (:class:`Portfolio`): each name's
#: step makers, one per configuration its search keeps for the epoch. (megatron-dyncp's
#: steps are in dcp-opt's own search, :class:`TokenPacked`.)
PEERS: dict[str, Callable[[PolicyInput], list[StepMaker]]] = {
    "static": static.step_makers,
    # the paper's policy: on 1,023 documents of 91K tokens and one of 131K at 64 GPUs
    # (4M-token steps) its per-micro-batch knapsack ran 0.928 of the bound, dcp-opt 0.876
    "dcp-pac": dcp_pac.step_makers,
}
#: The most samples an epoch may have for a peer's search to run in the portfolio (up to
#: :data:`PORTFOLIO_SAMPLES`).
PEER_SAMPLES = {"static": PORTFOLIO_SAMPLES, "dcp-pac": PORTFOLIO_SAMPLES}
#: A peer's step replaces dcp-opt's when this much shorter (relative).
PEER_GAIN = 1e-9


class TokenPacked:
    """Token-packed steps as options of dcp-opt's own search: each global batch formed
    as megatron-dyncp forms it (sequences packed up to a per-rank token cap into CP
    groups, the rank layout re-formed for every micro-batch), under each (recomputation,
    cap) its search keeps for the epoch
    (:func:`~datacentric.scheduling.megatron_dyncp.step_makers`: made once, on the
    first step where a token-packed step could beat dcp-opt's own, by
    :func:`~datacentric.scheduling.peer_bounds.step_floors`). Short documents that
    each fill a fraction of a rank pay a pass's fixed costs once per micro-batch that
    way (120,000 chat turns of about 180 tokens at 8 GPUs: 1.1% shorter than dcp-opt's
    bucket-packed micro-batches). Every step megatron-dyncp runs is then in dcp-opt's
    own search, so its portfolio need not run it (:data:`PEERS`)."""

    def __init__(self, inp: PolicyInput) -> None:
        self.inp = inp
        self.makers: list[StepMaker] | None = None
        self.steps = 0

    def best(self, k: int, chunk: np.ndarray, own: Iteration) -> Iteration:
        """The fastest of ``own`` and the token-packed steps ``k`` of ``chunk``."""
        inp = self.inp
        best, seconds = own, step_seconds(inp, own)
        floors = peer_bounds.step_floors(inp, "megatron-dyncp", [chunk])
        if not peer_bounds.could_win(floors, [seconds], PEER_GAIN):
            return own
        if self.makers is None:
            began = time.process_time()
            try:
                self.makers = megatron_dyncp.step_makers(inp)
            except ValueError:  # no cap and recomputation forms every sampled step
                self.makers = []
            set_aside(inp, time.process_time() - began)  # made once: no step's pace
        for make in self.makers:
            try:
                it = make(k, chunk)
            except ValueError:  # this cap cannot run this step
                continue
            if step_seconds(inp, it) < seconds * (1 - PEER_GAIN):
                best, seconds = it, step_seconds(inp, it)
        self.steps += best is not own
        return best


def step_seconds(inp: PolicyInput, it: Iteration) -> float:
    """Step ``it``'s estimated makespan plus its exposed gradient sync (as the epoch
    estimate and :class:`Portfolio` count it)."""
    cost, world = inp.cost_model, inp.world_size
    reduction = float(cost.grad_sync_time_s(world))
    sync = estimated_grad_sync_s(
        it, cost, inp.view.shapes, reduction, overlaps_grad_sync(cost, world)
    )
    return it.est_makespan_s + sync


class Portfolio:
    """Per step, the fastest (estimated makespan plus exposed gradient sync) of dcp-opt's
    own step and the steps of every finalist configuration of each peer of :data:`PEERS`
    on the same global batch: every configuration a peer may choose is in dcp-opt's
    search space, and the one a peer picks for its epoch is among its finalists, so
    dcp-opt is never behind a peer on any step. A peer's search (its finalists, made
    once for the epoch) runs on the first step where its floor could beat the step held
    (:mod:`~datacentric.scheduling.peer_bounds`); a peer ruled out on every step is
    reported in ``peers_skipped``, one over its :data:`PEER_SAMPLES` in ``peers_dropped``.
    Each step depends only on its own global batch and the epoch's searches."""

    def __init__(self, inp: PolicyInput) -> None:
        self.inp = inp
        self.reduction = float(inp.cost_model.grad_sync_time_s(inp.world_size))
        self.overlap = overlaps_grad_sync(inp.cost_model, inp.world_size)
        self.names = peers_run(inp)
        self.makers: dict[str, list[StepMaker]] = {}
        self.counts = {name: 0 for name in PEERS}

    def total(self, it: Iteration) -> float:
        """Step ``it``'s makespan plus its exposed gradient sync."""
        inp = self.inp
        sync = estimated_grad_sync_s(
            it, inp.cost_model, inp.view.shapes, self.reduction, self.overlap
        )
        return it.est_makespan_s + sync

    def best(self, k: int, chunk: np.ndarray, own: Iteration) -> Iteration:
        """The fastest of ``own`` and the peers' steps ``k`` of ``chunk``."""
        best, seconds, who = own, self.total(own), "dcp-opt"
        for name in self.names:
            floors = peer_bounds.step_floors(self.inp, name, [chunk])
            if not peer_bounds.could_win(floors, [seconds], PEER_GAIN):
                continue
            for make in self._makers(name):
                try:
                    it = make(k, chunk)
                except ValueError:  # this configuration cannot run this step
                    continue
                if self.total(it) < seconds * (1 - PEER_GAIN):
                    best, seconds, who = it, self.total(it), name
        if who != "dcp-opt":
            self.counts[who] += 1
        return best

    def _makers(self, name: str) -> list[StepMaker]:
        if name not in self.makers:
            began = time.process_time()
            try:
                self.makers[name] = PEERS[name](self.inp)
            except ValueError:  # the peer cannot run this epoch at all
                self.makers[name] = []
            set_aside(self.inp, time.process_time() - began)  # made once: no step's pace
        return self.makers[name]

    def settings(self) -> dict:
        """How many steps each peer gave, the peers skipped and those dropped."""
        return {
            "steps_from_peers": dict(self.counts),
            "peers_skipped": [name for name in self.names if name not in self.makers],
            "peers_dropped": [name for name in PEERS if name not in self.names],
        }


def peers_run(inp: PolicyInput) -> list[str]:
    """The peers of :data:`PEERS` whose search the portfolio may run on this epoch (those
    whose :data:`PEER_SAMPLES` allows its size), in order."""
    return [name for name in PEERS if len(inp.active) <= PEER_SAMPLES[name]]
