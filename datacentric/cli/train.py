"""``datacentric train``: train a model with a data-centric schedule.

Under torchrun (``torchrun --nproc-per-node N -m datacentric train ...``) each
rank joins the job from the environment; with ``--world N`` the command starts
N local ranks itself (gloo on CPU); otherwise it runs as one process
(``parallel.launch.launch_mode`` decides). Settings come from ``--config FILE``
and ``--section.key`` flags (``docs/configuration.md``).

The command locks the run folder before it writes anything (under torchrun, rank 0
does); a run stopped by SIGTERM/SIGINT after saving exits with ``128 + signal``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os

from datacentric.cli.flag_groups import add_json_flag
from datacentric.cli.flags import add_config_file_flag, add_config_flags, config_from_args
from datacentric.cli.precheck import check_dataset
from datacentric.cli.ranks import announce, ranks_that_run, say
from datacentric.progress import counted
from datacentric.settings import TrainConfig, file_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model with a data-centric schedule",
        description="Train a model with a data-centric schedule. Every setting is a "
        "--section.key flag (or its short name) and a key of the --config TOML file.",
    )
    add_config_file_flag(parser)
    add_json_flag(parser, note="here: a summary at the end")
    add_config_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # a bad --config or flag is reported before torch loads
    args.lr_given = lr_given(args)
    announce(
        "train", start_line(config), json_output=args.json
    )  # before torch and the model load (seconds, or more)
    from datacentric.parallel.launch import launch_mode
    from datacentric.train.checkpoints.preemption import StoppedWhileStarting

    torchrun = launch_mode(config.parallelism.world).kind == "torchrun"
    if torchrun and config.checkpoint.save_on_signal:  # a stop until the run's handler
        with StoppedWhileStarting(int(os.environ["RANK"])):  # is one line, not a traceback
            return _train(args, config, torchrun)
    return _train(args, config, torchrun)


def _train(args: argparse.Namespace, config: TrainConfig, torchrun: bool) -> int:
    """Check the data, then train (``torchrun``: as one of torchrun's ranks, else as
    :func:`~datacentric.parallel.launch.launch_mode` decided); the exit status."""
    from datacentric.parallel.launch import launch
    from datacentric.train.run_folder import RunFolderLock, claim_run_folder
    from datacentric.train.trainer import train_rank, train_rank_in_locked_folder

    prechecked = check_dataset(config, "train")
    if prechecked is None:
        return 2
    note = pretrained_lr_note(config, args.lr_given)
    if note:
        say("train", f"note: {note}")
    from datacentric.train.assemble import tokenizer_used

    used = tokenizer_used(config.model, config.data, config.validation)
    report = functools.partial(_report, tokenizer=used)
    options = dict(
        nproc=config.parallelism.world,
        collective_timeout_s=config.parallelism.collective_timeout_s,
        device=config.parallelism.device,
    )
    if torchrun:  # rank 0 claims the folder
        rank = functools.partial(train_rank, prechecked=prechecked)
        return report(args, launch(rank, config, **options))
    with RunFolderLock(config.job.out):
        claim_run_folder(config.job, config.checkpoint)
        results = launch(
            train_rank_in_locked_folder,
            config,
            prechecked,
            **options,
            forward_signals=config.checkpoint.save_on_signal,
        )
    return report(args, results)


def lr_given(args: argparse.Namespace) -> bool:
    """Whether the user set ``training.lr``: by its flag, or in the ``--config`` file."""
    return args.lr is not None or bool(args.config and "lr" in file_settings(args.config))


def pretrained_lr_note(config: TrainConfig, lr_given: bool) -> str | None:
    """A note when the model is loaded with pretrained weights (an ``hf:`` or
    ``diffusers:`` folder holding them) and ``training.lr`` was not given (``lr_given``:
    by a flag or ``--config``): the default is a rate for training from scratch, far
    above the rates pretrained weights are fine-tuned at. The default is kept, so that
    an upgrade does not change a run's learning rate; the note says what to set."""
    from datacentric.models.source import resolve_model

    if lr_given or not resolve_model(config.model.model, config.model.model_args).has_weights:
        return None
    lr = config.training.lr
    suggested = "1e-4 for the LoRA adapters" if config.lora.rank else "2e-5, or 1e-4 with LoRA"
    return (
        f"training.lr {lr:g} (the default) is a rate for training from scratch, far above "
        f"fine-tuning rates for the pretrained weights of {config.model.model} "
        "(transformers' Trainer: 5e-5; LoRA: 1e-4 to 2e-4); set one with --training.lr "
        f"(e.g. {suggested})"
    )


def start_line(config: TrainConfig) -> str:
    """What ``train`` will do, said before its heavy imports: the model, the data, the
    steps, the ranks and the run folder."""
    training = config.training
    steps = (
        counted(training.iterations, "step")
        if training.iterations
        else counted(training.epochs, "epoch")
    )
    ranks = ranks_that_run(config.parallelism.world)
    return (
        f"{config.model.model} on {config.data.dataset}, {steps}, {counted(ranks, 'rank')}, "
        f"into {config.job.out} (loading torch and the model first: "
        f"{_load_time(config.model.model)})"
    )


def _load_time(model: str) -> str:
    """How long loading ``model`` takes: what it grows with, the folder's kind named."""
    kind = model.split(":", 1)[0]
    large = f"a large {kind}: folder" if kind in ("hf", "diffusers") else "a large one"
    return f"seconds for a small one, a minute or more for {large}"


def _report(args: argparse.Namespace, results: dict, tokenizer: str | None) -> int:
    """Print rank 0's summary (``tokenizer``: what the run read its text with, ``None``
    when it read none); the exit status (``128 + signal`` after a stop by one)."""
    stopped = next((r.stopped_by_signal for r in results.values() if r.stopped_by_signal), None)
    if 0 in results:
        result = results[0]
        summary = {
            "iterations_done": result.iterations_done,
            "samples_seen": result.samples_seen,
            "loss_tokens": result.loss_tokens,
            "first_loss": result.losses[0] if result.losses else None,
            "final_loss": result.losses[-1] if result.losses else None,
            "mean_tokens_per_s": (
                sum(result.tokens_per_s) / len(result.tokens_per_s) if result.tokens_per_s else None
            ),
            "weights_sha256": result.weights_sha256,
            "tokenizer": tokenizer,
            "out": result.out_dir,
        }
        if result.val_losses or result.best_val_loss is not None:
            summary["final_val_loss"] = result.val_losses[-1][1] if result.val_losses else None
            summary["best_val_loss"] = result.best_val_loss
            summary["best_val_step"] = result.best_val_step
        print(
            json.dumps(summary)
            if args.json
            else "\n".join(f"{k:>18}: {v}" for k, v in summary.items())
        )
    return 128 + stopped if stopped else 0
