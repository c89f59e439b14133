"""What the drop-in trainers share: the inputs written into the run folder, the settings
of the run, and the one trainer of ``datacentric train`` that runs it.

A drop-in trainer adds no training loop of its own. At its first call
(``train``/``evaluate``) on every rank it:

1. joins the ranks (torchrun's or ``accelerate launch``'s environment, else one
   process: :func:`~datacentric.parallel.groups.process_groups`);
2. writes, on rank 0, the model (``save_pretrained``; a folder is used as it is), the
   tokenizer and the datasets as pre-tokenized records under ``<output_dir>/inputs``;
3. builds the run's settings from the arguments (:mod:`.arguments`) and the
   ``[data]``/``[model]``/``[lora]``/``[validation]`` sections from those inputs;
4. builds :class:`~datacentric.train.trainer.Trainer` (the assembly of
   ``datacentric train``) with the callbacks as its hooks (:mod:`.callbacks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from datacentric.data import open_dataset
from datacentric.integrations.arguments import (
    NOTED,
    ArgumentsError,
    check_best_model,
    refused_fields,
    steps_per_epoch,
    training_settings,
)
from datacentric.integrations.callbacks import CallbackHooks
from datacentric.integrations.launcher import tell_transformers_the_launch
from datacentric.integrations.outputs import (
    checkpoint_of,
    copy_saved,
    earlier_run,
    export_trained,
    foreign_checkpoints,
    load_trained,
    resume_spec,
    run_folder,
    save_base,
)
from datacentric.integrations.records import tokenized_records, write_records
from datacentric.integrations.script_api import ScriptMethods
from datacentric.integrations.stops import ends_in_one_line, stop
from datacentric.parallel.groups import process_groups
from datacentric.settings import SECTIONS, ConfigError
from datacentric.settings.run_settings import build_sections
from datacentric.settings.trainer_fields import METHODS, REFUSED
from datacentric.train.reporting.metric_sinks import logger, setup_logging
from datacentric.train.trainer import Trainer

INPUTS = "inputs"

# before the script builds its TrainingArguments / SFTConfig (it imports a drop-in first)
tell_transformers_the_launch()


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """What a drop-in wrote under ``run/inputs`` for its run."""

    folder: Path
    model_dir: Path
    train_tokens: tuple[int, ...]
    """Tokens of each training record."""
    eval_files: dict[str, Path]
    """Each held-out set's records file, by metric prefix (``eval``, ``eval_<name>``)."""
    eval_samples: dict[str, int]
    longest: int
    """Tokens of the longest record (``data.max_tokens``)."""


class DropInTrainer(ScriptMethods):
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
        compute_metrics: Any = None,
        preprocess_logits_for_metrics: Any = None,
    ) -> None:
        from transformers import DefaultFlowCallback, TrainerControl, TrainerState

        self._refuse_overrides()
        with _quiet_transformers():  # its advice and deprecations were the user's to see
            reference = type(args)(output_dir=args.output_dir, bf16=args.bf16, use_cpu=args.use_cpu)
            refused = refused_fields(args, reference)
            values = {name: getattr(args, name, None) for name in NOTED}
        _accelerate_state_as_transformers(args)
        if refused:
            stop(
                self.command,
                f"{', '.join(refused)}: not supported by datacentric's "
                "drop-in trainer (docs/integrations.md lists what maps); leave "
                f"{'them' if len(refused) > 1 else 'it'} at the default",
            )
        self._refuse_evaluations(args, eval_dataset, compute_metrics)
        if getattr(model, "peft_config", None):
            where = (
                "peft_config"
                if self.command == "SFTTrainer"  # transformers' Trainer takes no peft_config
                else "peft_config to datacentric.integrations.trl.SFTTrainer (it takes "
                "tokenized input_ids and labels)"
            )
            stop(self.command, f"model is a PeftModel: give its base model and {where}")
        self.args, self.model, self.processing_class = args, model, processing_class
        self.model_wrapped = model
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.compute_metrics = compute_metrics
        """Called by ``evaluate()`` and ``predict()`` with an ``EvalPrediction``."""
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        """Called on each record's logits [1, T, V] and labels [1, T]."""
        self._eval_sets: dict[str, Any] = {}
        """Each held-out set by its metric prefix (``eval``; a dict: ``eval_<name>``),
        as the runtime reads it (built with the run)."""
        self.peft_config = peft_config
        self._lora = self._lora_settings()
        """The ``[lora]`` section of ``peft_config`` (checked here, as TRL checks it)."""
        if peft_config is not None and not isinstance(model, str | os.PathLike):
            from peft import get_peft_model

            # as TRL: trainer.model is the PeftModel (print_trainable_parameters...) over
            # the model given; the run starts from its base weights
            self.model = self.model_wrapped = get_peft_model(model, peft_config)
        self.callbacks: list = [DefaultFlowCallback()]
        """transformers' ``DefaultFlowCallback`` (the strategies' flags), then the user's."""
        for callback in callbacks or []:
            self.add_callback(callback)
        self.state = TrainerState()
        """transformers' ``TrainerState``: ``global_step``, ``epoch``, ``log_history``..."""
        self.state.log_history = []
        self.state.is_world_process_zero = self.is_world_process_zero()
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.control = TrainerControl()
        self.optimizer: Any = None
        """The run's optimizer (after ``train()``)."""
        self.lr_scheduler: Any = None
        """The run's learning-rate schedule (after ``train()``)."""
        self._trainer: Trainer | None = None
        self._hooks: CallbackHooks | None = None
        self._resume: tuple[bool, str | None] = (False, None)
        self._trained: Path | None = None
        self._base_folder: Path | None = None
        self._notes = [
            f"note: {name}={values[name]!r}: {why}"
            for name, why in NOTED.items()
            if values[name] and not (name == "per_device_eval_batch_size" and eval_dataset is None)
        ]
        self._hooks_now().init_end()

    def _refuse_evaluations(self, args: Any, eval_dataset: Any, compute_metrics: Any) -> None:
        """Stop when ``eval_strategy`` has no ``eval_dataset``, when
        ``metric_for_best_model`` / ``load_best_model_at_end`` ask what the evaluations
        during training cannot give (:func:`.arguments.check_best_model`), or when
        ``compute_metrics`` would be asked of an evaluation during training (the runtime's
        evaluations compute the held-out loss only) or in a form that ``evaluate()`` does
        not give it (lists of batches)."""
        strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
        if strategy != "no" and eval_dataset is None:  # transformers raises here too
            stop(
                self.command,
                f"eval_strategy={strategy!r}: no eval_dataset to evaluate; give one, or set "
                "eval_strategy='no'",
            )
        names = eval_dataset if isinstance(eval_dataset, dict) else {None: None}
        try:  # metric_for_best_model and load_best_model_at_end
            check_best_model(args, ["eval" if n is None else f"eval_{n}" for n in names])
        except ArgumentsError as err:
            stop(self.command, str(err))
        if compute_metrics is None:
            return
        during = f"eval_strategy={strategy!r}" if strategy != "no" else None
        if during is None and args.eval_on_start:
            during = "eval_on_start=True"
        if during:
            stop(
                self.command,
                f"compute_metrics with {during}: the evaluations during training compute "
                "the held-out loss only; set eval_strategy='no' (eval_on_start=False) and "
                "call trainer.evaluate() after train() (it computes the metrics)",
            )
        if not args.eval_do_concat_batches:
            stop(
                self.command,
                "compute_metrics with eval_do_concat_batches=False: its predictions are "
                "concatenated over the eval set; leave eval_do_concat_batches at True",
            )

    def _refuse_overrides(self) -> None:
        """Stop when a subclass overrides a method of transformers' loop that the
        runtime never calls (``compute_loss``, ``training_step``...)."""
        for name, treatment in METHODS.items():
            if treatment.kind == REFUSED and name in vars(type(self)):
                stop(
                    self.command,
                    f"{type(self).__name__}.{name}: overriding it has no effect "
                    f"({treatment.text}); remove the override",
                )

    def __getattr__(self, name: str) -> Any:
        treatment = METHODS.get(name)
        if treatment is None or treatment.kind != REFUSED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if name in ("accelerator", "callback_handler"):
            stop(self.command, f"{name}: not supported ({treatment.text})")

        def refused(*_: Any, **__: Any) -> None:
            stop(self.command, f"{name}(): not supported ({treatment.text})")

        return refused

    # ------------------------------------------------------------ the user's API
    @ends_in_one_line("train()")
    def train(self, resume_from_checkpoint: str | bool | None = None, **_: Any) -> Any:
        """Train as ``datacentric train`` does; ``resume_from_checkpoint``: True (the
        newest checkpoint of ``output_dir``) or a checkpoint folder (``checkpoint-N``)."""
        from transformers.trainer_utils import TrainOutput

        try:
            resume = resume_spec(resume_from_checkpoint, self.args.output_dir)
        except ValueError as err:
            stop(self.command, str(err))
        if self._trainer is not None and resume != (False, None):
            stop(
                self.command,
                f"train(resume_from_checkpoint={resume_from_checkpoint!r}): the run was "
                "built by an earlier call (evaluate() or train()); resume in a new trainer, "
                "before any other call",
            )
        if self._trained is not None:  # transformers trains again, from a new optimizer
            stop(
                self.command,
                "train() ran already on this trainer (its run is in output_dir "
                f"{self.args.output_dir}); to train on, build a new trainer with another "
                "output_dir (model=trainer.model)",
            )
        self._resume = resume
        out = self.args.output_dir
        earlier, foreign = earlier_run(out), foreign_checkpoints(out)
        if (earlier or foreign) and self._trainer is None and self._resume == (False, None):
            held = (
                f"an earlier run ({earlier}): pass train(resume_from_checkpoint=True) to "
                "continue it, or"
                if earlier
                else f"{', '.join(foreign)}, not a drop-in run's checkpoint (transformers' "
                "own Trainer writes such folders):"
            )
            stop(
                self.command,
                f"output_dir {out} holds {held} choose another output_dir (nothing was deleted)",
            )
        trainer = self._built()
        result = trainer.run()
        self.optimizer = trainer.optimizer
        self.lr_scheduler = getattr(trainer, "scheduler", None)
        self._load_trained(trainer)
        metrics = {**self._hooks.metrics, "epoch": self.state.epoch}
        loss = sum(result.losses) / max(1, len(result.losses))
        return TrainOutput(self.state.global_step, loss, metrics)

    @ends_in_one_line("evaluate()")
    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """``{"<metric_key_prefix>_loss": ...}``: the held-out loss of the constructor's
        ``eval_dataset`` (a dict: ``<metric_key_prefix>_<name>_loss`` of each, or of the
        one named) under the model as it is now (collective: every rank), with
        ``compute_metrics``' metrics of its records (:meth:`predict`'s predictions)."""
        named = isinstance(eval_dataset, str) and isinstance(self.eval_dataset, dict)
        if eval_dataset is not None and eval_dataset is not self.eval_dataset and not named:
            stop(
                self.command,
                "evaluate(eval_dataset=...): give the eval_dataset to the "
                "constructor (its held-out schedule is planned with the run; a dict of "
                "them: name one)",
            )
        self._built()
        if not self._eval_sets:
            stop(self.command, "evaluate() needs an eval_dataset")
        if named and f"eval_{eval_dataset}" not in self._eval_sets:
            stop(
                self.command,
                f"evaluate(eval_dataset={eval_dataset!r}): eval_dataset has "
                f"{', '.join(map(repr, self.eval_dataset))}",
            )
        metrics: dict[str, float] = {}
        for prefix, loss, runtime in self._evaluate_now(eval_dataset if named else None):
            samples = self._hooks.eval_samples[prefix]
            key = metric_key_prefix + prefix.removeprefix("eval")
            started = time.perf_counter()
            computed = self._computed_metrics(prefix, key)
            runtime += time.perf_counter() - started
            metrics.update(self._hooks.evaluated(loss, key, runtime, samples, computed))
        return metrics

    def _computed_metrics(self, prefix: str, key: str) -> dict[str, Any]:
        """``compute_metrics``' metrics (named ``<key>_...``) of the eval set of metric
        ``prefix`` (``eval``, ``eval_<name>``) under ``model`` (none without it)."""
        if not self._computes_metrics():
            return {}
        dataset = self.eval_dataset
        if isinstance(dataset, dict):
            dataset = dataset[prefix.removeprefix("eval_")]
        predictions, label_ids, _ = self._forward_records(
            self.records(dataset, self.processing_class)
        )
        return self._metrics_of(predictions, label_ids, key)

    def log(self, logs: dict[str, float], *_: Any) -> None:
        """Add ``logs`` to ``state.log_history`` and call ``on_log``."""
        self._hooks_now().log(logs)

    @ends_in_one_line("save_model()")
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the trained model (a LoRA run: its PEFT adapter) and the tokenizer into
        ``output_dir`` (unset: ``args.output_dir``), as TRL does; rank 0 writes, every
        rank waits."""
        out = Path(output_dir if output_dir is not None else self.args.output_dir)
        if self._trained is None:
            stop(self.command, f"save_model({str(out)!r}): train first (nothing trained yet)")
        if self.is_world_process_zero():
            try:
                copy_saved(self._trained, out, self.processing_class)
            except (ValueError, OSError) as err:
                stop(self.command, f"save_model({str(out)!r}): {err}")
        if dist.is_initialized():
            dist.barrier()

    @ends_in_one_line("get_num_trainable_parameters()")
    def get_num_trainable_parameters(self) -> int:
        """The count of parameters the run trains (a LoRA run: its adapters')."""
        module = self._built().dc.model
        return sum(p.numel() for p in module.parameters() if p.requires_grad)

    # ------------------------------------------------------------ building the run
    def records(self, dataset: Any, tokenizer: Any) -> list[dict[str, list[int]]]:
        """The dataset's rows as ``{"input_ids", "labels"}`` records (subclasses)."""
        return tokenized_records(iter(dataset), tokenizer)

    def _hooks_now(self) -> CallbackHooks:
        if self._hooks is None:
            self._hooks = CallbackHooks(
                self.args, self.state, self.control, self.callbacks, per_epoch=1
            )
            self._hooks.objects.update(model=self.model, processing_class=self.processing_class)
        return self._hooks

    def _evaluate_now(self, name: str | None = None) -> list[tuple[str, float, float]]:
        """``(metric prefix, held-out loss, seconds)`` of each eval set (or the one
        ``name``d), under the model as it is now (collective)."""
        trainer, out = self._trainer, []
        for prefix, dataset in self._eval_sets.items():
            if name is not None and prefix != f"eval_{name}":
                continue
            started = time.perf_counter()
            loss = trainer.dc.evaluate(dataset, autocast=trainer._autocast())
            out.append((prefix, loss, time.perf_counter() - started))
        return out

    def _load_trained(self, trainer: Trainer) -> None:
        """``model``: the trained module (exported by rank 0 from the last checkpoint, or
        with ``load_best_model_at_end`` from ``state.best_model_checkpoint``'s, as
        transformers loads the best; loaded on every rank)."""
        run = run_folder(self.args.output_dir)
        if trainer.saved is None:
            return
        source, best = trainer.saved, self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None:
            step = int(Path(best).name.removeprefix("checkpoint-"))
            source = checkpoint_of(self.args.output_dir, step) or source
        if trainer.is_main:
            export_trained(run, source)
        if dist.is_initialized():
            dist.barrier()
        self._trained = run / "trained"
        self.model = load_trained(
            self._trained, self.model, self._base_folder, self.peft_config is not None
        )
        self.model_wrapped = self.model
        self._hooks.objects["model"] = self.model

    def _built(self) -> Trainer:
        """The run's trainer, built once (every rank)."""
        if self._trainer is None:
            self._trainer = self._build_trainer()
        return self._trainer

    def _build_trainer(self) -> Trainer:
        """The run's trainer (every rank): inputs written, settings resolved from the
        arguments, hooks, optimizer groups and held-out sets."""
        args = self.args
        groups = process_groups(float(args.ddp_timeout), "cpu" if args.use_cpu else None)
        inputs = self._write_inputs(groups.rank == 0)
        config = self._settings(inputs, groups.world_size)
        setup_logging(config.metrics.log_level, groups.rank, config.metrics.log_all_ranks)
        for note in self._notes:
            logger.info("%s", note)
        self._hooks = CallbackHooks(
            args,
            self.state,
            self.control,
            self.callbacks,
            per_epoch=steps_per_epoch(args, inputs.train_tokens, config.scheduling),
            evaluate=self._evaluate_now if inputs.eval_files else None,
            world=groups.world_size,
            token_metrics=self.command == "SFTTrainer",
        )
        trainer = Trainer(config, groups, hooks=self._hooks)
        # TRL's mean_token_accuracy and entropy, counted where the loss is
        trainer.dc.runtime.token_metrics = self._hooks.token_metrics
        self._hooks.flops_per_token = _flops_per_token(trainer.dc.module)
        self._freeze_as_given(trainer, groups.world_size)
        self._decay_groups(trainer)
        self._hooks.objects.update(
            model=trainer.dc.model,
            processing_class=self.processing_class,
            optimizer=trainer.optimizer,
        )
        self._hooks.run = trainer
        self._eval_sets = {}
        for index, (prefix, path) in enumerate(inputs.eval_files.items()):
            self._hooks.eval_samples[prefix] = inputs.eval_samples[prefix]
            self._eval_sets[prefix] = (
                trainer.held_out
                if index == 0
                else open_dataset(f"jsonl:{path}", config.data, seed=config.job.seed)
            )
        return trainer

    def _write_inputs(self, main: bool) -> _Inputs:
        """The model, tokenizer and datasets as the run reads them, written under
        ``run/inputs`` by rank 0 (every rank waits)."""
        inputs = run_folder(self.args.output_dir) / INPUTS
        model_dir, tokenizer = self._write_model(inputs, main)
        self._base_folder = model_dir
        train = self.records(self.train_dataset, tokenizer)
        if not train:
            stop(self.command, "train_dataset: no record has a token with loss")
        sets = self.eval_dataset
        if not isinstance(sets, dict):
            sets = {} if sets is None else {None: sets}
        held, files, samples, longest = {}, {}, {}, max(len(r["input_ids"]) for r in train)
        for index, (name, dataset) in enumerate(sets.items()):
            prefix = "eval" if name is None else f"eval_{name}"
            held[prefix] = self.records(dataset, tokenizer)
            if not held[prefix]:
                stop(self.command, f"eval_dataset {name or ''}: no record has a token with loss")
            files[prefix] = inputs / f"eval{'' if name is None else f'-{index}'}.jsonl"
            samples[prefix] = len(held[prefix])
            longest = max(longest, *(len(r["input_ids"]) for r in held[prefix]))
        if main:
            write_records(train, inputs / "train.jsonl")
            for prefix, records in held.items():
                write_records(records, files[prefix])
        if dist.is_initialized():
            dist.barrier()
        tokens = tuple(len(r["input_ids"]) for r in train)
        return _Inputs(inputs, model_dir, tokens, files, samples, longest)

    def _settings(self, inputs: _Inputs, world: int) -> Any:
        """The run's settings: the arguments' (:mod:`.arguments`), the inputs, the
        resume and the ``[lora]`` section of ``peft_config``."""
        try:
            sections = training_settings(self.args, world=world, tokens=inputs.train_tokens)
        except ArgumentsError as err:
            stop(self.command, str(err))
        resume, resume_from = self._resume
        sections["job"].update(out=str(inputs.folder.parent), overwrite=False)
        sections["model"]["model"] = f"hf:{inputs.model_dir}"
        sections["data"] = {
            "dataset": f"jsonl:{inputs.folder / 'train.jsonl'}",
            "tokenizer": str(inputs.folder / "tokenizer"),
            "max_tokens": inputs.longest,
            "long_docs": "error",
        }
        first = next(iter(inputs.eval_files.values()), None)
        sections["validation"]["dataset"] = f"jsonl:{first}" if first else None
        if first is None:
            sections["validation"]["every"] = None
        sections["cost"] = {"cost_model": "analytic"}
        sections["metrics"]["plots"] = False
        sections["checkpoint"].update(resume=resume, resume_from=resume_from)
        if any(
            f.name == "checkpoint_every_minutes" for f in dataclasses.fields(SECTIONS["checkpoint"])
        ):
            sections["checkpoint"]["checkpoint_every_minutes"] = 0.0  # by steps, as transformers
        sections["lora"] = self._lora
        try:
            return build_sections(sections)
        except ConfigError as err:
            stop(self.command, str(err))

    def _freeze_as_given(self, trainer: Trainer, world: int) -> None:
        """The parameters the user's model object holds frozen (``requires_grad=False``)
        frozen in the run's model too, as transformers' optimizer leaves them out (a LoRA
        run freezes its base itself); on one rank only: across ranks the gradient sync is
        wrapped around the model before this, for every parameter."""
        model = self.model
        if self.peft_config is not None or isinstance(model, str | os.PathLike):
            return
        frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
        if not frozen:
            return
        if world > 1:
            stop(
                self.command,
                f"model: {len(frozen)} frozen parameters (requires_grad=False, e.g. "
                f"{min(frozen)}) stay frozen on one rank only, not across {world} ranks; "
                "unfreeze them, or run one process",
            )
        module = trainer.dc.model
        run = dict(getattr(module, "hf", module).named_parameters())  # the hf: adapter's
        missing = sorted(frozen - set(run))
        if missing:
            stop(
                self.command,
                f"model: {missing[0]} is frozen (requires_grad=False) but the run's model has "
                "no parameter of that name to freeze; unfreeze it",
            )
        for name in frozen:
            run[name].requires_grad_(False)

    def _decay_groups(self, trainer: Trainer) -> None:
        """The run's AdamW in transformers' two groups: weight decay on the parameters
        ``get_decay_parameter_names`` names, none on biases and norm weights; epsilon
        ``adam_epsilon``."""
        import torch

        module = trainer.dc.model
        decayed = set(self.get_decay_parameter_names(module))
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        old = trainer.optimizer.defaults
        trainer.optimizer = torch.optim.AdamW(
            [
                {
                    "params": [p for n, p in named if n in decayed],
                    "weight_decay": old["weight_decay"],
                },
                {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
            ],
            lr=old["lr"],
            betas=old["betas"],
            eps=self.args.adam_epsilon,
        )

    def _write_model(self, inputs: Path, main: bool) -> tuple[Path, Any]:
        """The model's folder (written by rank 0 for a model object) and the tokenizer
        (written beside it)."""
        from transformers import AutoTokenizer

        model = self.model
        folder = _model_folder(self.command, model) or inputs / "model"
        if main and not isinstance(model, (str, Path)):
            save_base(model, folder)
        tokenizer = self.processing_class
        if tokenizer is None:
            # a model object: the local folder it was loaded from, as TRL reads it
            source = folder if isinstance(model, (str, Path)) else _tokenizer_folder(model)
            if source is None:
                stop(
                    self.command,
                    "give processing_class (the tokenizer): the model object was not loaded "
                    "from a local folder that holds one",
                )
            tokenizer = AutoTokenizer.from_pretrained(source)
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
            # fan_in_fan_out: peft sets it by each adapted layer's type whatever is given
            # (transformers' Conv1D: true), as datacentric's LoRA does
            and f.name not in {"peft_type", "revision", "fan_in_fan_out"}
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
            "rank": peft.r,
            "alpha": float(peft.lora_alpha),
            "dropout": float(peft.lora_dropout),
            "targets": targets,
        }


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings and logged advice silenced while the drop-in builds and
    reads arguments objects (a reference ``TrainingArguments`` under torchrun logs that
    DDP wants ``torch.distributed.launch``; a deprecated field's alias warns on read)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)


def _accelerate_state_as_transformers(args: Any) -> None:
    """accelerate's shared state set up again, as transformers' ``Trainer`` constructor
    leaves it (its ``Accelerator``, of ``args.mixed_precision``).

    Every ``TrainingArguments`` (the script's, and the reference the drop-in reads the
    defaults from) clears accelerate's shared ``AcceleratorState`` when it sets up its
    device; transformers' ``Trainer`` fills it again with the ``Accelerator`` it builds.
    Without this, a transformers ``Trainer`` built earlier in the script finds the state
    cleared when it trains (``AcceleratorState`` has no ``distributed_type``). The
    runtime itself never reads it; the ``Accelerator`` is not kept."""
    from accelerate import Accelerator

    # transformers before 5 reads it from ACCELERATE_MIXED_PRECISION (None: as there)
    Accelerator(mixed_precision=getattr(args, "mixed_precision", None))


def _flops_per_token(module: Any) -> float:
    """transformers' ``floating_point_ops`` per token: 6 x the parameters outside the
    embeddings (0 for a module without ``num_parameters``)."""
    module = getattr(module, "hf", module)  # datacentric's hf: adapter holds the model
    count = getattr(module, "num_parameters", None)
    return 6.0 * count(exclude_embeddings=True) if callable(count) else 0.0


def _model_folder(command: str, model: Any) -> Path | None:
    """The folder ``model`` names (None: a model object); the script stops when it names
    no folder (nothing is downloaded)."""
    if not isinstance(model, str | os.PathLike):
        return None
    if not Path(model).is_dir():
        stop(
            command,
            f"model={model!r}: no such folder (nothing is downloaded: "
            "give a local folder saved with save_pretrained, or a model object)",
        )
    return Path(model)


def _tokenizer_folder(model: Any) -> Path | None:
    """The local folder a model object was loaded from, when it holds a tokenizer."""
    folder = Path(getattr(model, "name_or_path", "") or "")
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    found = str(folder) not in ("", ".") and any((folder / name).is_file() for name in names)
    return folder if found else None


def _peft_default_targets(model: Any) -> str:
    """peft's default LoRA targets of the model's type (what ``get_peft_model`` adapts
    when ``target_modules`` is unset), comma-separated."""
    from transformers import AutoConfig

    from datacentric.models.lora import peft_default_targets

    config = getattr(model, "config", None) or AutoConfig.from_pretrained(
        _model_folder("SFTTrainer", model)
    )
    targets = peft_default_targets(config.model_type)
    if targets is None:
        stop(
            "SFTTrainer",
            f"peft_config: set target_modules (peft has no default for {config.model_type!r})",
        )
    return ",".join(targets)
