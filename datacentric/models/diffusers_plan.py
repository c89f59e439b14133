"""Context-parallel plans of diffusers transformers, read as data.

A diffusers model class declares where its token sequence is split across a
context-parallel group and where it is gathered again (``_cp_plan``: module path ->
inputs to split, outputs to split, or outputs to gather; ``""`` is the model itself,
``"blocks.*"`` every entry of a list). :func:`install_plan` reads such a plan and puts
one forward hook (or pre-hook) on each module it names; the hooks split and gather
through a :class:`SequenceSplit`, the state of the clips being run, which the adapter
(:mod:`datacentric.models.diffusers_generic`) sets per group of same-shape clips. The
hooks do nothing while no split is set, so the model runs as diffusers wrote it.

How we read a plan (``ContextParallelInput``: ``split_dim``, ``expected_dims``,
``split_output``; ``ContextParallelOutput``: ``gather_dim``, ``expected_dims``):

- a tensor whose rank differs from ``expected_dims`` is left whole, as diffusers does
  (e.g. Wan's per-token ``timestep`` entry when the timestep is one per clip);
- entries for the text conditioning (:data:`KEPT_WHOLE`) are left whole: every rank
  holds the whole text, so a cross-attention needs no communication and gives what a
  split-and-gathered one gives (diffusers splits it for LTX-Video);
- every other split tensor must have the clips' sequence length along ``split_dim``
  (else :class:`UnsupportedVideoModel` names the entry); it is padded with zeros to a
  multiple of the group size and this rank keeps its contiguous chunk. The padding
  rows form their own attention segment, so no real token ever sees them;
- a gathered tensor is gathered in group-rank order and its padding dropped.

Models without a plan get one from their family's declaration (``cp_plan`` of
:data:`~.diffusers_families.FAMILIES`) or are refused in one line naming what is
missing (:data:`REFUSED_MODELS`). :func:`check_supported` is the one check of a class and
its config before anything is built: its family's declaration is looked up once and
read for what it refuses, what its ``forward`` is given and its plan.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from datacentric.models.diffusers_families import Family, FamilyView, declare_plan, family_named


class UnsupportedVideoModel(ValueError):
    """A diffusers model feature the packed, sequence-parallel path cannot run exactly."""


KEPT_WHOLE = ("encoder_hidden_states", "encoder_attention_mask")
"""Forward arguments that carry the text conditioning: never split (see above)."""

DECLARED_CP_PLANS: Mapping[str, dict[str, Any]] = FamilyView(
    lambda family: (family.transformer, family.cp_plan) if family.cp_plan else None,
    name="diffusers_plan.DECLARED_CP_PLANS",
    store=declare_plan,
)
"""Plans we declare for model classes (class name -> plan, in diffusers' format): a view
of the families' ``cp_plan`` (:mod:`~.diffusers_families`: SkyReels-V2, CogVideoX and
HunyuanVideo have no ``_cp_plan``; Flux's splits the text, which ours keeps whole). A
declared plan comes before the class's own. Declare a family (or pass ``cp_plan=`` to
the adapter) to run another model through the generic path; assigning a plan here
(``DECLARED_CP_PLANS[name] = plan``, as before) declares it with a
``DeprecationWarning``."""

REFUSED_MODELS: dict[str, str] = {}
"""Model classes without a plan, and what is missing for the generic path."""


#: forward arguments the adapter fills; any other argument without a default is refused
FILLED = ("hidden_states", "timestep", "encoder_hidden_states", "encoder_attention_mask")

#: config fields whose use needs inputs that latent files do not hold
NEEDS_INPUTS = {"image_dim": "image embeddings", "added_kv_proj_dim": "image embeddings"}


def check_supported(
    model_class: type,
    config: Any,
    cp_plan: dict[str, Any] | None = None,
    family: Family | None = None,
) -> dict[str, Any]:
    """Raise :class:`UnsupportedVideoModel` (one line naming what is missing) unless the
    generic path can train ``model_class`` with ``config`` (a mapping); else return its
    context-parallel plan. Reads the class, its family's declaration (``family``: the
    one its caller looked up, else looked up here by the class's name) and the config
    only: nothing is built."""
    name = model_class.__name__
    for field, what in NEEDS_INPUTS.items():
        if config.get(field) is not None:
            raise UnsupportedVideoModel(f"{name}: {field} is set: {what} are not supported")
    family = family or family_named(name)
    refused = refused_config(model_class, config, family)
    if refused:
        raise UnsupportedVideoModel(refused)
    plan = cp_plan_of(model_class, cp_plan, config, family)
    if name.endswith("Transformer2DModel") and (family is None or family.layout != "tokens"):
        raise UnsupportedVideoModel(
            f"{name} is an image model: its pipeline packs the latents into image tokens "
            "with position inputs of its own, which no family in diffusers_families declares "
            "(the generic path would give it a 5-D video)"
        )
    params = inspect.signature(model_class.forward).parameters
    missing = [
        p
        for p, spec in list(params.items())[1:]
        if spec.default is inspect.Parameter.empty
        and spec.kind not in (spec.VAR_POSITIONAL, spec.VAR_KEYWORD)
        and p not in FILLED + (family.fills if family else ())
    ]
    if missing:
        raise UnsupportedVideoModel(
            f"{name}: its forward needs {', '.join(missing)}, which latent files do not "
            "hold (the generic path gives latents, timesteps and text embeddings)"
        )
    return plan


def refused_config(model_class: type, config: Any, family: Family | None = None) -> str | None:
    """What a config of ``model_class`` needs that latent files do not hold (its
    family's ``refused``; ``family``: its declaration, looked up by the class's name
    when not given), or None."""
    family = family or family_named(model_class.__name__)
    for name, (runs, what) in (family.refused if family else {}).items():
        value = config.get(name, runs)
        if value is not None and value != runs:
            return f"{model_class.__name__}: {name} = {value!r}: {what} is not supported"
    return None


def cp_plan_of(
    model_class: type,
    plan: dict[str, Any] | None = None,
    config: Any = None,
    family: Family | None = None,
) -> dict[str, Any]:
    """The context-parallel plan to run a model of ``model_class`` with: ``plan``, else
    its family's declared plan (``family``: its declaration, looked up by the class's
    name when not given), else the class's own ``_cp_plan``; else
    :class:`UnsupportedVideoModel` naming what is missing. With ``config`` (a mapping),
    a plan that names blocks by their index must fit its block count."""
    name = model_class.__name__
    family = family or family_named(name)
    declared = family.cp_plan if family is not None else None
    found = plan or declared or getattr(model_class, "_cp_plan", None)
    if found:
        if config is not None:
            _check_plan_blocks(name, found, config)
        return found
    reason = REFUSED_MODELS.get(name, "declares no _cp_plan (where its sequence is split")
    if name not in REFUSED_MODELS:
        reason += " and gathered), and none is declared in diffusers_plan.DECLARED_CP_PLANS"
    raise UnsupportedVideoModel(f"{name} {reason}")


#: the block lists a plan key may index, and the config field that counts their blocks
_BLOCK_LISTS = {"blocks": "num_layers", "transformer_blocks": "num_layers"}


def _check_plan_blocks(name: str, plan: dict[str, Any], config: Any) -> None:
    """A plan that names blocks by their index (Helios's names each of its 40 blocks)
    fits the config's block count, else :class:`UnsupportedVideoModel` saying so."""
    for parent, field in _BLOCK_LISTS.items():
        count = config.get(field, None)
        named = [
            (int(index), key)
            for key in plan
            for atom, index in zip(key.split("."), key.split(".")[1:])
            if atom == parent and index.isdigit()
        ]
        if not isinstance(count, int) or not named or max(named)[0] < count:
            continue
        first = min((index, key) for index, key in named if index >= count)[1]
        written = max(named)[0] + 1
        raise UnsupportedVideoModel(
            f"{name}'s own context-parallel plan names {first!r}: it is written for {written} "
            f"blocks, and this config has {field} = {count}; use {written} blocks, or pass a "
            f"plan for {count} (cp_plan=)"
        )


@dataclass
class SequenceSplit:
    """The clips being run and their group: ``seq_len`` tokens each (the model's own
    patches), split into ``sp`` chunks of ``padded // sp``; this rank keeps chunk ``rank``.
    ``gather(x, dim)`` concatenates every rank's ``x`` along ``dim`` (differentiable)."""

    seq_len: int
    padded: int
    sp: int
    rank: int
    gather: Callable[[torch.Tensor, int], torch.Tensor]

    def split(self, x: torch.Tensor, dim: int, what: str) -> torch.Tensor:
        """This rank's chunk of ``x`` along ``dim`` (padded with zeros first)."""
        if x.shape[dim] != self.seq_len:
            raise UnsupportedVideoModel(
                f"the context-parallel plan splits {what} of length {x.shape[dim]} along "
                f"dimension {dim}, not the video sequence of {self.seq_len} tokens"
            )
        if self.sp == 1:
            return x
        if self.padded > self.seq_len:
            pad_shape = list(x.shape)
            pad_shape[dim] = self.padded - self.seq_len
            x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
        return x.chunk(self.sp, dim=dim)[self.rank]

    def unsplit(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's chunk gathered along ``dim``, without the padding."""
        if self.sp == 1:
            return x
        return self.gather(x.contiguous(), dim).narrow(dim, 0, self.seq_len)


def _modules_named(model: nn.Module, path: str) -> list[nn.Module]:
    """The modules a plan key names (``""``: the model; one ``*`` expands a list)."""
    found = [model]
    for atom in path.split(".") if path else []:
        step = []
        for module in found:
            if atom == "*":
                step.extend(module.children())
            elif hasattr(module, atom):
                step.append(getattr(module, atom))
            else:
                raise UnsupportedVideoModel(
                    f"the context-parallel plan names {path!r}, but {type(model).__name__} "
                    f"has no submodule {atom!r}"
                )
        found = step
    return found


def _as_list(entry: Any) -> list[Any]:
    return list(entry) if isinstance(entry, (list, tuple)) else [entry]


def _applies(x: Any, spec: Any) -> bool:
    expected = getattr(spec, "expected_dims", None)
    return isinstance(x, torch.Tensor) and (expected is None or x.dim() == expected)


def install_plan(
    model: nn.Module, plan: dict[str, Any], current: Callable[[], SequenceSplit | None]
) -> list[RemovableHandle]:
    """Hooks that split and gather as ``plan`` says, through ``current()`` (no-ops while
    it returns ``None``). Returns the handles (``handle.remove()`` undoes them)."""
    handles = []
    for path, entry in plan.items():
        for module in _modules_named(model, path):
            if isinstance(entry, dict):
                inputs = {k: v for k, v in entry.items() if not _as_list(v)[0].split_output}
                outputs = {k: v for k, v in entry.items() if _as_list(v)[0].split_output}
                if inputs:
                    hook = _input_splitter(module, path, inputs, current)
                    handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
                if outputs:
                    hook = _output_splitter(path, outputs, current)
                    handles.append(module.register_forward_hook(hook))
            else:
                hook = _output_gatherer(path, _as_list(entry), current)
                handles.append(module.register_forward_hook(hook))
    return handles


def _input_splitter(
    module: nn.Module, path: str, inputs: dict[str, Any], current: Callable[[], Any]
) -> Callable[..., Any]:
    signature = inspect.signature(type(module).forward)  # the class's: blocks may be wrapped

    def hook(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        split = current()
        if split is None:
            return None
        bound = signature.bind(mod, *args, **kwargs)
        for name, spec in inputs.items():
            value = bound.arguments.get(name)
            if name in KEPT_WHOLE or value is None:
                continue
            if isinstance(value, (list, tuple)):
                specs = _as_list(spec)
                value = type(value)(
                    split.split(v, s.split_dim, f"{path or 'the model'}'s {name}[{i}]")
                    if _applies(v, s) and not s.split_output
                    else v
                    for i, (v, s) in enumerate(zip(value, specs))
                )
            elif _applies(value, spec):
                value = split.split(value, spec.split_dim, f"{path or 'the model'}'s {name}")
            bound.arguments[name] = value
        return bound.args[1:], bound.kwargs

    return hook


def _outputs(output: Any) -> tuple[list[Any], bool]:
    if isinstance(output, torch.Tensor):
        return [output], True
    return list(output), False


def _output_splitter(
    path: str, outputs: dict[int, Any], current: Callable[[], Any]
) -> Callable[..., Any]:
    def hook(mod: nn.Module, args: tuple, output: Any) -> Any:
        split = current()
        if split is None:
            return None
        values, single = _outputs(output)
        for index, spec in outputs.items():
            if _applies(values[index], spec):
                values[index] = split.split(values[index], spec.split_dim, f"{path}[{index}]")
        return values[0] if single else type(output)(values)

    return hook


def _output_gatherer(
    path: str, specs: Sequence[Any], current: Callable[[], Any]
) -> Callable[..., Any]:
    def hook(mod: nn.Module, args: tuple, output: Any) -> Any:
        split = current()
        if split is None:
            return None
        values, single = _outputs(output)
        if len(values) != len(specs):
            raise UnsupportedVideoModel(
                f"the context-parallel plan gathers {len(specs)} outputs of {path!r}, "
                f"which returned {len(values)}"
            )
        for i, spec in enumerate(specs):
            if spec is not None and _applies(values[i], spec):
                values[i] = split.unsplit(values[i], spec.gather_dim)
        return values[0] if single else type(output)(values)

    return hook
