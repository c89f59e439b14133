"""Command-line flags of the configuration, and the one vocabulary of the commands.

Every :class:`~datacentric.settings.TrainConfig` field (the torch-free settings
schema) is a ``--section.key`` flag whose help is the field's docstring, default and
choices; the run settings also answer to their short flat name (``--lr`` is
``--training.lr``). Renamed flags keep their old name as a hidden alias that warns once
(:func:`add_deprecated_alias`).

The vocabulary (``docs/configuration.md``):

- ``--world N``: the number of ranks, in every command (was ``--gpus``, ``--nproc``);
- ``--policy``: one policy, or a comma-separated list where a command compares several
  (was ``--policies``);
- ``--out DIR``: always a folder; a single JSON file is ``--json-out FILE`` (was ``--out``
  in ``schedule`` and ``calibrate``);
- ``--timeout-s``: a whole launch's limit in seconds (``profile``, ``equivalence``; was
  ``--timeout``); ``--collective-timeout-s`` one collective's (``train``).

``profile``, ``plan``, ``schedule``, ``simulate`` and ``bench`` also read ``--config
FILE``: a flag made with :func:`config_option` names its configuration key, and
:func:`apply_config_file` fills the flags not given on the command line from the keys the
file sets, then from the command's defaults. Every option's help shows its default and
choices (:func:`complete_help`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from datacentric.settings.run_settings import (
    TrainConfig,
    build_config,
    file_settings,
    load_config,
    section_of,
)
from datacentric.settings.schema import choices_of, field_docs, field_types
from datacentric.settings.sections import Policy

#: The policies a ``--policy`` flag accepts (the settings' ``Policy`` choices).
POLICIES: tuple[str, ...] = typing.get_args(Policy)

#: Fields that also answer to ``--<field>`` (the flat flags of earlier releases and
#: the everyday settings).
FLAT_ALIASES = (
    "model", "dataset", "dataset_limit", "max_tokens", "tokenizer", "text_field", "long_docs",
    "bucket_config", "policy", "cost_model", "profile_dir", "memory_gb", "tokens_per_iteration",
    "lr", "weight_decay", "betas", "grad_clip", "lr_schedule", "warmup_iterations", "seed",
    "epochs", "iterations", "out", "checkpoint_every", "resume", "resume_from", "keep_last",
    "overwrite", "dtype", "collective_timeout_s", "fault_inject", "timeline", "progress", "world",
    "shard", "reshard_after_forward", "device", "global_batch_tokens", "global_batch_samples",
    "compile", "expect_sha256", "save_on_signal", "lr_horizon",
)  # fmt: skip


class DeprecatedAlias(argparse.Action):
    """A renamed flag's old name: stores into the new flag's ``dest`` and warns once."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(
            f"datacentric: note: {option_string} is deprecated; use {self.new}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values if self.nargs != 0 else self.const)


def add_deprecated_alias(
    parser: argparse.ArgumentParser, old: str, new: str, dest: str, **kwargs: Any
) -> None:
    """Accept ``old`` as a hidden, warning alias of the flag ``new`` (same ``dest``)."""
    parser.add_argument(
        old, dest=dest, action=DeprecatedAlias, new=new, help=argparse.SUPPRESS, **kwargs
    )


def field_help(doc: str, default: Any, choices: tuple[Any, ...] | None) -> str:
    """Help text: description, default and choices (``%`` escaped for argparse)."""
    shown = "unset" if default is None else default
    if isinstance(shown, tuple):
        shown = " ".join(str(v) for v in shown)
    text = f"{doc} [default: {shown}"
    if choices:
        text += "; choices: " + ", ".join(str(c) for c in choices)
    return (text + "]").replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`TrainConfig` field, grouped by section; values default to
    ``None`` so that unset flags keep the file's (or the default) value."""
    docs = field_docs(TrainConfig)
    kinds = field_types(TrainConfig)
    owners = section_of()
    groups: dict[str, Any] = {}
    for field in dataclasses.fields(TrainConfig):
        name = field.name
        section = owners[name]
        group = groups.get(section) or groups.setdefault(
            section, parser.add_argument_group(f"[{section}]")
        )
        flags = [f"--{section}.{name}"]
        if name in FLAT_ALIASES:
            flags.append("--" + name.replace("_", "-"))
        kind = kinds[name]
        choices = choices_of(kind)
        help_text = field_help(docs.get(name, ""), field.default, choices)
        options: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
        base = _base_type(kind)
        if base is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif name == "betas":
            options.update(type=float, nargs=2, metavar=("BETA1", "BETA2"))
        elif name == "model_args":
            flags.append("--model-arg")
            options.update(type=str, action="append", metavar="KEY=VALUE")
        else:
            options["type"] = base if base in (int, float) else str
            options["metavar"] = name.upper()
            if choices:
                options["choices"] = choices
                options["metavar"] = "{" + ",".join(map(str, choices)) + "}"
        group.add_argument(*flags, **options)
    add_deprecated_alias(parser, "--nproc", "--world", "world", type=int)
    add_deprecated_alias(parser, "--gpus", "--world", "world", type=int)


def _base_type(kind: Any) -> Any:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is typing.Literal:
        return str
    if args and typing.get_origin(kind) is not tuple:
        return _base_type(args[0])
    return kind


def add_config_file_flag(parser: argparse.ArgumentParser, used: str = "") -> None:
    """``--config FILE``; ``used`` says which keys a command takes from it."""
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        help="TOML file of settings in sections ([job], [training], ...; see "
        f"`datacentric config --show`){used}; flags override it",
    )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The resolved config of ``--config`` and the ``--section.key`` flags."""
    overrides = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(TrainConfig)}
    return load_config(args.config, **overrides)


def config_option(
    container: Any,
    *flags: str,
    key: str,
    default: Any = None,
    required: bool = False,
    **kwargs: Any,
) -> argparse.Action:
    """A flag that a ``--config`` file's ``key`` may set (see :func:`apply_config_file`).

    Its parsed value is ``None`` when not given; ``default`` (shown in the help) and
    ``required`` are applied after the file is read, so a file can supply them. The
    type, choices and help that are not given come from the settings schema's field
    ``key``, so a key means the same thing in every command."""
    kind = field_types(TrainConfig)[key]
    if "action" not in kwargs and "type" not in kwargs and _base_type(kind) in (int, float):
        kwargs["type"] = _base_type(kind)
    choices = choices_of(kind)
    if choices and "action" not in kwargs and "type" not in kwargs:
        kwargs.setdefault("choices", choices)
    kwargs.setdefault("help", field_docs(TrainConfig).get(key, "").replace("%", "%%"))
    if required:
        kwargs["help"] += f" (required, or [{section_of()[key]}] {key} in --config)"
    action = container.add_argument(*flags, default=None, **kwargs)
    action.config_key = key
    action.config_default = default
    action.config_required = required
    return action


def enable_config_file(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` to a command whose :func:`config_option` flags are made."""
    options = [a for a in parser._actions if getattr(a, "config_key", None)]
    keys = ", ".join(dict.fromkeys(f"{section_of()[a.config_key]}.{a.config_key}" for a in options))
    add_config_file_flag(parser, f"; this command takes {keys} from it")
    parser.set_defaults(config_options=options)


def apply_config_file(args: argparse.Namespace) -> None:
    """Fill the :func:`config_option` flags not given: from ``--config`` (the keys the
    file sets; the whole file is checked), else the flag's default; and set
    ``args.settings``, the command's resolved :class:`~datacentric.settings.TrainConfig`
    (every key, not only those with a flag here: the dataset a command opens from it is
    the one ``train`` opens). Raises ``ValueError`` for a required flag given nowhere."""
    options = getattr(args, "config_options", None)
    if not options:
        return
    from_file = file_settings(args.config) if getattr(args, "config", None) else {}
    defaults = {
        a.config_key: a.config_default
        for a in options
        if a.config_default is not None and not getattr(a, "config_list", False)
    }
    # the command's whole settings: its defaults, then the file, then the flags given
    args.settings = build_config({**defaults, **from_file, **_given(options, args)})
    for action in options:
        if getattr(args, action.dest) is not None:
            continue
        value = from_file.get(action.config_key, action.config_default)
        if value is None and action.config_required:
            key = f"[{section_of()[action.config_key]}] {action.config_key}"
            raise ValueError(f"{action.option_strings[0]} is required (or {key} in --config)")
        setattr(args, action.dest, value)


def _given(options: list[argparse.Action], args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (flags over the file)."""
    return {
        a.config_key: getattr(args, a.dest)
        for a in options
        if getattr(args, a.dest) is not None and not getattr(a, "config_list", False)
    }


def add_world_flag(
    container: Any,
    default: int | None = None,
    required: bool = False,
    help: str = "",
    from_config: bool = True,
) -> None:
    """``--world N``, the rank count of every command (``--gpus`` and ``--nproc``:
    hidden, deprecated); ``from_config=False`` for a command without ``--config``."""
    options: dict[str, Any] = {
        "type": int,
        "metavar": "N",
        "help": help or "number of ranks (GPUs, or gloo processes on CPU)",
    }
    if from_config:
        config_option(
            container, "--world", key="world", default=default, required=required, **options
        )
    else:
        container.add_argument("--world", default=default, required=required, **options)
    for old in ("--gpus", "--nproc"):
        add_deprecated_alias(container, old, "--world", "world", type=int)


def add_policy_flag(
    container: Any,
    *,
    several: bool,
    default: str | None = None,
    required: bool = False,
    note: str = "",
) -> None:
    """``--policy``: one policy, or with ``several`` a comma-separated list
    (``--policies``: hidden, deprecated)."""
    if several:
        help_text = "scheduling policies to compare, comma-separated" + note
        options: dict[str, Any] = {"type": policy_list, "metavar": "POLICY[,POLICY...]"}
    else:
        help_text = "scheduling policy (docs/scheduling.md)"
        options = {"choices": list(POLICIES)}
    help_text += "; choices: " + ", ".join(POLICIES)
    action = config_option(
        container,
        "--policy",
        key="policy",
        default=default,
        required=required,
        help=help_text,
        **options,
    )
    action.config_list = several
    add_deprecated_alias(container, "--policies", "--policy", "policy", **options)


def policy_list(text: str) -> str:
    """A comma-separated list of known policies (argparse type; the text is kept)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or repr(text)}; choose from {', '.join(POLICIES)}"
        )
    return ",".join(names)


def add_json_out_flag(parser: argparse.ArgumentParser, help: str, **kwargs: Any) -> None:
    """``--json-out FILE`` (a file; ``--out`` is a folder in every command). ``--out``
    keeps its old meaning here as a hidden, deprecated alias."""
    parser.add_argument("--json-out", metavar="FILE", help=help, **kwargs)
    add_deprecated_alias(parser, "--out", "--json-out", "json_out", **kwargs)


def add_timeout_flag(
    parser: argparse.ArgumentParser, default: float, help: str, key: str | None = None
) -> None:
    """``--timeout-s``, a whole launch's limit in seconds (``--timeout``: deprecated);
    ``key``: the configuration key that may set it."""
    options: dict[str, Any] = {"type": float, "default": default, "metavar": "SECONDS"}
    if key:
        config_option(parser, "--timeout-s", key=key, help=help, **options)
    else:
        parser.add_argument("--timeout-s", help=help, **options)
    add_deprecated_alias(parser, "--timeout", "--timeout-s", "timeout_s", type=float)


def shown_default(action: argparse.Action) -> Any:
    """The default an option's help must show (``None``: nothing to show)."""
    default = getattr(action, "config_default", action.default)
    hidden = action.help == argparse.SUPPRESS
    if default is None or default is False or default is argparse.SUPPRESS or hidden:
        return None
    if isinstance(default, list | tuple):
        return " ".join(str(v) for v in default)
    return default


def complete_help(parser: argparse.ArgumentParser) -> None:
    """Append the default and the choices to every option's help that lacks them."""
    for action in parser._actions:
        if not action.help or action.help == argparse.SUPPRESS:
            continue
        text = action.help % {**vars(action), "prog": parser.prog} if "%" in action.help else ""
        text = text or action.help
        default = shown_default(action)
        extra = []
        if default is not None and str(default) not in text:
            extra.append(f"default: {default}")
        if action.choices and not all(str(c) in text for c in action.choices):
            extra.append("choices: " + ", ".join(map(str, action.choices)))
        if extra:
            action.help += (" [" + "; ".join(extra) + "]").replace("%", "%%")
