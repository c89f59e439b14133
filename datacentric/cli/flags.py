"""Command-line flags of the configuration, and the one vocabulary of the commands.

Every :class:`~datacentric.train.config.TrainConfig` field is a ``--section.key``
flag whose help is the field's docstring, default and choices; the run settings
also answer to their short flat name (``--lr`` is ``--training.lr``). Renamed flags
keep their old name as a hidden alias that warns once (:func:`add_deprecated_alias`).

The vocabulary (``docs/configuration.md``):

- ``--world N``: the number of ranks, in every command (was ``--gpus``, ``--nproc``);
- ``--policy``: one policy, or a comma-separated list where a command compares several
  (was ``--policies``);
- ``--out DIR``: always a folder; a single file is ``--output FILE`` (was ``--out``
  in ``schedule``);
- ``--timeout-s``: a whole launch's limit in seconds; ``--collective-timeout-s`` one
  collective's (was ``--timeout``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from datacentric.train.config import TrainConfig, load_config, section_of
from datacentric.train.config_schema import choices_of, field_docs, field_types

#: Fields that also answer to ``--<field>`` (the flat flags of earlier releases and
#: the everyday settings).
FLAT_ALIASES = (
    "model", "dataset", "dataset_limit", "max_tokens", "tokenizer", "text_field", "long_docs",
    "bucket_config", "policy", "cost_model", "profile_dir", "memory_gb", "tokens_per_iteration",
    "lr", "weight_decay", "betas", "grad_clip", "lr_schedule", "warmup_iterations", "seed",
    "epochs", "iterations", "out", "checkpoint_every", "resume", "resume_from", "keep_last",
    "overwrite", "dtype", "collective_timeout_s", "fault_inject", "timeline", "progress", "world",
    "shard", "reshard_after_forward", "device", "global_batch_tokens", "global_batch_samples",
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
        else:
            options["type"] = base if base in (int, float) else str
            options["metavar"] = name.upper()
            if choices:
                options["choices"] = choices
                options["metavar"] = "{" + ",".join(map(str, choices)) + "}"
        group.add_argument(*flags, **options)
    add_deprecated_alias(parser, "--nproc", "--world", "world", type=int)


def _base_type(kind: Any) -> Any:
    import typing

    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is typing.Literal:
        return str
    if args and typing.get_origin(kind) is not tuple:
        return _base_type(args[0])
    return kind


def add_config_file_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        help="TOML file of settings in sections ([job], [training], ...; see "
        "`datacentric config --show`); flags override it",
    )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The resolved config of ``--config`` and the ``--section.key`` flags."""
    overrides = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(TrainConfig)}
    return load_config(args.config, **overrides)
