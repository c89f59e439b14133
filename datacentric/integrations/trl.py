"""``SFTTrainer``: TRL's ``SFTTrainer`` constructor and methods, run by datacentric.

Change ``from trl import SFTTrainer`` to ``from datacentric.integrations.trl import
SFTTrainer``; the ``SFTConfig``, datasets, ``LoraConfig`` and callbacks stay. The data
is prepared as TRL prepares it (:mod:`datacentric.integrations.records`), the run is
``datacentric train``'s (:mod:`datacentric.integrations.session`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator
from typing import Any

from datacentric.integrations.records import (
    MASKS,
    RecordsError,
    is_trl_collator,
    tokenized_records,
)
from datacentric.integrations.run_inputs import tokenizer_source
from datacentric.integrations.session import DropInTrainer
from datacentric.integrations.stops import ends_in_one_line, refuse_given, stop

__all__ = ["SFTTrainer"]

#: ``model_init_kwargs`` that change nothing at these values (the runtime loads a local
#: folder and runs no code of it)
INIT_DEFAULTS = {
    "revision": "main",
    "trust_remote_code": False,
    "device_map": None,
    "quantization_config": None,
}
#: TRL's packing strategies that pack what the runtime packs (each sample whole, cut to
#: ``max_length``): ``bfd_split`` trains the pieces past ``max_length`` too, ``wrapped``
#: cuts rows across samples (a sample's tokens seeing the one before)
PACKED_AS_RUNTIME = ("bfd",)


def _check_sft_fields(
    command: str, args: Any, datasets: tuple[Any, Any], formatting_func: Any
) -> None:
    """Stop (in one line, as ``command``) on the ``SFTConfig`` fields whose value the
    runtime cannot train as TRL does: ``model_init_kwargs`` (:func:`_check_model_init`);
    a ``packing_strategy`` not in :data:`PACKED_AS_RUNTIME` under ``packing``;
    ``skip_prepare_dataset`` with ``packing``; what ``datasets`` (``(train_dataset,
    eval_dataset)``) cannot be given (:func:`_check_datasets`)."""
    _check_model_init(command, args)
    if args.packing and args.packing_strategy not in PACKED_AS_RUNTIME:
        stop(
            command,
            f"packing_strategy={args.packing_strategy!r}: the runtime packs each sample "
            "whole, cut to max_length, as 'bfd' does (bfd_split also trains the pieces "
            "past max_length, wrapped cuts rows across samples); set packing_strategy='bfd'",
        )
    if args.packing and _skips_preparation(args):
        stop(
            command,
            f"dataset_kwargs={args.dataset_kwargs!r} with packing=True: TRL then packs "
            "nothing (a step of per_device_train_batch_size rows as given), while the "
            "runtime counts the batch in tokens; set packing=False",
        )
    _check_datasets(command, args, datasets, formatting_func)


def _check_datasets(
    command: str, args: Any, datasets: tuple[Any, Any], formatting_func: Any
) -> None:
    """Stop on ``assistant_only_loss`` with a first training row that is not
    conversational (TRL checks that row), and on what the first row of the training set
    and of each held-out set cannot be given (:func:`_check_first_row`: TRL prepares
    each set alike in its constructor)."""
    train_dataset, eval_dataset = datasets
    if train_dataset is None:
        stop(command, "give a train_dataset")
    first = next(iter(train_dataset), None) or {}
    if args.assistant_only_loss:
        from trl.data_utils import is_conversational

        if first and not is_conversational(first):
            stop(
                command,
                "assistant_only_loss=True: the train_dataset is not conversational (its "
                f"columns: {', '.join(sorted(first))}); the assistant's tokens are marked in "
                "messages, or in a prompt and completion given as messages; set "
                "assistant_only_loss=False",
            )
    held_out = eval_dataset if isinstance(eval_dataset, dict) else {None: eval_dataset}
    named = {"train_dataset": train_dataset}
    for name, dataset in held_out.items():
        named["eval_dataset" if name is None else f"eval_dataset[{name!r}]"] = dataset
    for where, dataset in named.items():
        if dataset is not None:
            row = next(iter(dataset), None) or {}
            _check_first_row(command, args, row, formatting_func, where)


def _check_model_init(command: str, args: Any) -> None:
    """Stop on ``model_init_kwargs`` other than :data:`INIT_DEFAULTS`, float32 and any
    attention (the runtime loads the folder in float32 and runs its own attention)."""
    init = dict(args.model_init_kwargs or {})
    for key in ("dtype", "torch_dtype"):  # float32 weights are what the runtime holds
        if str(init.get(key, "float32")).removeprefix("torch.") == "float32":
            init.pop(key, None)
    # TRL's sft.py passes these at their defaults: nothing for a local folder
    for key, default in INIT_DEFAULTS.items():
        if key in init and init[key] in (default, None):
            init.pop(key)
    # any attention computes the same: the runtime's own runs, each sample apart
    init.pop("attn_implementation", None)
    if init:
        stop(
            command,
            f"model_init_kwargs={init!r}: not supported (the model is loaded from its "
            "folder in float32; bf16=True trains under bfloat16 autocast); leave it unset",
        )


def _check_first_row(
    command: str, args: Any, first: dict, formatting_func: Any, where: str
) -> None:
    """Stop on what TRL refuses of the first row of the dataset ``where`` names: one
    ``skip_prepare_dataset`` cannot take as given (:func:`_as_given`); a text row
    without ``dataset_text_field``; a ``formatting_func`` of prompt-completion rows (TRL
    trains them unformatted, without the EOS, or raises) or with
    ``completion_only_loss``."""
    if _skips_preparation(args) and first:
        try:  # the first row now, each row as the run reads them
            next(_as_given([first]))
        except RecordsError as err:
            stop(command, f"dataset_kwargs={args.dataset_kwargs!r}: {where} {err}")
    if "input_ids" in first:  # TRL: token ids as given, formatting_func unused
        return
    if formatting_func is None:
        known = ("messages", "conversations", args.dataset_text_field)
        if first and not any(k in first for k in known) and "completion" not in first:
            stop(
                command,
                f"dataset_text_field={args.dataset_text_field!r}: the {where} has no "
                f"such column, nor messages, a prompt and completion or input_ids (its "
                f"columns: {', '.join(sorted(first))}); set dataset_text_field",
            )
        return
    if "prompt" in first:
        stop(
            command,
            f"formatting_func with prompt-completion rows ({where}): TRL trains their "
            "prompt and completion, not the formatted text (and refuses it with the "
            "completion-only loss); give the rows as text, or leave formatting_func unset",
        )
    if args.completion_only_loss:
        stop(
            command,
            "formatting_func with completion_only_loss=True: the formatted text has no "
            "completion to keep the loss on (TRL refuses it); set completion_only_loss=False",
        )


def _with_chat_template(command: str, args: Any, model: Any, processing_class: Any) -> Any:
    """``processing_class`` (unset: the model's, :func:`.run_inputs.tokenizer_source`)
    with the template of ``chat_template_path``'s ``.jinja`` or ``.j2`` file, as TRL
    sets it; another path (TRL clones that model's template, adding its tokens and
    resizing the embeddings) is refused."""
    path = args.chat_template_path
    if path is None:
        return processing_class
    if not (os.path.isfile(path) and str(path).endswith((".jinja", ".j2"))):
        stop(
            command,
            f"chat_template_path={path!r}: a .jinja or .j2 file is taken; cloning another "
            "model's template (its tokens added, the embeddings resized) is not supported; "
            "give the template's file",
        )
    if processing_class is None:  # as TRL: the model's own (its folder's, or the
        # folder a model object was loaded from), as the run would load it
        from transformers import AutoTokenizer

        processing_class = AutoTokenizer.from_pretrained(tokenizer_source(command, model))
    try:
        processing_class.chat_template = read_chat_template(path)
    except ValueError as err:
        stop(command, str(err))
    return processing_class


def _check_eos_token(command: str, args: Any, model: Any, processing_class: Any) -> None:
    """Stop on an ``eos_token`` other than the tokenizer's own EOS (``processing_class``,
    unset: the model's): TRL makes it the tokenizer's EOS and the model's
    ``eos_token_id``, which the run's export does not; the tokenizer's own (what TRL
    appends when it is unset) trains as unset."""
    if args.eos_token is None:
        return
    tokenizer = processing_class
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(command, model))
    if args.eos_token != tokenizer.eos_token:
        stop(
            command,
            f"eos_token={args.eos_token!r}: not the tokenizer's EOS "
            f"({tokenizer.eos_token!r}); TRL would also make it the model's eos_token_id, "
            "which the drop-in does not: set the tokenizer's eos_token and give it as "
            "processing_class, or leave eos_token unset",
        )


def read_chat_template(path: str | os.PathLike) -> str:
    """The text of ``chat_template_path``'s file, as a text file is read (a regular file;
    UTF-8, or UTF-16/32 with its byte-order mark, the mark left out; line ends kept:
    they are the template's); a ``ValueError`` naming it when it is none."""
    from datacentric.data.text_file import read_text_file

    return read_text_file(path, f"chat_template_path={str(path)!r}", "a UTF-8 Jinja template")


def _completion_only_loss(args: Any, train_dataset: Any) -> bool:
    """``completion_only_loss``, unset as TRL reads it: on when the first training row
    has a prompt and a completion, else off (a row of token ids with a
    ``completion_mask`` then trains every token)."""
    if args.completion_only_loss is not None:
        return bool(args.completion_only_loss)
    first = next(iter(train_dataset), None) or {}
    return "prompt" in first and "completion" in first


class SFTTrainer(DropInTrainer):
    """TRL's ``SFTTrainer`` under data-centric parallel: ``train()``, ``evaluate()``,
    ``save_model()``, ``log()``, ``add_callback()``, ``state``.

    ``model``: a model object, or a local folder (``model_init_kwargs``: float32 and the
    defaults TRL's sft.py passes);
    ``args``: an ``SFTConfig`` (unset: TRL's defaults, ``output_dir`` ``trainer_output``);
    ``train_dataset``/``eval_dataset``: a ``datasets.Dataset`` in any of TRL's formats;
    ``processing_class``: the tokenizer (unset: the model folder's); ``peft_config``: a
    ``LoraConfig``; ``callbacks``: ``TrainerCallback`` objects."""

    command = "SFTTrainer"

    @ends_in_one_line("SFTTrainer()")
    def __init__(
        self,
        model: Any,
        args: Any = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        compute_loss_func: Any = None,
        compute_metrics: Any = None,
        callbacks: list | None = None,
        optimizers: Any = (None, None),
        optimizer_cls_and_kwargs: Any = None,
        preprocess_logits_for_metrics: Any = None,
        peft_config: Any = None,
        formatting_func: Any = None,
        quantization_config: Any = None,
    ) -> None:
        from transformers import TrainingArguments
        from trl import SFTConfig

        if args is None:
            args = SFTConfig()
        elif isinstance(args, TrainingArguments) and not isinstance(args, SFTConfig):
            args = SFTConfig(**{**args.to_dict(), "hub_token": args.hub_token})  # as TRL does
        elif not isinstance(args, SFTConfig):
            stop(self.command, f"args={type(args).__name__}: give an SFTConfig")
        given = {
            # TRL's own collator is what SFTTrainer uses unset: the records carry the labels
            "data_collator": None if is_trl_collator(data_collator) else data_collator,
            "compute_loss_func": compute_loss_func,
            "optimizer_cls_and_kwargs": optimizer_cls_and_kwargs,
        }
        if optimizers not in ((None, None), None):
            given["optimizers"] = optimizers
        refuse_given(self.command, given)
        if quantization_config is not None:
            stop(
                self.command,
                "quantization_config: quantized (QLoRA) training is not supported; leave it unset",
            )
        datasets = (train_dataset, eval_dataset)
        _check_sft_fields(self.command, args, datasets, formatting_func)
        processing_class = _with_chat_template(self.command, args, model, processing_class)
        _check_eos_token(self.command, args, model, processing_class)
        if processing_class is not None:  # a template TRL cannot patch stops here
            _training_template(self.command, args, processing_class)
        self._formatting_func = formatting_func
        """Each row's text, as TRL takes it (a row of token ids is kept as given)."""
        self._completion_only_loss = _completion_only_loss(args, train_dataset)
        """``completion_only_loss`` as TRL resolves it, for every dataset."""
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
            compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )

    def eval_batch_rows(self) -> int | None:
        """``per_device_eval_batch_size``, or None when TRL packs the eval set
        (``eval_packing``, unset: ``packing``): its batches are of packed rows."""
        args = self.args
        packed = args.packing if args.eval_packing is None else args.eval_packing
        return None if packed else args.per_device_eval_batch_size

    def records(self, dataset: Any, tokenizer: Any) -> list[dict[str, list[int]]]:
        """The rows as TRL prepares them (text with EOS, chat template, prompt-completion
        with its completion mask, pre-tokenized as given), cut to ``max_length``."""
        args, rows, formatting = self.args, iter(dataset), self._formatting_func
        if _skips_preparation(args):  # TRL: the token ids and labels as given, uncut
            try:
                return tokenized_records(
                    _as_given(rows), tokenizer, completion_only_loss=False, drop_unlabelled=False
                )
            except RecordsError as err:
                stop(self.command, f"dataset_kwargs={args.dataset_kwargs!r}: {err}")
        if formatting is not None:  # TRL: its text in "text", the other columns kept
            rows = (r if "input_ids" in r else {**r, "text": formatting(r)} for r in rows)
        rows = (_as_chatml(r) for r in rows)
        try:
            return tokenized_records(
                rows,
                tokenizer,
                text_field=args.dataset_text_field,
                assistant_only_loss=args.assistant_only_loss,
                completion_only_loss=self._completion_only_loss,
                max_length=args.max_length,
                chat_template=_training_template(self.command, args, tokenizer),
                # TRL leaves out a row with no loss token only when it truncates
                drop_unlabelled=args.max_length is not None and not args.packing,
            )
        except RecordsError as err:
            stop(self.command, str(err))


def _training_template(command: str, args: Any, tokenizer: Any) -> str | None:
    """Under ``assistant_only_loss``, the template TRL renders conversations with when
    the tokenizer's marks no assistant token (no ``{% generation %}``): TRL's training
    version of it (Qwen, Llama, Gemma... its chat_templates); None: the tokenizer's own.
    One TRL cannot patch stops, named."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if not args.assistant_only_loss or template is None or has_generation_markers(template):
        return None  # no template: the records' rendering names it
    try:
        return get_training_chat_template(tokenizer)
    except ValueError as err:
        stop(command, f"assistant_only_loss=True: {str(err).splitlines()[0]}")
    return None


def _as_chatml(row: dict[str, Any]) -> dict[str, Any]:
    """A row of ``conversations`` of ``from`` and ``value`` turns (ShareGPT's) as
    ``messages`` of ``role`` and ``content``, as TRL converts it (the roles kept as
    written); any other row as it is."""
    from trl.data_utils import is_conversational_from_value, maybe_convert_to_chatml

    if row.get("input_ids") is not None or not is_conversational_from_value(row):
        return row
    return maybe_convert_to_chatml(copy.deepcopy(row))


def _skips_preparation(args: Any) -> bool:
    """``dataset_kwargs={"skip_prepare_dataset": True}``: TRL takes the rows as given."""
    return bool((args.dataset_kwargs or {}).get("skip_prepare_dataset", False))


def _as_given(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each row's ``input_ids`` and ``labels`` (unset: every token), as TRL's collator
    takes them when the preparation is skipped; a row of text, or of masks with no
    labels (TRL raises: they would train every token), is named."""
    for index, row in enumerate(rows):
        if row.get("input_ids") is None:
            raise RecordsError(
                f"record {index} has no input_ids (its columns: {', '.join(sorted(row))}): "
                "the rows are taken as given, tokenized; drop skip_prepare_dataset"
            )
        if row.get("labels") is None and any(row.get(m) is not None for m in MASKS):
            raise RecordsError(
                f"record {index} has a mask but no labels, so TRL refuses it (it would "
                "train every token); give labels (-100 off the loss) or drop "
                "skip_prepare_dataset"
            )
        labels = row.get("labels")
        yield {
            "input_ids": row["input_ids"],
            "labels": row["input_ids"] if labels is None else labels,
        }
