"""Names of a model's state that are aliases: one tensor registered under two names.

An adapter may register a module twice, such as the Hugging Face and diffusers adapters'
``blocks``, the same modules as the wrapped model's layers: ``state_dict()`` then holds
every layer's tensors under both names. A checkpoint stores each tensor once, under its
first name (:func:`without_aliases`); loading puts the aliases back from it
(:func:`with_aliases`), so a checkpoint written before (with both names) loads too.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from datacentric.parallel.runtime import unwrap


def _canonical(name: str) -> str:
    """A parameter name as state dicts write it (no ``torch.compile`` wrapper part)."""
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def alias_names(model: nn.Module) -> dict[str, str]:
    """Each later name of a parameter or buffer registered under several names, mapped
    to its first name (the same on every rank: read from the module structure)."""
    module = unwrap(model)
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    named = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in named:
        name = _canonical(name)
        primary = first.setdefault(id(tensor), name)
        if primary != name:
            aliases[name] = primary
    return aliases


def without_aliases(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (``model``'s state dict) with each aliased tensor under its first name
    only."""
    aliases = alias_names(model)
    return {k: v for k, v in state.items() if k not in aliases or aliases[k] not in state}


def with_aliases(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every alias of ``model`` present again, as its first name's tensor."""
    full = dict(state)
    for alias, primary in alias_names(model).items():
        if alias not in full and primary in full:
            full[alias] = full[primary]
    return full
