"""``Trainer``: transformers' ``Trainer`` constructor and methods, run by datacentric.

Change ``from transformers import Trainer`` to ``from datacentric.integrations.transformers
import Trainer``. The datasets are tokenized causal-LM data: ``input_ids`` with optional
``labels`` (-100: no loss), as a causal-LM model's own loss reads them; the default or a
padding collator is accepted (the runtime packs without padding).
"""

from __future__ import annotations

from typing import Any

from datacentric.integrations.records import RecordsError, is_trl_collator, tokenized_records
from datacentric.integrations.session import DropInTrainer
from datacentric.integrations.stops import ends_in_one_line, refuse_given, stop

__all__ = ["Trainer"]

#: collators that only pad (or batch) what the dataset holds: the runtime packs instead
PADDING_COLLATORS = (
    "DataCollatorWithPadding",
    "DataCollatorForSeq2Seq",
    "DefaultDataCollator",
    "default_data_collator",
)


class Trainer(DropInTrainer):
    """transformers' ``Trainer`` under data-centric parallel: ``train()``, ``evaluate()``,
    ``save_model()``, ``log()``, ``add_callback()``, ``state``.

    ``model``: a causal-LM model object or a local folder; ``args``: ``TrainingArguments``;
    ``train_dataset``/``eval_dataset``: a tokenized ``datasets.Dataset`` (``input_ids``,
    optional ``labels``); ``processing_class``: the tokenizer (unset: the model folder's);
    ``callbacks``: ``TrainerCallback`` objects."""

    command = "Trainer"

    @ends_in_one_line("Trainer()")
    def __init__(
        self,
        model: Any = None,
        args: Any = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Any = None,
        compute_loss_func: Any = None,
        compute_metrics: Any = None,
        callbacks: list | None = None,
        optimizers: Any = (None, None),
        optimizer_cls_and_kwargs: Any = None,
        preprocess_logits_for_metrics: Any = None,
    ) -> None:
        from transformers import TrainingArguments

        if args is None:
            args = TrainingArguments()
        elif not isinstance(args, TrainingArguments):
            stop(self.command, f"args={type(args).__name__}: give a TrainingArguments")
        collator = getattr(data_collator, "__name__", type(data_collator).__name__)
        self.trl_collator = is_trl_collator(data_collator)
        """TRL's collator of the same name: every token of a row, labels as given (else
        the ids); the row's attention mask is not read (TRL's makes its own of ones)."""
        self.causal_lm_collator = (
            collator == "DataCollatorForLanguageModeling" and not self.trl_collator
        )
        """labels = input_ids, -100 on the pad token (``DataCollatorForLanguageModeling``
        with ``mlm=False``: transformers' causal-LM collator)."""
        self.collator_tokenizer = getattr(data_collator, "tokenizer", None)
        """The causal-LM collator's own tokenizer: its pad token is the one it masks."""
        if self.causal_lm_collator and getattr(data_collator, "mlm", False):
            stop(
                self.command,
                "data_collator: DataCollatorForLanguageModeling(mlm=True) "
                "is masked-LM training; give mlm=False (causal LM)",
            )
        label_pad = getattr(data_collator, "label_pad_token_id", -100)
        if collator == "DataCollatorForSeq2Seq" and label_pad != -100:
            stop(
                self.command,
                f"data_collator: DataCollatorForSeq2Seq(label_pad_token_id={label_pad!r}) "
                "puts a loss on the padding it adds to each batch (as many tokens as the "
                "batch's longest row leaves), and the runtime packs its rows without "
                "padding; give label_pad_token_id=-100",
            )
        given = {
            "data_collator": None
            if collator in PADDING_COLLATORS or collator == "DataCollatorForLanguageModeling"
            else data_collator,
            "model_init": model_init,
            "compute_loss_func": compute_loss_func,
            "optimizer_cls_and_kwargs": optimizer_cls_and_kwargs,
        }
        if optimizers not in ((None, None), None):
            given["optimizers"] = optimizers
        refuse_given(self.command, given)
        if model is None or train_dataset is None:
            stop(self.command, "give a model and a train_dataset")
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )

    def records(self, dataset: Any, tokenizer: Any) -> list[dict[str, list[int]]]:
        """The rows as given: ``input_ids``, ``labels`` honoured (padding, where the
        attention mask is 0, left out, on either side); with
        transformers' ``DataCollatorForLanguageModeling`` the labels are the ids, -100 on
        the pad token; with TRL's, every token is kept."""
        # transformers' causal-LM collator masks its own tokenizer's pad token
        masks = self.collator_tokenizer if self.causal_lm_collator else None
        pad = getattr(masks or tokenizer, "pad_token_id", None)
        rows = []
        for index, row in enumerate(dataset):
            if row.get("input_ids") is None:
                stop(
                    self.command,
                    f"train/eval record {index} has no input_ids (its columns: "
                    f"{', '.join(sorted(row))}); tokenize the dataset first (dataset.map)",
                )
            ids = list(row["input_ids"])
            labels = list(row["labels"]) if row.get("labels") is not None else None
            if self.causal_lm_collator:
                labels = [-100 if t == pad else t for t in ids]
            attention = None if self.trl_collator else row.get("attention_mask")
            keep = (
                range(len(ids)) if attention is None else [i for i, a in enumerate(attention) if a]
            )
            if labels is not None and attention is not None:
                self._refuse_loss_on_padding(index, attention, labels)
            kept = {"input_ids": [ids[i] for i in keep]}
            if labels is not None:
                kept["labels"] = [labels[i] for i in keep]
                if all(label == -100 for label in kept["labels"][1:]):
                    self._refuse_row_without_loss(index)
            rows.append(kept)
        try:
            return tokenized_records(rows, tokenizer, add_eos=False)
        except RecordsError as err:
            stop(self.command, str(err))

    def _refuse_row_without_loss(self, index: int) -> None:
        """Stop on a row with no target (every label after its first -100): transformers'
        ``Trainer`` still counts it as a row of its batches, in the steps of an epoch, the
        learning-rate schedule and ``eval_loss``; the runtime has no sample to give it."""
        stop(
            self.command,
            f"train/eval record {index}: no label to train on (all -100 after its first "
            "token), which transformers' Trainer still counts as a row of its batches (the "
            "steps of an epoch, the learning-rate schedule, eval_loss) and the drop-in "
            "cannot; leave such rows out (dataset.filter)",
        )

    def _refuse_loss_on_padding(self, index: int, attention: list, labels: list) -> None:
        """Stop when a row's labels put a loss on a token its attention mask leaves out
        (a row padded to ``max_length`` with ``labels`` copied from ``input_ids``):
        transformers' ``Trainer`` trains those targets, the drop-in leaves padding out."""
        at = next((i for i, a in enumerate(attention) if not a and labels[i] != -100), None)
        if at is not None:
            stop(
                self.command,
                f"train/eval record {index}: its labels put a loss on its padding (position "
                f"{at}: attention_mask 0, label {labels[at]}), which transformers' Trainer "
                "trains and the drop-in leaves out; set labels to -100 where attention_mask "
                "is 0, or give DataCollatorForLanguageModeling(tokenizer, mlm=False)",
            )
