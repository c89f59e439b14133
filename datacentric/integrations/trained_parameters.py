"""Which parameters of a drop-in's run train, and how, as transformers' ``Trainer`` has
them: the ones the user's model holds frozen stay frozen, AdamW takes transformers' two
weight-decay groups; and transformers' count of FLOPs per token over them."""

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
