"""What the drop-in trainers share: the inputs written into the run folder, the settings
of the run, and the one trainer of ``datacentric train`` that runs it.

A drop-in trainer adds no training loop of its own. At its first call
(``train``/``evaluate``) on every rank it:

1. joins the ranks (torchrun's or ``accelerate launch``'s environment, else one
   process: :func:`~datacentric.parallel.launch.process_groups`);
2. writes, on rank 0, the model (``save_pretrained``; a folder is used as it is), the
   tokenizer and the datasets as pre-tokenized records under ``<output_dir>/inputs``;
3. builds the run's settings from the arguments (:mod:`.arguments`) and the
   ``[data]``/``[model]``/``[lora]``/``[validation]`` sections from those inputs;
4. builds :class:`~datacentric.train.trainer.Trainer` (the assembly of
   ``datacentric train``) with the callbacks as its hooks (:mod:`.callbacks`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from datacentric.integrations.arguments import (
    NOTED,
    ArgumentsError,
    refused_fields,
    training_settings,
)
from datacentric.integrations.callbacks import CallbackHooks
from datacentric.integrations.records import tokenized_records, write_records
from datacentric.parallel.launch import launch_mode, process_groups
from datacentric.settings import ConfigError, load_config
from datacentric.train.export import export_run
from datacentric.train.metric_sinks import logger
from datacentric.train.trainer import Trainer

INPUTS = "inputs"


def stop(command: str, message: str) -> None:
    """Stop the script: one line ``datacentric <command>: <message>`` on stderr, exit
    status 2 (no traceback)."""
    if os.environ.get("RANK", "0") == "0":  # every rank stops; the first one says why
        print(f"datacentric {command}: {message}", file=sys.stderr)
    raise SystemExit(2)


def refuse_given(command: str, given: dict[str, Any]) -> None:
    """Stop naming the constructor arguments given that the runtime cannot honour."""
    names = [name for name, value in given.items() if value is not None]
    if names:
        stop(
            command,
            f"{', '.join(names)}: not supported (the runtime packs, weights the loss and "
            "builds the optimizer itself); leave it unset",
        )


class DropInTrainer:
    """The runtime behind ``SFTTrainer`` and ``Trainer`` (subclasses say how their
    datasets become records, :meth:`records`)."""

    #: the name of the class, in the line an error stops with
    command = "Trainer"

    def __init__(
        self,
        *,
        model: Any,
        args: Any,
        train_dataset: Any,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        callbacks: list | None = None,
    ) -> None:
        from transformers import TrainerControl, TrainerState

        reference = type(args)(output_dir=args.output_dir, bf16=args.bf16, use_cpu=args.use_cpu)
        refused = refused_fields(args, reference)
        if refused:
            stop(
                self.command,
                f"{', '.join(refused)}: not supported by datacentric's "
                "drop-in trainer (docs/integrations.md lists what maps); leave "
                f"{'them' if len(refused) > 1 else 'it'} at the default",
            )
        if getattr(model, "peft_config", None):
            stop(self.command, "model is a PeftModel: give its base model and peft_config")
        self.args, self.model, self.processing_class = args, model, processing_class
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.peft_config = peft_config
        self.callbacks = list(callbacks or [])
        self.state = TrainerState()
        """transformers' ``TrainerState``: ``global_step``, ``epoch``, ``log_history``..."""
        self.state.log_history = []
        self.control = TrainerControl()
        self._trainer: Trainer | None = None
        self._hooks: CallbackHooks | None = None
        self._resume: Any = None
        for name, why in NOTED.items():
            if name == "per_device_eval_batch_size" and eval_dataset is None:
                continue
            if getattr(args, name, None):
                logger.info("note: %s=%r: %s", name, getattr(args, name), why)

    # ------------------------------------------------------------ the user's API
    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (a class is instantiated)."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def train(self, resume_from_checkpoint: str | bool | None = None, **_: Any) -> Any:
        """Train as ``datacentric train`` does; ``resume_from_checkpoint``: True (the
        newest checkpoint of ``output_dir``) or a checkpoint folder or step."""
        from transformers.trainer_utils import TrainOutput

        self._resume = resume_from_checkpoint
        try:
            result = self._built().run()
        except (ArgumentsError, ConfigError) as err:
            stop(self.command, str(err))
        loss = sum(result.losses) / max(1, len(result.losses))
        return TrainOutput(self.state.global_step, loss, {"train_loss": loss})

    def evaluate(self, eval_dataset: Any = None, **_: Any) -> dict[str, float]:
        """``{"eval_loss": ...}``: the held-out loss of ``eval_dataset`` (the one given to
        the constructor) under the model as it is now (collective: every rank)."""
        if eval_dataset is not None and eval_dataset is not self.eval_dataset:
            stop(
                self.command,
                "evaluate(eval_dataset=...): give the eval_dataset to the "
                "constructor (its held-out schedule is planned with the run)",
            )
        trainer = self._built()
        loss = trainer.evaluate()
        if loss is None:
            stop(self.command, "evaluate() needs an eval_dataset")
        return self._hooks.evaluated(loss)

    def log(self, logs: dict[str, float], *_: Any) -> None:
        """Add ``logs`` to ``state.log_history`` and call ``on_log``."""
        self._hooks_now().log(logs)

    def save_model(self, output_dir: str | None = None, **_: Any) -> None:
        """Write the trained model (a LoRA run: its PEFT adapter) to ``output_dir``
        (default ``<args.output_dir>/model``: ``output_dir`` itself is the run folder),
        from the run's last checkpoint; rank 0 writes, every rank waits."""
        trainer = self._built()
        out = Path(output_dir) if output_dir else Path(self.args.output_dir) / "model"
        if trainer.saved is None:
            stop(self.command, "save_model(): train first (no checkpoint yet)")
        if trainer.is_main:
            export_run(self.args.output_dir, out, checkpoint=str(trainer.saved), overwrite=True)
        if dist.is_initialized():
            dist.barrier()

    # ------------------------------------------------------------ building the run
    def records(self, dataset: Any, tokenizer: Any) -> list[dict[str, list[int]]]:
        """The dataset's rows as ``{"input_ids", "labels"}`` records (subclasses)."""
        return tokenized_records(iter(dataset), tokenizer)

    def _hooks_now(self) -> CallbackHooks:
        if self._hooks is None:
            self._hooks = CallbackHooks(
                self.args, self.state, self.control, self.callbacks, per_epoch=1
            )
        return self._hooks

    def _built(self) -> Trainer:
        """The run's trainer, built once (every rank)."""
        if self._trainer is not None:
            return self._trainer
        timeout = 300.0
        groups = process_groups(timeout)
        out = Path(self.args.output_dir)
        inputs = out / INPUTS
        model_dir, tokenizer = self._write_model(inputs, groups.rank == 0)
        train = self.records(self.train_dataset, tokenizer)
        held = self.records(self.eval_dataset, tokenizer) if self.eval_dataset is not None else []
        if groups.rank == 0:
            write_records(train, inputs / "train.jsonl")
            if held:
                write_records(held, inputs / "eval.jsonl")
        if dist.is_initialized():
            dist.barrier()
        try:
            flat = training_settings(self.args, world=launch_mode().world_size, samples=len(train))
        except ArgumentsError as err:
            stop(self.command, str(err))
        per_epoch = max(1, math.ceil(len(train) / flat["global_batch_samples"]))
        longest = max(len(r["input_ids"]) for r in train + held)
        flat.update(
            model=f"hf:{model_dir}",
            dataset=f"jsonl:{inputs / 'train.jsonl'}",
            tokenizer=str(inputs / "tokenizer"),
            max_tokens=longest,
            long_docs="error",
            validation_dataset=f"jsonl:{inputs / 'eval.jsonl'}" if held else None,
            cost_model="analytic",
            plots=False,
            overwrite=not self._resume,
            resume=self._resume is True,
            resume_from=self._resume if isinstance(self._resume, str) else None,
            collective_timeout_s=timeout,
            **self._lora_settings(),
        )
        if not held:
            flat["validation_every"] = None
        config = load_config(None, **flat)
        self._hooks = CallbackHooks(
            self.args, self.state, self.control, self.callbacks, per_epoch=per_epoch
        )
        self._trainer = Trainer(config, groups, hooks=self._hooks)
        self._hooks.objects = {"model": self._trainer.dc.model}
        if self.processing_class is not None:
            self._hooks.objects["processing_class"] = self.processing_class
        return self._trainer

    def _write_model(self, inputs: Path, main: bool) -> tuple[Path, Any]:
        """The model's folder (written by rank 0 for a model object) and the tokenizer
        (written beside it)."""
        from transformers import AutoTokenizer

        model = self.model
        folder = Path(model) if isinstance(model, (str, Path)) else inputs / "model"
        if isinstance(model, (str, Path)) and not folder.is_dir():
            stop(
                self.command,
                f"model={model!r}: no such folder (nothing is downloaded: "
                "give a local folder saved with save_pretrained, or a model object)",
            )
        if main and not isinstance(model, (str, Path)):
            model.save_pretrained(folder)
        tokenizer = self.processing_class
        if tokenizer is None:
            if not isinstance(model, (str, Path)):
                stop(self.command, "give processing_class (the tokenizer)")
            tokenizer = AutoTokenizer.from_pretrained(folder)
            self.processing_class = tokenizer
        if main:
            tokenizer.save_pretrained(inputs / "tokenizer")
        if dist.is_initialized():
            dist.barrier()
        return folder.resolve(), tokenizer

    def _lora_settings(self) -> dict[str, Any]:
        """The ``[lora]`` section of ``peft_config`` (a peft ``LoraConfig``); any other of
        its fields set away from the default is refused by name."""
        peft = self.peft_config
        if peft is None:
            return {}
        from peft import LoraConfig

        if not isinstance(peft, LoraConfig):
            stop(self.command, "peft_config: only a LoraConfig is supported")
        mapped = {"r", "lora_alpha", "lora_dropout", "target_modules", "task_type"}
        reference = LoraConfig()
        refused = [
            f"{f.name}={getattr(peft, f.name)!r}"
            for f in dataclasses.fields(peft)
            if f.init
            and f.name not in mapped
            and f.name not in {"peft_type", "revision"}
            and getattr(peft, f.name) != getattr(reference, f.name)
        ]
        if refused:
            stop(
                self.command,
                f"peft_config {', '.join(refused)}: not supported (rank, "
                "alpha, dropout and target_modules map); leave it at the default",
            )
        targets = peft.target_modules
        if targets is None:
            targets = _peft_default_targets(self.model)
        if not isinstance(targets, str):
            targets = ",".join(sorted(targets))
        return {
            "lora_rank": peft.r,
            "lora_alpha": float(peft.lora_alpha),
            "lora_dropout": float(peft.lora_dropout),
            "lora_targets": targets,
        }


def _peft_default_targets(model: Any) -> str:
    """peft's default LoRA targets of the model's type (what ``get_peft_model`` adapts
    when ``target_modules`` is unset)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    from transformers import AutoConfig

    config = getattr(model, "config", None) or AutoConfig.from_pretrained(model)
    targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(config.model_type)
    if targets is None:
        stop(
            "SFTTrainer",
            f"peft_config: set target_modules (peft has no default for {config.model_type!r})",
        )
    return ",".join(targets)
