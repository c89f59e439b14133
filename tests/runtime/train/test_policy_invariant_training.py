"""Training does not depend on the parallel plan: with an explicit global batch in
tokens, ``static``, ``dcp-pac`` and ``dcp-opt`` at world 2, world 4 and in one process
train on the same global batches, so their per-step losses and final weights agree."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import launch
from datacentric.train.data_centric import DataCentric

POLICIES = ("static", "dcp-pac", "dcp-opt")
STEPS = 6
#: Tokens per optimizer step: the samples of step k depend on this, the seed and the
#: epoch only, never on the policy or the world size.
GLOBAL_BATCH_TOKENS = 512
#: Blocks of the llama preset's model: the plans differ at any depth (asserted below), and
#: the cost model is read from the built model, so fewer blocks mean fewer passes to run.
BLOCKS = 2


def train_policies(steps: int = STEPS) -> dict[str, dict]:
    """On this rank: train ``steps`` steps from the same initial weights under every
    policy in turn; per policy the losses, each step's sample ids, the plan's SP sizes
    and the full final weights (fp32, on the CPU)."""
    groups = ProcessGroups() if torch.distributed.is_initialized() else ProcessGroups.local()
    torch.set_num_threads(1)  # up to four ranks share the cores; tiny matmuls gain nothing
    dataset = StdlibCorpus(max_tokens=128, limit=2)
    out = {}
    for policy in POLICIES:
        torch.manual_seed(0)
        model = build_model("llama", num_layers=BLOCKS)
        dc = DataCentric(
            model,
            dataset,
            policy=policy,
            tokens_per_iteration=GLOBAL_BATCH_TOKENS,
            groups=groups,
            prefetch=0,
            check_model=False,
        )
        optimizer = torch.optim.AdamW(dc.model.parameters(), lr=3e-3)
        losses, batches, sp_sizes = [], [], set()
        for step in dc.steps(epochs=None, iterations=steps):
            for micro in step:
                micro.backward(dc.model(micro.batch))
            losses.append(step.finish())
            batches.append(sorted(step.sample_ids))
            sp_sizes.update(group.sp_size for group in step.iteration.assignments)
            optimizer.step()
            optimizer.zero_grad()
        weights = get_model_state_dict(
            dc.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        dc.close()
        out[policy] = {
            "losses": losses,
            "batches": batches,
            "sp_sizes": sorted(sp_sizes),
            "weights": {k: v.detach().float().cpu().clone() for k, v in weights.items()},
        }
    return out


def _relative_norm(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    diff = sum(float((a[k] - b[k]).double().norm() ** 2) for k in a) ** 0.5
    ref = sum(float(b[k].double().norm() ** 2) for k in b) ** 0.5
    return diff / ref


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")  # restores this process's threads after
def test_losses_and_weights_do_not_depend_on_policy_or_world():
    runs = {(1, p): r for p, r in train_policies().items()}
    for world in (2, 4):
        ranks = launch(train_policies, nproc=world, collective_timeout_s=120.0)
        for policy, result in ranks[0].items():
            runs[(world, policy)] = result
            for rank, other in ranks.items():  # every rank saw the same loss and weights
                assert other[policy]["losses"] == result["losses"], (world, policy, rank)
    reference = runs[(1, "static")]
    assert len(reference["losses"]) == STEPS
    # The runs must differ in how they ran the steps, or the test proves nothing.
    assert any(r["sp_sizes"] != [1] for r in runs.values()), {
        k: r["sp_sizes"] for k, r in runs.items()
    }
    for key, run in runs.items():
        assert run["batches"] == reference["batches"], key
        torch.testing.assert_close(
            torch.tensor(run["losses"], dtype=torch.float64),
            torch.tensor(reference["losses"], dtype=torch.float64),
            rtol=1e-5,
            atol=0.0,
            msg=lambda m, key=key: f"{key}: {m}",
        )
        assert _relative_norm(run["weights"], reference["weights"]) <= 1e-4, key
