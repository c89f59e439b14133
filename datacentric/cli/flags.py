"""Command-line flags of the configuration, and the one vocabulary of the commands.

Every :class:`~datacentric.settings.TrainConfig` field (the torch-free settings
schema) is a ``--section.key`` flag whose help is the field's docstring, default and
choices, and has one short alias, the key with dashes (``--lr`` is ``--training.lr``,
``--log-every`` is ``--metrics.log_every``), spelled the same in every command that
takes the key. Renamed flags keep their old name as a hidden alias that warns
(:func:`add_deprecated_alias`); ``tests/runtime/cli/test_flag_vocabulary.py`` walks
every command. A flag's default is the schema's, or its command's own declared with the
reason in :data:`~datacentric.settings.command_defaults.COMMAND_DEFAULTS`
(:func:`finish_command` applies it); the groups of flags several commands offer are
registered in :mod:`datacentric.cli.flag_groups`, one function each, and
``tests/runtime/cli/test_flag_schema.py`` holds every command to the schema.

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
choices (:func:`complete_help`), and a flag's help is one description wherever it is
offered (:func:`described`), with what a command adds as a note after it.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any

from datacentric.log import get_logger
from datacentric.settings.command_defaults import command_override
from datacentric.settings.layout import (
    RENAMED_SECTIONS,
    flat_defaults,
    flat_docs,
    flat_fields,
    flat_types,
    name_in_section,
    renamed_section_of,
    section_of,
)
from datacentric.settings.run_settings import TrainConfig, build_config, file_settings, load_config
from datacentric.settings.scheduling import with_older_names
from datacentric.settings.schema import choices_of


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
        action.description = docs.get(name, "")
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


#: The help of ``--config`` in every command that reads a settings file.
CONFIG_FILE_HELP = (
    "TOML file of settings in sections ([job], [training], ...; see `datacentric config "
    "--show`); flags override it"
)


def add_config_file_flag(parser: argparse.ArgumentParser, used: str = "") -> None:
    """``--config FILE``; ``used`` says which keys a command takes from it."""
    help_text = _with_note(CONFIG_FILE_HELP, used)
    action = parser.add_argument("--config", metavar="FILE.toml", help=help_text)
    described(action, CONFIG_FILE_HELP, used)


def _with_note(description: str, note: str) -> str:
    """A flag's help: its shared description, then what this command adds."""
    return description + (f" ({note})" if note else "")


def described(action: argparse.Action, description: str, note: str = "") -> argparse.Action:
    """Record ``action``'s shared description (the same wherever the flag is offered)
    and the note its command adds; returns ``action``."""
    action.description = description
    action.note = note
    return action


def add_plain_flag(container: Any, *flags: str, help: str, note: str = "", **kwargs: Any) -> Any:
    """A flag of no settings key, offered by several commands: ``help`` is its one
    description, ``note`` what this command adds to it."""
    text = _with_note(help, note).replace("%", "%%")
    return described(container.add_argument(*flags, help=text, **kwargs), help, note)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The resolved config of ``--config`` and the ``--section.key`` flags."""
    overrides = {key: getattr(args, key, None) for key in flat_fields()}
    return load_config(args.config, **overrides)


def config_option(
    container: Any,
    *old_flags: str,
    key: str,
    required: bool = False,
    note: str = "",
    **kwargs: Any,
) -> argparse.Action:
    """The flags of settings key ``key``: its section flag and short alias
    (:func:`section_flag`, :func:`short_flag`), spelled as in every other command;
    ``old_flags`` other than those stay as hidden, deprecated aliases (the first one
    names ``dest``, so the command reads the same attribute).

    The help is the settings schema's doc of ``key`` in every command (``note``: what
    this command adds, in parentheses after it); type and choices not given come from
    it too, and so does the default: the schema's, or the command's own declared in
    :data:`~datacentric.settings.command_defaults.COMMAND_DEFAULTS` (set by
    :func:`finish_command`), so a key means the same thing everywhere. In a command
    that takes ``--config`` the parsed value is ``None`` when not given, and the
    default and ``required`` are applied after the file is read
    (:func:`apply_config_file`), so a file can supply them."""
    if "help" in kwargs or "default" in kwargs:
        raise TypeError(
            f"config_option({key!r}): help and default come from the schema (a command's "
            "own default: settings.command_defaults); use note="
        )
    kind = flat_types()[key]
    if "action" not in kwargs and "type" not in kwargs:
        kwargs.update(
            {k: v for k, v in _flag_kind(key, kind).items() if k not in ("metavar", "choices")}
        )
    choices = choices_of(kind)
    if choices and "action" not in kwargs and kwargs.get("type") in (None, str):
        kwargs.setdefault("choices", choices)
    doc = flat_docs()[key]
    kwargs["help"] = _with_note(doc, note).replace("%", "%%")
    flags = [short_flag(key), section_flag(key)]
    dest = kwargs.pop("dest", None) or (old_flags[0][2:] if old_flags else key).replace("-", "_")
    action = described(container.add_argument(*flags, dest=dest, default=None, **kwargs), doc, note)
    action.config_key = key
    action.config_default = None if required else flat_defaults()[key]
    action.config_required = required
    for old in [*old_flags, *old_section_flags(key)]:
        if old not in flags:
            add_deprecated_alias(container, old, flags[0], dest, like=action)
    if key == "model":  # every command that takes --model takes its arguments too
        config_option(container, key="model_args", action="append", metavar="KEY=VALUE")
    return action


def finish_command(command: str, parser: argparse.ArgumentParser) -> None:
    """Settle the defaults of ``command``'s :func:`config_option` flags (the command's
    own, :func:`~datacentric.settings.command_defaults.command_override`, over the
    schema's), apply them at parse time in a command without ``--config``, and complete
    every option's help with its default and choices (:func:`complete_help`)."""
    takes_file = parser.get_default("config_options") is not None
    for action in parser._actions:
        if not hasattr(action, "config_default"):
            continue
        override = command_override(command, action.config_key)
        if override is not None:
            action.config_default = override.value
            action.shown_default = override.shown
        if action.config_required:
            key = f"[{section_of()[action.config_key]}] {name_in_section(action.config_key)}"
            action.help += f" (required, or {key} in --config)" if takes_file else " (required)"
        if not takes_file:
            value = action.config_default
            appends = isinstance(action, argparse._AppendAction) and value is not None
            action.default = list(value) if appends else value
            action.required = action.config_required
    complete_help(parser)


def enable_config_file(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` to a command whose :func:`config_option` flags are made."""
    options = [a for a in parser._actions if getattr(a, "config_key", None)]
    keys = ", ".join(dict.fromkeys(f"{section_of()[a.config_key]}.{a.config_key}" for a in options))
    add_config_file_flag(parser, f"this command takes {keys} from it")
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
    # the command's whole settings: its defaults, then the file, then the flags given (a
    # setting given replaces its older or newer name: with_older_names)
    from_file_and_defaults = with_older_names(defaults, from_file)
    args.settings = build_config(with_older_names(from_file_and_defaults, _given(options, args)))
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


def shown_default(action: argparse.Action) -> Any:
    """The default an option's help must show (``None``: nothing to show): a command's
    own default chosen at run time as its override describes it, else the value."""
    if getattr(action, "shown_default", None):
        return action.shown_default
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
        if not hasattr(action, "description"):  # a command's own flag: its help as given
            described(action, action.help)
        default = shown_default(action)
        extra = []
        if default is not None and str(default) not in text:
            extra.append(f"default: {default}")
        if action.choices and not all(str(c) in text for c in action.choices):
            extra.append("choices: " + ", ".join(map(str, action.choices)))
        if extra:
            action.help += (" [" + "; ".join(extra) + "]").replace("%", "%%")
