"""Validation of Hugging Face fine-tunes, end to end through ``datacentric train``: the
held-out loss is plain transformers' loss of the exported model on the held-out samples
(per token; assistant tokens only for conversations), and training is bitwise the same
without validation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from datacentric.train.reporting.metrics import read_metrics

pytest.importorskip("transformers")


@pytest.mark.slow
def test_an_hf_fine_tune_validates_as_plain_transformers_computes(tmp_path, capsys):
    """``hf:`` folder, world 2, a held-out JSON-lines file, every 2 of 4 steps: ``val_loss``
    on the lines of steps 2 and 4 and in their metrics rows; the final one is plain
    transformers' per-token loss of the exported model on the file; training is the same
    run's without validation, bitwise."""
    from cli_here import cli_here, cli_json_here
    from runtime.models.test_model_source import _pretrained_folder
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "qwen"
    texts = _pretrained_folder(folder)
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:48]))
    held.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[48:]))
    common = [
        *("train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{train}", "--world", "2"),
        *("--tokenizer", str(folder / "tokenizer.json"), "--iterations", "4"),
        *("--cost-model", "analytic", "--no-progress", "--json"),
    ]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "document 3: word1\n\n"
        + json.dumps({"prompt": "word2 tok3", "temperature": 0.9, "max_new_tokens": 5})
        + "\nword4\n"
    )
    validate = ["--validation.every", "2", "--validation.dataset", f"jsonl:{held}"]
    validate += ["--validation.prompts", str(prompts), "--validation.max_new_tokens", "6"]
    # the validated run in a process of its own (its rank 0 logs the val_loss lines read
    # below), the other two in this process meanwhile (each in its own folder)
    started = subprocess.Popen(
        [sys.executable, "-m", "datacentric", *common, "--out", str(tmp_path / "val"), *validate],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        plain = cli_json_here([*common, "--out", str(tmp_path / "plain")], capsys)
        again = cli_json_here([*common, "--out", str(tmp_path / "again"), *validate], capsys)
    finally:
        out, log = started.communicate(timeout=900)
    assert started.returncode == 0, log[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    for step in (2, 4):  # the completions: one per prompt, the same on a rerun
        written = (tmp_path / f"val/validation/step-{step}.jsonl").read_text()
        assert written == (tmp_path / f"again/validation/step-{step}.jsonl").read_text()
        samples = [json.loads(line) for line in written.splitlines()]
        assert [len(s["tokens"]) for s in samples] == [6, 5, 6]
    assert again["final_val_loss"] == summary["final_val_loss"]
    lines = [ln for ln in log.splitlines() if "val_loss" in ln]
    assert [ln.split()[1] for ln in lines] == ["2", "4"], log[-2000:]
    records = read_metrics(tmp_path / "val")
    assert [(r["iteration"], "val_loss" in r) for r in records] == [
        (0, False), (1, True), (2, False), (3, True),
    ]  # fmt: skip
    assert [r["loss"] for r in records] == [r["loss"] for r in read_metrics(tmp_path / "plain")]
    assert summary["weights_sha256"] == plain["weights_sha256"] and "final_val_loss" not in plain
    assert summary["final_val_loss"] == records[-1]["val_loss"]
    assert summary["best_val_loss"] == min(r["val_loss"] for r in records if "val_loss" in r)
    status, _, err = cli_here(
        ["export", str(tmp_path / "val"), "--out", str(tmp_path / "exported")], capsys
    )
    assert status == 0, err[-2000:]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts[48:]:
            ids = torch.tensor([tokenizer.encode(text).ids])
            n = ids.shape[1] - 1  # tokens with a next token: transformers' mean is over them
            total += float(model(input_ids=ids, labels=ids).loss.double()) * n
            count += n
    assert summary["final_val_loss"] == pytest.approx(total / count, rel=1e-5)
    for sample in samples:  # greedy ones: transformers' own greedy decoding, without a cache
        if sample["prompt_id"] == 1:
            continue
        ids = torch.tensor([tokenizer.encode(sample["prompt"]).ids])
        out = model.generate(ids, max_new_tokens=6, do_sample=False, use_cache=False)
        assert out[0, ids.shape[1] :].tolist() == sample["tokens"]


@pytest.mark.slow
def test_each_val_loss_of_a_lora_chat_split_is_the_masked_loss_of_its_checkpoint(tmp_path, capsys):
    """LoRA on conversations at world 2, ``split=0.1``, validation after each of 2 steps:
    each ``val_loss`` is the exported adapter's own masked loss (assistant tokens only,
    one conversation at a time) on the held-out conversations."""
    from chat_data import (
        conversations,
        run_json,
        save_chat_tokenizer,
        tiny_qwen2_config,
        write_records,
    )
    from cli_here import cli_json_here
    from peft import PeftModel
    from runtime.data.test_data_chat import _template_masks
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    from datacentric.data.holdout import split_ids

    folder = tmp_path / "qwen"
    torch.manual_seed(0)
    Qwen2ForCausalLM(tiny_qwen2_config(320)).save_pretrained(folder)
    save_chat_tokenizer(folder)
    records = [{"messages": t} for t in conversations(40)]
    path = write_records(tmp_path / "chat.jsonl", records)
    argv = ["train", "--model", f"hf:{folder}", "--tokenizer", str(folder), "--world", "2"]
    argv += ["--dataset", f"jsonl:{path}", "--iterations", "2", "--training.lr", "1e-2"]
    argv += ["--lora.rank", "4", "--lora.targets", "q_proj,v_proj", "--checkpoint-every", "1"]
    argv += ["--validation.dataset", "split=0.1", "--validation.every", "1"]
    argv += ["--out", str(tmp_path / "run"), "--json", "--no-plots", "--cost-model", "analytic"]
    summary = run_json(argv, tmp_path / "cache")
    _, held = split_ids(len(records), 0.1, seed=0)
    rendered = _template_masks(folder, [records[i] for i in held])
    items = sum(sum(mask[1:]) for _, mask in rendered)
    val = {r["iteration"] + 1: r["val_loss"] for r in read_metrics(tmp_path / "run")}
    assert sorted(val) == [1, 2] and summary["final_val_loss"] == val[2]
    for step in (1, 2):
        out = tmp_path / f"adapter-{step}"
        argv = ["export", str(tmp_path / "run"), "--checkpoint", str(step), "--out", str(out)]
        cli_json_here([*argv, "--json"], capsys)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder), out)
        model.eval()
        total = 0.0
        with torch.no_grad():
            for ids, mask in rendered:
                labels = [t if m else -100 for t, m in zip(ids, mask)]
                loss = model(
                    input_ids=torch.tensor([ids]),
                    labels=torch.tensor([labels]),
                    num_items_in_batch=items,
                    use_cache=False,
                ).loss
                total += float(loss.double())
        assert val[step] == pytest.approx(total, rel=1e-5), step
    assert val[1] != val[2]  # the adapters moved the held-out loss
