"""The drop-in ``SFTTrainer`` against TRL's own, one SFT-specific ``SFTConfig`` field (or
``SFTTrainer`` argument) at a time: the same script, only the trainer class changed.
Each case says which it is: the drop-in trains what TRL trains (the logged loss and
grad_norm of each step, the held-out loss, the trained weights), or its constructor
refuses the field in one line naming it; never does it train something else.

A tiny Qwen2, CPU, 3 steps of the whole set (4 rows of other lengths in each step: the
drop-in's data order is its own, docs/integrations.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]
WORDS = "hello world how are you the user asks and the assistant answers briefly".split()


def _words(i: int, n: int) -> str:
    return " ".join(WORDS[(3 * i + k) % len(WORDS)] for k in range(n))


def _rows(kind: str) -> list[dict]:
    """4 rows of ``kind``: text (in ``text``, or ``body`` for ``body``), prompt and
    completion, conversations (``chat_prompt``: the last turn as the completion;
    ``sharegpt``: turns of ``from`` and ``value``), or token ids with labels
    (``tokens``), with a completion mask (``masked``) or alone (``ids``)."""
    if kind in ("text", "body"):
        return [{kind: _words(i, 3 + 4 * i)} for i in range(4)]
    if kind == "prompt":
        return [
            {"prompt": _words(i, 2 + i), "completion": " " + _words(i + 1, 4 - i)} for i in range(4)
        ]
    if kind in ("chat", "chat_prompt", "sharegpt"):
        from chat_data import conversations

        if kind == "chat_prompt":  # the last assistant turn is the completion
            return [{"prompt": m[:-1], "completion": m[-1:]} for m in conversations(4)]
        if kind == "sharegpt":  # turns of from and value
            turns = [
                [{"from": t["role"], "value": t["content"]} for t in m] for m in conversations(4)
            ]
            return [{"conversations": m} for m in turns]
        return [{"messages": m} for m in conversations(4)]
    ids = [[(7 * i + k) % 250 + 3 for k in range(5 + 2 * i)] for i in range(4)]
    if kind == "masked":  # a completion mask, no labels
        return [{"input_ids": r, "completion_mask": [0] * 3 + [1] * (len(r) - 3)} for r in ids]
    if kind == "ids":
        return [{"input_ids": r} for r in ids]
    return [{"input_ids": r, "labels": [-100] * 2 + r[2:]} for r in ids]


def _title(row: dict) -> str:
    """A formatting function: the row's prompt and completion as one text."""
    return f"Q: {row['prompt']} A:{row['completion']}"


def _quoted(row: dict) -> str:
    """A formatting function: the row's text after a heading."""
    return f"Q: {row['text']}"


SKIP = {"skip_prepare_dataset": True}
#: a chat template other than the tokenizer's, marking the assistant's tokens
TEMPLATE = (
    "{% for m in messages %}{{ '### ' + m['role'] + ': ' }}{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] }}{% endif %}{{ '\\n' }}{% endfor %}"
)

#: case -> (rows, SFTConfig fields, SFTTrainer arguments, the field the drop-in refuses,
#: None where it trains as TRL)
CASES = {
    "max_length": ("text", dict(max_length=6), {}, None),
    "max_length_prompt": ("prompt", dict(max_length=5), {}, None),
    "packing": ("text", dict(packing=True, max_length=64), {}, None),
    "packing_short_rows": ("text", dict(packing=True, max_length=8), {}, None),
    "packing_wrapped": (
        "text",
        dict(packing=True, packing_strategy="wrapped", max_length=8),
        {},
        "packing_strategy",
    ),
    "packing_bfd_split": (
        "text",
        dict(packing=True, packing_strategy="bfd_split", max_length=8),
        {},
        "packing_strategy",
    ),
    "packing_prompt": ("prompt", dict(packing=True, max_length=8), {}, None),
    "packing_eval": (
        "text",
        dict(packing=True, max_length=16, eval_packing=False, eval_strategy="steps", eval_steps=1),
        {},
        None,
    ),
    "pad_to_multiple_of": ("text", dict(pad_to_multiple_of=8), {}, None),
    "assistant_only_loss_text": (
        "text",
        dict(assistant_only_loss=True),
        {},
        "assistant_only_loss",
    ),
    "assistant_only_loss_prompt": (
        "prompt",
        dict(assistant_only_loss=True),
        {},
        "assistant_only_loss",
    ),
    "chat_prompt": ("chat_prompt", dict(), {}, None),
    "chat_prompt_assistant_only": (
        "chat_prompt",
        dict(assistant_only_loss=True, max_length=30),
        {},
        None,
    ),
    "padding_free": ("text", dict(padding_free=True, max_length=None), {}, None),
    "completion_only_loss": ("prompt", dict(), {}, None),
    "completion_mask": ("masked", dict(), {}, None),
    "completion_mask_completion_only": ("masked", dict(completion_only_loss=True), {}, None),
    "tokens": ("tokens", dict(max_length=6), {}, None),
    "completion_only_loss_false": ("prompt", dict(completion_only_loss=False), {}, None),
    "assistant_only_loss": ("chat", dict(assistant_only_loss=True), {}, None),
    # a template with no generation marks: TRL's training version of Qwen2.5's, or refused
    "assistant_only_loss_qwen2_5": (
        "chat",
        dict(assistant_only_loss=True),
        {"template": "qwen2_5"},
        None,
    ),
    "assistant_only_loss_unmarked": (
        "chat",
        dict(assistant_only_loss=True),
        {"template": "unmarked"},
        "assistant_only_loss",
    ),
    "sharegpt": ("sharegpt", dict(max_length=40), {}, None),
    "dataset_text_field": ("body", dict(dataset_text_field="body"), {}, None),
    "dataset_text_field_missing": (
        "text",
        dict(dataset_text_field="body"),
        {},
        "dataset_text_field",
    ),
    # TRL trains each row's text; of a prompt and completion, those unformatted (refused)
    "formatting_func": (
        "text",
        dict(eval_strategy="steps", eval_steps=1),
        {"formatting_func": _quoted},
        None,
    ),
    "formatting_func_prompt": (
        "prompt",
        dict(completion_only_loss=False),
        {"formatting_func": _title},
        "formatting_func",
    ),
    "formatting_func_completion_only": (
        "text",
        dict(completion_only_loss=True),
        {"formatting_func": _quoted},
        "formatting_func",
    ),
    "eos_token": ("text", dict(eos_token="hello"), {}, "eos_token"),
    "eos_token_own": ("text", dict(eos_token="<|im_end|>"), {}, None),  # the tokenizer's
    "pad_token": ("text", dict(pad_token="hello"), {}, None),
    # the rows as given: labels kept, no cut at max_length, no EOS
    "skip_prepare_dataset": ("tokens", dict(dataset_kwargs=SKIP, max_length=6), {}, None),
    "skip_prepare_dataset_ids": ("ids", dict(dataset_kwargs=SKIP), {}, None),
    "skip_prepare_dataset_masked": ("masked", dict(dataset_kwargs=SKIP), {}, "dataset_kwargs"),
    "skip_prepare_dataset_text": ("text", dict(dataset_kwargs=SKIP), {}, "dataset_kwargs"),
    "skip_prepare_dataset_packing": (
        "tokens",
        dict(dataset_kwargs=SKIP, packing=True, max_length=8),
        {},
        "dataset_kwargs",
    ),
    "loss_type_dft": ("text", dict(loss_type="dft"), {}, "loss_type"),
    "neftune_noise_alpha": ("text", dict(neftune_noise_alpha=5.0), {}, "neftune_noise_alpha"),
    # a template file (its own generation marks); a model's template to clone is refused
    "chat_template_path": (
        "chat",
        dict(chat_template_path="TEMPLATE", assistant_only_loss=True),
        {},
        None,
    ),
    "chat_template_path_folder": (
        "chat",
        dict(chat_template_path="FOLDER"),
        {},
        "chat_template_path",
    ),
    "dataset_num_proc": ("text", dict(dataset_num_proc=2), {}, None),
    "shuffle_dataset": ("text", dict(shuffle_dataset=True), {}, None),
    "activation_offloading": (
        "text",
        dict(activation_offloading=True),
        {},
        "activation_offloading",
    ),
    "use_liger_kernel": ("text", dict(use_liger_kernel=True), {}, "use_liger_kernel"),
    "model_init_kwargs": (
        "text",
        dict(model_init_kwargs={"dtype": "float32"}),
        {"model": "NAME"},
        None,
    ),
    "model_init_kwargs_bf16": (
        "text",
        dict(model_init_kwargs={"dtype": "bfloat16"}),
        {"model": "NAME"},
        "model_init_kwargs",
    ),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _run(trainer_class, folder: Path, out: Path, case: str):
    """The case's script: the losses and grad norms logged and the trained weights."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    kind, fields, given, _ = CASES[case]
    if fields.get("chat_template_path") == "TEMPLATE":
        template = out.parent / "template.jinja"
        template.write_text(TEMPLATE, encoding="utf-8")
        fields = {**fields, "chat_template_path": str(template)}
    elif fields.get("chat_template_path") == "FOLDER":
        fields = {**fields, "chat_template_path": str(folder)}
    config = SFTConfig(
        **{
            "output_dir": str(out),
            "per_device_train_batch_size": 4,
            "max_steps": 3,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "report_to": "none",
            "bf16": False,
            "use_cpu": True,
            "save_strategy": "no",
            **fields,
        }
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if given.get("template") == "qwen2_5":
        import trl

        tokenizer.chat_template = (
            Path(trl.__file__).parent / "chat_templates/qwen2_5.jinja"
        ).read_text()
    elif given.get("template") == "unmarked":
        from chat_data import UNMARKED_TEMPLATE

        tokenizer.chat_template = UNMARKED_TEMPLATE
    model = given.get("model")
    trainer = trainer_class(
        model=str(folder) if model else AutoModelForCausalLM.from_pretrained(folder),
        args=config,
        train_dataset=Dataset.from_list(_rows(kind)),
        eval_dataset=Dataset.from_list(_rows(kind)[1:]) if "eval_steps" in fields else None,
        processing_class=tokenizer,
        **{k: v for k, v in given.items() if k not in ("model", "template")},
    )
    if trainer_class.__module__.startswith("datacentric."):
        print("constructed", file=sys.stderr)
    trainer.train()
    history = trainer.state.log_history
    steps = [(r["step"], r["loss"], r["grad_norm"]) for r in history if "loss" in r]
    steps += [(r["step"], r["eval_loss"], None) for r in history if "eval_loss" in r]
    weights = {k: v.detach().float().clone() for k, v in trainer.model.state_dict().items()}
    return steps, weights


@pytest.mark.parametrize("case", CASES)
def test_each_sft_field_trains_as_trl_or_is_refused(folder, tmp_path, case, capsys) -> None:
    import torch
    from trl import SFTTrainer as Reference

    from datacentric.integrations.trl import SFTTrainer

    refused = CASES[case][3]
    if refused:
        with pytest.raises(SystemExit) as stopped:
            _run(SFTTrainer, folder, tmp_path / "ours", case)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("datacentric ")]
        assert len(lines) == 1 and lines[0].startswith("datacentric SFTTrainer: "), err
        assert refused in lines[0], lines[0]
        assert "constructed" not in err  # by the constructor, before training
        return
    have, weights = _run(SFTTrainer, folder, tmp_path / "ours", case)
    want, want_weights = _run(Reference, folder, tmp_path / "ref", case)
    assert [s for s, _, _ in have] == [s for s, _, _ in want]
    assert [s for s, _, norm in have if norm is not None] == [1, 2, 3]
    for (step, loss, norm), (_, want_loss, want_norm) in zip(have, want):
        assert loss == pytest.approx(want_loss, rel=1e-4), f"step {step}"
        assert norm == (want_norm if norm is None else pytest.approx(want_norm, rel=1e-4))
    # AdamW's normalised step of a gradient near zero moves by up to lr (1e-3) on a
    # rounding: 1.1e-5 seen here; a field trained otherwise moved weights by 4e-3
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, want_weights[name], rtol=0, atol=5e-5, msg=name)


def _one_step(out: Path, **fields):
    """An ``SFTConfig`` of one step on the CPU into ``out``, with ``fields``."""
    from trl import SFTConfig

    return SFTConfig(output_dir=str(out), max_steps=1, report_to="none", use_cpu=True, **fields)


def test_a_chat_template_file_that_is_no_text_is_one_line(folder, tmp_path, capsys) -> None:
    """A template file in Latin-1 is refused in one line naming ``chat_template_path`` and
    the byte, where the line said only "SFTTrainer(): 'utf-8' codec can't decode ...";
    the file is read as a text file (regular files only, a byte-order mark left out)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from datacentric.integrations.trl import SFTTrainer

    template = tmp_path / "template.jinja"
    template.write_bytes(TEMPLATE.replace("{%", "{# caf\xe9 #}{%", 1).encode("latin-1"))
    config = _one_step(tmp_path / "out", chat_template_path=str(template))
    with pytest.raises(SystemExit) as stopped:
        SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(folder),
            args=config,
            train_dataset=Dataset.from_list(_rows("chat")),
            processing_class=AutoTokenizer.from_pretrained(folder),
        )
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("datacentric")]
    assert len(lines) == 1, lines
    assert f"chat_template_path={str(template)!r}: not a text file (byte" in lines[0], lines


def test_a_template_file_sets_the_template_of_a_model_objects_own_tokenizer(
    folder, tmp_path
) -> None:
    """A model object loaded from a folder, no ``processing_class``, and a
    ``chat_template_path`` file: TRL loads the folder's tokenizer and sets the file's
    template on it; so does the drop-in (it was refused: 'give processing_class'), and
    ``save_model`` writes the template with the tokenizer, as TRL's does."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from datacentric.integrations.trl import SFTTrainer

    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    config = _one_step(
        tmp_path / "out",
        save_strategy="no",
        assistant_only_loss=True,
        chat_template_path=str(template),
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=config,
        train_dataset=Dataset.from_list(_rows("chat")),
    )
    assert trainer.processing_class.chat_template == TEMPLATE
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    assert AutoTokenizer.from_pretrained(tmp_path / "saved").chat_template == TEMPLATE


def _text_or_title(row: dict) -> str:
    """A formatting function of text rows and of prompt-completion rows."""
    return _quoted(row) if "text" in row else _title(row)


@pytest.mark.parametrize(
    "field, train, held_out, fields, given",
    [
        # TRL trains the eval rows' prompt and completion, with no EOS: it was added here
        ("formatting_func", "text", "prompt", {}, {"formatting_func": _text_or_title}),
        # TRL refuses eval rows with masks but no labels in its constructor
        ("dataset_kwargs", "tokens", "masked", {"dataset_kwargs": SKIP}, {}),
    ],
)
def test_the_held_out_set_is_checked_as_the_training_set(
    folder, tmp_path, capsys, field, train, held_out, fields, given
) -> None:
    """What the constructor refuses of the training set's first row it refuses of the
    held-out set's, naming ``eval_dataset``: a ``formatting_func`` of prompt-completion
    rows gave a held-out loss other than TRL's (the EOS added), masks with no labels
    under ``skip_prepare_dataset`` stopped only in ``train()``."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from datacentric.integrations.trl import SFTTrainer

    config = _one_step(tmp_path / "out", eval_strategy="steps", eval_steps=1, **fields)
    with pytest.raises(SystemExit) as stopped:
        SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(folder),
            args=config,
            train_dataset=Dataset.from_list(_rows(train)),
            eval_dataset={"held": Dataset.from_list(_rows(held_out))},
            processing_class=AutoTokenizer.from_pretrained(folder),
            **given,
        )
    assert stopped.value.code == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("datacentric")]
    assert len(lines) == 1 and lines[0].startswith(f"datacentric SFTTrainer: {field}"), lines
    assert "eval_dataset['held']" in lines[0], lines


def _drawn(row: dict) -> str:
    """A formatting function that draws at random: a system line or none, per row."""
    import random

    return random.choice(["", "you are kind " * 6]) + row["text"]


def _planned_on_rank(folder: Path, out: Path) -> tuple:
    """(training record lengths, held-out samples, longest) as this rank plans the run,
    its ``formatting_func`` drawing from a seed of its own rank."""
    import random

    import torch.distributed as dist
    from datasets import Dataset
    from transformers import AutoTokenizer

    from datacentric.integrations.run_inputs import write_inputs
    from datacentric.integrations.trl import SFTTrainer

    rows = Dataset.from_list(_rows("text") * 4)
    trainer = SFTTrainer(
        model=str(folder),
        args=_one_step(out),
        train_dataset=rows,
        eval_dataset=rows,
        processing_class=AutoTokenizer.from_pretrained(folder),
        formatting_func=_drawn,
    )
    random.seed(dist.get_rank())
    inputs = write_inputs(
        "SFTTrainer",
        str(out),
        str(folder),
        trainer.processing_class,
        (rows, rows),
        trainer.records,
        main=dist.get_rank() == 0,
    )
    return inputs.train_tokens, inputs.eval_samples, inputs.longest


def test_every_rank_plans_from_the_records_rank_0_wrote(folder, tmp_path) -> None:
    """A ``formatting_func`` that draws at random gives each rank other records; the run
    reads rank 0's, so every rank takes their lengths (2 spawned ranks; a rank planning
    from its own fell out of step: under torchrun, 'Connection closed by peer' in step
    1)."""
    from datacentric.parallel.launch import spawn

    planned = spawn(_planned_on_rank, 2, folder, tmp_path / "out", timeout_s=120)
    assert planned[1] == planned[0]


def test_assistant_only_loss_with_no_chat_template_is_one_line(folder, tmp_path, capsys) -> None:
    """A tokenizer with no chat template under ``assistant_only_loss``: one line naming
    the missing template, as transformers words it (TRL's template lookup raised
    TypeError on None: an internal-error line)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from datacentric.integrations.trl import SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = None
    with pytest.raises(SystemExit) as stopped:
        SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(folder),
            args=_one_step(tmp_path / "out", assistant_only_loss=True),
            train_dataset=Dataset.from_list(_rows("chat")),
            processing_class=tokenizer,
        ).train()
    assert stopped.value.code == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("datacentric")]
    assert len(lines) == 1 and "internal error" not in lines[0], lines
    assert "chat_template" in lines[0], lines


@pytest.mark.parametrize("fields", [dict(max_length=None), dict(dataset_kwargs=SKIP)])
def test_a_row_without_a_loss_token_trl_keeps_is_refused(folder, tmp_path, capsys, fields) -> None:
    """Without ``max_length`` (or with ``skip_prepare_dataset``) TRL keeps a row whose
    labels are all -100 as a row of its batches (5 rows, one so, in batches of 2: 3 steps
    an epoch); the drop-in left it out (2 steps): refused in one line naming the record."""
    from datasets import Dataset

    from datacentric.integrations.trl import SFTTrainer

    rows = [
        {"input_ids": [5 + i, 6, 7, 8, 9], "labels": [-100] * 5 if i == 1 else [5 + i, 6, 7, 8, 9]}
        for i in range(5)
    ]
    config = _one_step(tmp_path / "out", per_device_train_batch_size=2, **fields)
    trainer = SFTTrainer(model=str(folder), args=config, train_dataset=Dataset.from_list(rows))
    with pytest.raises(SystemExit) as stopped:
        trainer.train()
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("datacentric SFTTrainer: "), line
    assert "record 1: no token to train on (every label -100)" in line
