"""The drop-in trainers' common class: the script's objects kept as transformers'
``Trainer`` keeps them, the methods a script calls (``train``, ``evaluate``,
``save_model``...) and the one trainer of ``datacentric train`` that runs them.

A drop-in trainer adds no training loop of its own. Its constructor checks what it is
given (:mod:`.constructor_checks`); at its first call (``train``/``evaluate``) on every
rank it:

1. joins the ranks (torchrun's or ``accelerate launch``'s environment, else one
   process: :func:`~datacentric.parallel.groups.process_groups`);
2. writes, on rank 0, the model (``save_pretrained``; a folder is used as it is), the
   tokenizer and the datasets as pre-tokenized records under ``<output_dir>/inputs``
   (:mod:`.run_inputs`);
3. builds the run's settings from the arguments (:mod:`.arguments`) and the
   ``[data]``/``[model]``/``[lora]``/``[validation]`` sections from those inputs;
4. builds :class:`~datacentric.train.trainer.Trainer` (the assembly of
   ``datacentric train``) with the callbacks as its hooks (:mod:`.callbacks`), its
   parameters and optimizer groups as transformers' (:mod:`.trained_parameters`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from datacentric.data import open_dataset
from datacentric.integrations.arguments import epoch_batches, steps_per_epoch
from datacentric.integrations.callbacks import CallbackHooks
from datacentric.integrations.constructor_checks import checked_construction
from datacentric.integrations.eval_batches import TransformersEvalBatches
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
)
from datacentric.integrations.records import tokenized_records
from datacentric.integrations.run_inputs import INPUTS as INPUTS  # importable here as before
from datacentric.integrations.run_inputs import (
    lora_section,
    run_settings,
    streamed_rows,
    write_inputs,
)
from datacentric.integrations.script_api import ScriptMethods
from datacentric.integrations.stops import ends_in_one_line, stop
from datacentric.integrations.trained_parameters import (
    decay_groups,
    flops_per_token,
    freeze_as_given,
    share_run_tensors,
)
from datacentric.parallel.groups import process_groups
from datacentric.settings.trainer_fields import METHODS, REFUSED
from datacentric.train.reporting.metric_sinks import logger, setup_logging
from datacentric.train.trainer import Trainer
from datacentric.train.validation.held_out import validation_loss

# before the script builds its TrainingArguments / SFTConfig (it imports a drop-in first)
tell_transformers_the_launch()


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

        given = {
            "args": args,
            "model": model,
            "eval_dataset": eval_dataset,
            "compute_metrics": compute_metrics,
        }
        notes = checked_construction(type(self), self.command, given)
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
        self._notes = notes
        self._hooks_now().init_end()

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
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **unknown: Any,
    ) -> Any:
        """Train as ``datacentric train`` does; ``resume_from_checkpoint``: True (the
        newest checkpoint of ``output_dir``) or a checkpoint folder (``checkpoint-N``);
        ``ignore_keys_for_eval``: no effect (the evaluations during training compute the
        held-out loss only); ``trial`` (a hyperparameter search's) and any other keyword
        stop, as transformers' ``train()`` raises on one it does not take."""
        from transformers.trainer_utils import TrainOutput

        if unknown:
            stop(
                self.command,
                f"train({', '.join(f'{k}=...' for k in unknown)}): not an argument of "
                "train() (it takes resume_from_checkpoint, trial, ignore_keys_for_eval)",
            )
        if trial is not None:
            stop(self.command, "train(trial=...): not supported (run one drop-in per trial)")
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
            held = trainer.dc.prepare_evaluation(dataset)
            rows = self.eval_batch_rows()
            if rows is not None:  # transformers' eval_loss: the mean of its batches' means
                held = TransformersEvalBatches(held, rows, trainer.dc.runtime.groups.world_size)
            loss = validation_loss(trainer.dc, held, autocast=trainer._autocast())
            out.append((prefix, loss, time.perf_counter() - started))
        return out

    def eval_batch_rows(self) -> int | None:
        """The rows of an eval batch on each rank whose loss transformers averages
        (``per_device_eval_batch_size``); None: the held-out loss is the mean over every
        loss token of the set (an eval batch of TRL's packed rows)."""
        return self.args.per_device_eval_batch_size

    def _load_trained(self, trainer: Trainer) -> None:
        """``model``: the trained module (exported by rank 0 from the last checkpoint, or
        with ``load_best_model_at_end`` from ``state.best_model_checkpoint``'s, as
        transformers loads the best; loaded on every rank), holding the run's tensors on
        ``args.device`` where it can (:func:`.trained_parameters.share_run_tensors`)."""
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
        lora = self.peft_config is not None
        self.model = load_trained(self._trained, self.model, self._base_folder, lora)
        if not lora:  # on args.device, as transformers' (a LoRA run's stays where it was)
            share_run_tensors(self.model, trainer.dc.module, self.args.device)
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
        inputs = write_inputs(
            self.command,
            args.output_dir,
            self.model,
            self.processing_class,
            (
                streamed_rows(self.command, args, self.train_dataset, groups.world_size),
                self.eval_dataset,
            ),
            self.records,
            main=groups.rank == 0,
        )
        self.processing_class, self._base_folder = inputs.tokenizer, inputs.model_dir
        config = run_settings(
            self.command, args, inputs, groups.world_size, self._resume, self._lora
        )
        setup_logging(config.metrics.log_level, groups.rank, config.metrics.log_all_ranks)
        for note in self._notes:
            logger.info("%s", note)
        self._hooks = CallbackHooks(
            args,
            self.state,
            self.control,
            self.callbacks,
            per_epoch=steps_per_epoch(args, inputs.train_tokens, config.scheduling),
            epoch_batches=epoch_batches(args, len(inputs.train_tokens), groups.world_size),
            evaluate=self._evaluate_now if inputs.eval_files else None,
            world=groups.world_size,
            token_metrics=self.command == "SFTTrainer",
        )
        trainer = Trainer(config, groups, hooks=self._hooks)
        # TRL's mean_token_accuracy and entropy, counted where the loss is
        trainer.dc.runtime.token_metrics = self._hooks.token_metrics
        self._hooks.flops_per_token = flops_per_token(trainer.dc.module)
        module = trainer.dc.model
        # a LoRA run freezes its base itself; a folder holds no frozen parameters
        if self.peft_config is None and not isinstance(self.model, str | os.PathLike):
            freeze_as_given(self.command, self.model, module, groups.world_size)
        decayed = set(self.get_decay_parameter_names(module))
        trainer.optimizer = decay_groups(trainer.optimizer, module, decayed, args.adam_epsilon)
        self._hooks.objects.update(
            model=module,
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

    def _lora_settings(self) -> dict[str, Any]:
        """The ``[lora]`` section of ``peft_config`` (:func:`.run_inputs.lora_section`)."""
        return lora_section(self.command, self.peft_config, self.model)
