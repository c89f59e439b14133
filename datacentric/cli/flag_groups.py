"""The flag groups several commands offer, each registered by one function here.

A group is the same flags with the same help in every command that offers it: the
model (``--model``, ``--model-arg`` and the ``[lora]`` flags), the hardware, the memory
budget and the model's sharding, the world, the policy, the dataset (``--dataset`` or
``--lengths`` and the ``[data]`` flags), the global batch, the launch timeout and the
outputs (``--out``, ``--json``, ``--json-out``). A flag of a settings key is a
:func:`~datacentric.cli.flags.config_option`: name, help, type, choices and default from
the schema, or from the command's own default declared in
:data:`~datacentric.settings.command_defaults.COMMAND_DEFAULTS`; a command adds to a
flag's help only a ``note``. ``tests/runtime/cli/test_flag_schema.py`` holds every
command to this.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from datacentric.cli.flags import add_deprecated_alias, add_plain_flag, config_option
from datacentric.settings.scheduling import POLICY_NAMES

#: The ``[data]`` keys that shape a ``--dataset`` source (docs/data.md), after
#: ``--dataset`` itself, so that ``train`` and every command open the same samples.
DATA_KEYS = (
    "max_tokens",
    "dataset_limit",
    "tokenizer",
    "text_field",
    "long_docs",
    "loss_on",
    "bucket_config",
)

LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")

#: The one help of each shared flag of no settings key.
HARDWARE_HELP = "hardware preset: h100-sxm, h200-sxm or cpu-local (docs/planning.md)"
LENGTHS_HELP = "file of sample shapes, one per line: TOKENS, or FRAMES HEIGHT WIDTH"
JSON_HELP = "print one JSON object on stdout"
JSON_OUT_HELP = "write JSON to this file (a file; --out is a folder)"
SKIP_UNFITTABLE_HELP = "drop buckets no configuration fits"
MEMORY_FRACTION_HELP = (
    "analytic: share of the hardware's memory budgeted when --memory-gb is not given"
)
SPLIT_MODE_HELP = (
    "SP group splits the plan may use: hybrid (Ulysses x ring, the cheapest per SP size), "
    "ulysses (Ulysses only), ring (every group one ring, as Megatron's ring CP)"
)


def add_world_flag(container: Any, *, required: bool = False, note: str = "") -> None:
    """``--world N``, the rank count of every command (``--gpus`` and ``--nproc``:
    hidden, deprecated)."""
    config_option(
        container,
        "--world",
        "--gpus",
        "--nproc",
        key="world",
        type=int,
        metavar="N",
        required=required,
        note=note,
    )


def add_policy_flag(container: Any, *, several: bool, note: str = "") -> None:
    """``--policy``: one policy, or with ``several`` a comma-separated list
    (``--policies``: hidden, deprecated)."""
    if several:
        note = "here: several to compare, comma-separated" + note
        options: dict[str, Any] = {"type": policy_list, "metavar": "POLICY[,POLICY...]"}
    else:
        options = {"choices": list(POLICY_NAMES)}
    note += "; choices: " + ", ".join(POLICY_NAMES)
    action = config_option(
        container,
        "--policy",
        key="policy",
        note=note.removeprefix("; "),
        **options,
    )
    action.config_list = several
    add_deprecated_alias(container, "--policies", "--policy", "policy", **options)


def policy_list(text: str) -> str:
    """A comma-separated list of known policies (argparse type; the text is kept)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICY_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or repr(text)}; "
            f"choose from {', '.join(POLICY_NAMES)}"
        )
    return ",".join(names)


def add_model_flags(container: Any, *, note: str = "", lora: bool = True) -> None:
    """``--model`` and ``--model-arg`` (its keyword arguments), with ``lora`` the
    ``[lora]`` flags too (:func:`add_lora_flags`)."""
    config_option(container, "--model", key="model", note=note)
    if lora:
        add_lora_flags(container)


def add_lora_flags(container: Any) -> None:
    """The ``[lora]`` flags (``--lora.rank`` ...), help and types from the schema."""
    for key in LORA_KEYS:
        config_option(container, key=key)


def lora_of_args(args: argparse.Namespace) -> Any:
    """The LoRA spec of a command's ``[lora]`` section (``None``: off): the run's settings'
    when the command read them (``args.settings``), else the section of its ``[lora]``
    flags; converted by the one conversion,
    :func:`~datacentric.models.model_args.lora_of`."""
    from datacentric.models.model_args import lora_of
    from datacentric.settings.layout import name_in_section
    from datacentric.settings.sections import LoraConfig

    settings = getattr(args, "settings", None)
    if settings is not None:
        return lora_of(settings.lora)
    given = {name_in_section(k): getattr(args, k, None) for k in LORA_KEYS}
    return lora_of(LoraConfig(**{k: v for k, v in given.items() if v is not None}))


def add_hardware_flag(container: Any, *, note: str = "", **kwargs: Any) -> None:
    """``--hardware PRESET`` (``kwargs``: a command's default and choices)."""
    add_plain_flag(container, "--hardware", help=HARDWARE_HELP, note=note, **kwargs)


def add_dataset_flags(
    parser: argparse.ArgumentParser,
    *old_flags: str,
    lengths: bool = True,
    exclusive: bool = False,
    note: str = "",
) -> None:
    """``--dataset`` (``old_flags``: its deprecated names), with ``lengths`` the
    ``--lengths FILE`` alternative (``exclusive``: not both), and the ``[data]`` flags
    that shape it (:data:`DATA_KEYS`)."""
    source = parser.add_mutually_exclusive_group() if exclusive else parser
    dest = {"dest": "dataset"} if old_flags else {}
    config_option(source, *old_flags, key="dataset", note=note, **dest)
    if lengths:
        add_plain_flag(source, "--lengths", metavar="FILE", help=LENGTHS_HELP)
    for key in DATA_KEYS:
        config_option(parser, key=key)


def add_global_batch_flags(parser: argparse.ArgumentParser) -> None:
    """``--global-batch-tokens`` / ``--global-batch-samples`` (older names kept) and
    ``--reorder-window``: the same for every policy."""
    batch = parser.add_mutually_exclusive_group()
    config_option(
        batch,
        "--global-batch-tokens",
        "--tokens-per-iteration",
        key="global_batch_tokens",
        type=int,
    )
    config_option(
        batch,
        "--global-batch-samples",
        "--samples-per-iteration",
        key="global_batch_samples",
        type=int,
    )
    config_option(parser, "--reorder-window", key="reorder_window", type=int, metavar="K")


def add_memory_flags(
    parser: argparse.ArgumentParser, *, fraction: bool = True, required: bool = False
) -> None:
    """``--memory-gb`` and with ``fraction`` ``--memory-fraction`` (the analytic
    budget's share of the hardware's memory;
    :func:`~datacentric.cli.planning_inputs.memory_budget`)."""
    config_option(parser, "--memory-gb", key="memory_gb", type=float, required=required)
    if fraction:
        from datacentric.settings import DEFAULT_MEMORY_FRACTION

        add_plain_flag(
            parser,
            "--memory-fraction",
            type=float,
            default=DEFAULT_MEMORY_FRACTION,
            help=MEMORY_FRACTION_HELP,
        )


def add_shard_flags(parser: argparse.ArgumentParser, *, reshard: bool = True) -> None:
    """``--shard`` and with ``reshard`` ``--reshard-after-forward``: how model state is
    held (:class:`~datacentric.planning.sharding.ShardingSpec`; the same setting as
    ``train``)."""
    config_option(parser, "--shard", key="shard")
    if reshard:
        config_option(
            parser,
            "--reshard-after-forward",
            key="reshard_after_forward",
            action=argparse.BooleanOptionalAction,
        )


def add_timeout_flag(parser: argparse.ArgumentParser, note: str = "") -> None:
    """``--timeout-s``, a whole launch's limit in seconds (``--timeout``: deprecated)."""
    config_option(parser, "--timeout-s", "--timeout", key="timeout_s", metavar="SECONDS", note=note)


def add_out_flag(container: Any, *, required: bool = False, note: str = "") -> None:
    """``--out DIR``, the folder a command writes."""
    config_option(container, "--out", key="out", metavar="DIR", required=required, note=note)


def check_out_folder(path: str | None, flag: str = "--out") -> str | None:
    """``path``, a folder to write (``flag``'s), refused in one line naming it when it is a
    file: checked before a command's first line, as its work comes before it writes there."""
    if path and Path(path).expanduser().exists() and not Path(path).expanduser().is_dir():
        raise ValueError(f"{flag} {path} is a file; name a folder")
    return path


def add_json_flag(parser: argparse.ArgumentParser, note: str = "") -> None:
    """``--json``: the command's result as one JSON object on stdout."""
    add_plain_flag(parser, "--json", action="store_true", help=JSON_HELP, note=note)


def json_text(result: Any) -> str:
    """``result`` as the strict JSON ``--json`` prints: a float that is not finite (a
    figure with nothing to measure against) is written ``null``, never ``Infinity`` or
    ``NaN``, which strict parsers refuse."""

    def finite(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [finite(item) for item in value]
        return value

    return json.dumps(finite(result), allow_nan=False)


def add_json_out_flag(parser: argparse.ArgumentParser, note: str, **kwargs: Any) -> None:
    """``--json-out FILE`` (a file; ``--out`` is a folder in every command). ``--out``
    keeps its old meaning here as a hidden, deprecated alias."""
    add_plain_flag(parser, "--json-out", metavar="FILE", help=JSON_OUT_HELP, note=note, **kwargs)
    add_deprecated_alias(parser, "--out", "--json-out", "json_out", **kwargs)


def add_skip_unfittable_flag(parser: argparse.ArgumentParser) -> None:
    """``--skip-unfittable``: leave out the buckets no configuration fits."""
    add_plain_flag(parser, "--skip-unfittable", action="store_true", help=SKIP_UNFITTABLE_HELP)


def add_split_mode_flag(container: Any) -> None:
    """``--split-mode``: which splits of an SP group into Ulysses x ring the plan may
    use (:class:`~datacentric.planning.split_modes.SplitLimitedCostModel`)."""
    from datacentric.planning.split_modes import SPLIT_MODES

    add_plain_flag(
        container, "--split-mode", choices=SPLIT_MODES, default="hybrid", help=SPLIT_MODE_HELP
    )


def limit_splits(cost_model: Any, args: Any) -> Any:
    """``cost_model`` limited to ``--split-mode`` (itself for ``hybrid``)."""
    mode = getattr(args, "split_mode", "hybrid")
    if mode == "hybrid":
        return cost_model
    from datacentric.planning.split_modes import SplitLimitedCostModel

    return SplitLimitedCostModel(cost_model, mode)
