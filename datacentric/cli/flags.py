"""Command-line flags of the configuration, and the one vocabulary of the commands.

Every :class:`~datacentric.settings.TrainConfig` field (the torch-free settings
schema) is a ``--section.key`` flag whose help is the field's docstring, default and
choices, and has one short alias, the key with dashes (``--lr`` is ``--training.lr``,
``--log-every`` is ``--metrics.log_every``), spelled the same in every command that
takes the key. Renamed flags keep their old name as a hidden alias that warns
(:func:`add_deprecated_alias`); ``tests/test_flag_vocabulary.py`` walks every command.

The vocabulary (``docs/configuration.md``):

- ``--world N``: the number of ranks, in every command (was ``--gpus``, ``--nproc``);
- ``--policy``: one policy, or a comma-separated list where a command compares several
  (was ``--policies``);
- ``--out DIR``: always a folder; a single JSON file is ``--json-out FILE`` (was ``--out``
  in ``schedule`` and ``calibrate``);
- ``--timeout-s``: a whole launch's limit in seconds (``profile``, ``equivalence``; was
  ``--timeout``); ``--collective-timeout-s`` one collective's (``train``);
- ``--profile-dir`` (was ``--profile`` in ``plan``/``schedule``, ``--out`` in
  ``profile``), ``--max-sp-size`` (was ``--max-sp``), ``--overwrite`` (was ``profile
  --force``), ``--dataset-limit`` (was ``simulate --num-samples``), ``--dataset`` (was
  ``simulate --preset``), ``--max-micro-batch-size`` (was ``plan --max-micro-batch``);
- ``--cost.KEY`` (was ``--profiling.KEY``: ``[profiling]`` now holds the
  ``torch.profiler`` traces).

``profile``, ``plan``, ``schedule``, ``simulate`` and ``bench`` also read ``--config
FILE``: a flag made with :func:`config_option` names its configuration key, and
:func:`apply_config_file` fills the flags not given on the command line from the keys the
file sets, then from the command's defaults. Every option's help shows its default and
choices (:func:`complete_help`).
"""

from __future__ import annotations

import argparse
import typing
from typing import Any

from datacentric.log import get_logger
from datacentric.settings.layout import (
    RENAMED_SECTIONS,
    flat_docs,
    flat_fields,
    flat_types,
    name_in_section,
    renamed_section_of,
    section_of,
)
from datacentric.settings.run_settings import TrainConfig, build_config, file_settings, load_config
from datacentric.settings.schema import choices_of
from datacentric.settings.sections import Policy

#: The policies a ``--policy`` flag accepts (the settings' ``Policy`` choices).
POLICIES: tuple[str, ...] = typing.get_args(Policy)


def section_flag(key: str, section: str | None = None) -> str:
    """``--section.key``: the one section flag of a settings key (``section``: an older
    section name, for its deprecated alias)."""
    return f"--{section or section_of()[key]}.{name_in_section(key)}"


def short_flag(key: str) -> str:
    """The one short alias of a settings key, the same in every command: the key with
    dashes (``--log-every``); ``model_args`` reads ``--model-arg`` (repeatable)."""
    return "--model-arg" if key == "model_args" else "--" + key.replace("_", "-")


def old_section_flags(key: str) -> list[str]:
    """``--old.key`` of every renamed section the key was in (deprecated aliases)."""
    return [section_flag(key, old) for old in RENAMED_SECTIONS if renamed_section_of(old, key)]


class DeprecatedAlias(argparse.Action):
    """A renamed flag's old name: stores into the new flag's ``dest`` and warns once."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs) -> None:
        self.new = new
        self.append = False
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        get_logger().warning(f"datacentric: note: {option_string} is deprecated; use {self.new}")
        value = values if self.nargs != 0 else self.const
        if self.append:
            value = [*(getattr(namespace, self.dest, None) or []), *value]
        setattr(namespace, self.dest, value)


def add_deprecated_alias(
    parser: Any,
    old: str,
    new: str,
    dest: str,
    *,
    like: argparse.Action | None = None,
    **kwargs: Any,
) -> None:
    """Accept ``old`` as a hidden, warning alias of the flag ``new`` (same ``dest``);
    ``like``: the new flag's action, whose type, choices and arity the alias takes (a
    boolean flag's alias also gets its ``--no-`` form)."""
    append = False
    if like is not None:
        if isinstance(like, argparse.BooleanOptionalAction):
            no_new = "--no-" + new[2:]
            add_deprecated_alias(parser, old, new, dest, nargs=0, const=True)
            add_deprecated_alias(parser, "--no-" + old[2:], no_new, dest, nargs=0, const=False)
            return
        append = isinstance(like, argparse._AppendAction)
        kwargs = {"type": like.type, "choices": like.choices, "metavar": like.metavar, **kwargs}
        if like.nargs is not None:
            kwargs.setdefault("nargs", like.nargs)
        if append:
            kwargs.setdefault("nargs", 1)
    action = parser.add_argument(
        old, dest=dest, action=DeprecatedAlias, new=new, help=argparse.SUPPRESS, **kwargs
    )
    action.append = append


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
    """One flag per :class:`TrainConfig` field, grouped by section: ``--section.key`` and
    its short alias (:func:`short_flag`), values defaulting to ``None`` so that unset flags
    keep the file's (or the default) value; ``--quiet`` is ``--log-level warning``."""
    docs = flat_docs()
    kinds = flat_types()
    owners = section_of()
    groups: dict[str, Any] = {}
    for name, field in flat_fields().items():
        section = owners[name]
        group = groups.get(section) or groups.setdefault(
            section, parser.add_argument_group(f"[{section}]")
        )
        kind = kinds[name]
        choices = choices_of(kind)
        help_text = field_help(docs.get(name, ""), field.default, choices)
        options: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
        options.update(_flag_kind(name, kind))
        action = group.add_argument(section_flag(name), short_flag(name), **options)
        action.config_key = name
        for old in old_section_flags(name):
            add_deprecated_alias(parser, old, section_flag(name), name, like=action)
        if name == "log_level":
            group.add_argument(
                "--quiet",
                dest=name,
                action="store_const",
                const="warning",
                help="log only warnings and errors (--log-level warning)",
            )
    add_deprecated_alias(parser, "--nproc", "--world", "world", type=int)
    add_deprecated_alias(parser, "--gpus", "--world", "world", type=int)


def _flag_kind(name: str, kind: Any) -> dict[str, Any]:
    """The argparse type, arity and choices of a settings key's flag."""
    base = _base_type(kind)
    choices = choices_of(kind)
    if base is bool:
        return {"action": argparse.BooleanOptionalAction}
    if name == "betas":
        return {"type": float, "nargs": 2, "metavar": ("BETA1", "BETA2")}
    if name == "model_args":
        return {"type": str, "action": "append", "metavar": "KEY=VALUE"}
    if typing.get_origin(kind) is tuple and typing.get_args(kind)[0] is int:
        return {"type": int_list, "metavar": "N[,N...]"}
    if choices:
        return {"type": str, "choices": choices, "metavar": "{" + ",".join(map(str, choices)) + "}"}
    return {"type": base if base in (int, float) else str, "metavar": name.upper()}


def int_list(text: str) -> tuple[int, ...]:
    """``3,4`` -> ``(3, 4)`` (argparse type of a list-of-integers key)."""
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"needs comma-separated integers (e.g. 3,4), got {text!r}"
        ) from None


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
    overrides = {key: getattr(args, key, None) for key in flat_fields()}
    return load_config(args.config, **overrides)


def config_option(
    container: Any,
    *old_flags: str,
    key: str,
    default: Any = None,
    required: bool = False,
    note: str = "",
    **kwargs: Any,
) -> argparse.Action:
    """The flags of settings key ``key`` in a command that takes ``--config``: its
    section flag and short alias (:func:`section_flag`, :func:`short_flag`), spelled as
    in every other command; ``old_flags`` other than those stay as hidden, deprecated
    aliases (the first one names ``dest``, so the command reads the same attribute).

    Its parsed value is ``None`` when not given; ``default`` (shown in the help) and
    ``required`` are applied after the file is read (:func:`apply_config_file`), so a
    file can supply them. The help is the settings schema's doc of ``key`` in every
    command (``note``: what this command adds, in parentheses after it), and the type
    and choices not given come from it too, so a key means the same thing everywhere."""
    if "help" in kwargs:
        raise TypeError(f"config_option({key!r}): the help comes from the schema; use note=")
    kind = flat_types()[key]
    if "action" not in kwargs and "type" not in kwargs:
        kwargs.update(
            {k: v for k, v in _flag_kind(key, kind).items() if k not in ("metavar", "choices")}
        )
    choices = choices_of(kind)
    if choices and "action" not in kwargs and kwargs.get("type") in (None, str):
        kwargs.setdefault("choices", choices)
    help_text = flat_docs()[key] + (f" ({note})" if note else "")
    if required:
        help_text += f" (required, or [{section_of()[key]}] {name_in_section(key)} in --config)"
    kwargs["help"] = help_text.replace("%", "%%")
    flags = [short_flag(key), section_flag(key)]
    dest = kwargs.pop("dest", None) or (old_flags[0][2:] if old_flags else key).replace("-", "_")
    action = container.add_argument(*flags, dest=dest, default=None, **kwargs)
    action.config_key = key
    action.config_default = default
    action.config_required = required
    for old in [*old_flags, *old_section_flags(key)]:
        if old not in flags:
            add_deprecated_alias(container, old, flags[0], dest, like=action)
    if key == "model":  # every command that takes --model takes its arguments too
        config_option(container, key="model_args", action="append", metavar="KEY=VALUE")
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
            flag = short_flag(action.config_key)
            raise ValueError(f"{flag} is required (or {key} in --config)")
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
    note: str = "",
    from_config: bool = True,
) -> None:
    """``--world N``, the rank count of every command (``--gpus`` and ``--nproc``:
    hidden, deprecated); ``note``: what this command adds to the schema's help;
    ``from_config=False`` for a command without ``--config``."""
    options: dict[str, Any] = {"type": int, "metavar": "N"}
    if from_config:
        config_option(
            container,
            "--world",
            key="world",
            default=default,
            required=required,
            note=note,
            **options,
        )
    else:
        text = flat_docs()["world"] + (f" ({note})" if note else "")
        container.add_argument("--world", default=default, required=required, help=text, **options)
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
        note = "here: several to compare, comma-separated" + note
        options: dict[str, Any] = {"type": policy_list, "metavar": "POLICY[,POLICY...]"}
    else:
        options = {"choices": list(POLICIES)}
    note += "; choices: " + ", ".join(POLICIES)
    action = config_option(
        container,
        "--policy",
        key="policy",
        default=default,
        required=required,
        note=note.removeprefix("; "),
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


LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")


def add_lora_flags(container: Any) -> None:
    """The ``[lora]`` flags (``--lora.rank`` ...), help and types from the schema."""
    for key in LORA_KEYS:
        config_option(container, key=key)


def lora_of_args(args: argparse.Namespace) -> Any:
    """The LoRA spec of a command's ``[lora]`` flags (``None``: off): the run's settings
    when the command read them (``args.settings``), else the flags' own values."""
    from datacentric.models.lora import lora_spec

    settings = getattr(args, "settings", None)
    if settings is not None:
        values = {k: v for k, v in settings.flat().items() if k in LORA_KEYS}
    else:
        values = {k: getattr(args, k, None) for k in LORA_KEYS}
    return lora_spec(
        values["lora_rank"] or 0,
        values["lora_alpha"],
        values["lora_dropout"] or 0.0,
        values["lora_targets"],
    )


def add_timeout_flag(
    parser: argparse.ArgumentParser, default: float, help: str, key: str | None = None
) -> None:
    """``--timeout-s``, a whole launch's limit in seconds (``--timeout``: deprecated);
    ``key``: the configuration key that may set it."""
    options: dict[str, Any] = {"type": float, "default": default, "metavar": "SECONDS"}
    if key:
        config_option(parser, "--timeout-s", key=key, note=help, **options)
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


def add_split_mode_flag(container: Any) -> None:
    """``--split-mode``: which splits of an SP group into Ulysses x ring the plan may
    use (:class:`~datacentric.planning.split_modes.SplitLimitedCostModel`)."""
    from datacentric.planning.split_modes import SPLIT_MODES

    container.add_argument(
        "--split-mode",
        choices=SPLIT_MODES,
        default="hybrid",
        help="SP group splits the plan may use: hybrid (Ulysses x ring, the cheapest per "
        "SP size), ulysses (Ulysses only), ring (every group one ring, as Megatron's ring "
        "CP) (default: %(default)s)",
    )


def limit_splits(cost_model: Any, args: Any) -> Any:
    """``cost_model`` limited to ``--split-mode`` (itself for ``hybrid``)."""
    mode = getattr(args, "split_mode", "hybrid")
    if mode == "hybrid":
        return cost_model
    from datacentric.planning.split_modes import SplitLimitedCostModel

    return SplitLimitedCostModel(cost_model, mode)
