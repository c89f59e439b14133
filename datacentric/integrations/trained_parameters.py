"""Which parameters of a drop-in's run train, and how, as transformers' ``Trainer`` has
them: the ones the user's model holds frozen stay frozen, AdamW takes transformers' two
weight-decay groups; transformers' count of FLOPs per token over them; and after
``train()``, ``trainer.model`` holding the run's trained tensors where the run keeps
them, as transformers' stays on ``args.device``."""

from __future__ import annotations

from typing import Any

import torch

from datacentric.integrations.stops import stop


def freeze_as_given(command: str, model: Any, module: torch.nn.Module, world: int) -> None:
    """The parameters the user's model object ``model`` holds frozen
    (``requires_grad=False``) frozen in the run's ``module`` too, as transformers'
    optimizer leaves them out; on one rank only: across ranks the gradient sync is wrapped
    around the model before this, for every parameter."""
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    if not frozen:
        return
    if world > 1:
        stop(
            command,
            f"model: {len(frozen)} frozen parameters (requires_grad=False, e.g. "
            f"{min(frozen)}) stay frozen on one rank only, not across {world} ranks; "
            "unfreeze them, or run one process",
        )
    run = dict(getattr(module, "hf", module).named_parameters())  # the hf: adapter's
    missing = sorted(frozen - set(run))
    if missing:
        stop(
            command,
            f"model: {missing[0]} is frozen (requires_grad=False) but the run's model has "
            "no parameter of that name to freeze; unfreeze it",
        )
    for name in frozen:
        run[name].requires_grad_(False)


def decay_groups(
    optimizer: torch.optim.Optimizer,
    module: torch.nn.Module,
    decayed: set[str],
    epsilon: float,
) -> torch.optim.AdamW:
    """``optimizer``'s AdamW over ``module`` in transformers' two groups: weight decay on
    the ``decayed`` parameters (``get_decay_parameter_names``), none on biases and norm
    weights; epsilon ``epsilon`` (``adam_epsilon``)."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    old = optimizer.defaults
    return torch.optim.AdamW(
        [
            {
                "params": [p for n, p in named if n in decayed],
                "weight_decay": old["weight_decay"],
            },
            {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
        ],
        lr=old["lr"],
        betas=old["betas"],
        eps=epsilon,
    )


def flops_per_token(module: Any) -> float:
    """transformers' ``floating_point_ops`` per token: 6 x the parameters outside the
    embeddings (0 for a module without ``num_parameters``)."""
    module = getattr(module, "hf", module)  # datacentric's hf: adapter holds the model
    count = getattr(module, "num_parameters", None)
    return 6.0 * count(exclude_embeddings=True) if callable(count) else 0.0


def share_run_tensors(model: Any, module: torch.nn.Module, device: Any) -> bool:
    """``model`` (``trainer.model`` after ``train()``, holding the exported weights) made
    to hold the run's own tensors, on ``device`` (``args.device``) as transformers leaves
    its ``trainer.model``: the exported weights (with ``load_best_model_at_end``, the best
    checkpoint's) copied into the run's parameters, each of ``model``'s parameters then
    the run's tensor (one copy on the accelerator, not two), its buffers moved there.
    Whether it could: every parameter of the same name, shape and dtype, a plain tensor on
    ``device`` in the run (not sharded, as under FSDP2); else ``model`` is left as it is."""
    run = dict(getattr(module, "hf", module).named_parameters())  # the hf: adapter's
    mine = dict(model.named_parameters())
    device = torch.device(device)
    shareable = mine.keys() == run.keys() and all(
        type(run[n].data) is torch.Tensor
        and run[n].device.type == device.type
        and device.index in (None, run[n].device.index)  # "cuda": the current one
        and (run[n].shape, run[n].dtype) == (p.shape, p.dtype)
        for n, p in mine.items()
    )
    if not (shareable and run):
        return False
    with torch.no_grad():
        for name, param in mine.items():
            run[name].copy_(param)
            param.data = run[name].data
    model.to(next(iter(run.values())).device)  # the buffers (the parameters are there)
    return True
