"""Conversations with a chat template, the loss on the assistant's tokens only.

The masks are checked against transformers' own ``apply_chat_template(...,
return_assistant_tokens_mask=True)``; the distributed masked loss (SP 2, accumulation,
recomputation) against the unmodified model's own loss (``labels`` with ``-100`` on
every token the template does not mark, ``num_items_in_batch`` over the global batch)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from chat_data import (  # noqa: E402
    UNMARKED_TEMPLATE,
    conversations,
    run_json,
    save_chat_tokenizer,
    tiny_qwen2_config,
    write_records,
)

from datacentric.data import DataConfig, open_dataset  # noqa: E402
from datacentric.data.base import DataError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SEED, LAYERS = 0, 2


@pytest.fixture
def chat(tmp_path, monkeypatch):
    """A tokenizer folder and a JSONL file of 12 conversations, one with no assistant
    turn (sample order: the records in file order, that one left out)."""
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_chat_tokenizer(tmp_path / "tok")
    records = [{"messages": turns} for turns in conversations(12)]
    records.insert(5, {"messages": [{"role": "user", "content": "no answer here"}]})
    records.append({"prompt": "how are you", "completion": "hello world"})
    return folder, write_records(tmp_path / "chat.jsonl", records), records


def _template_masks(folder, records):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    out = []
    for record in records:
        turns = record.get("messages") or [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["completion"]},
        ]
        rendered = tok.apply_chat_template(
            turns, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        out.append((rendered["input_ids"], rendered["assistant_masks"]))
    return out


def test_loss_tokens_are_the_tokens_the_template_marks(chat) -> None:
    folder, path, records = chat
    ds = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    expected = [(ids, mask) for ids, mask in _template_masks(folder, records) if sum(mask[1:])]
    assert len(ds) == len(records) - 1 and ds.summary()["skipped_no_loss"] == 1
    assert ds.summary()["loss_tokens"] == sum(sum(m[1:]) for _, m in expected)
    for sample_id, (ids, mask) in enumerate(expected):
        assert ds.shapes()[sample_id].tokens == len(ids)
        assert ds.loss_tokens(sample_id) == sum(mask[1:])
        one = ds.pack([sample_id], 1)
        assert one.inputs.tolist() == ids
        keep = torch.tensor(mask[1:] + [0], dtype=torch.bool)
        assert torch.equal(one.loss_mask, keep)
        assert one.targets[keep].tolist() == [t for t, m in zip(ids[1:], mask[1:]) if m]
    packed = ds.pack([0, 3, 7], 4)  # packed and padded: the same masks, side by side
    assert int(packed.loss_mask.sum()) == sum(ds.loss_tokens(i) for i in (0, 3, 7))


def test_loss_on_all_and_the_refusals(chat, tmp_path) -> None:
    folder, path, records = chat
    every = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder), loss_on="all"))
    assert len(every) == len(records)  # nothing is left out: every token carries loss
    assert all(every.loss_tokens(i) == s.tokens - 1 for i, s in enumerate(every.shapes()))
    with pytest.raises(DataError, match=r"need a chat template: .*chat.jsonl holds conv.*no --tok"):
        open_dataset(f"jsonl:{path}")
    plain = save_chat_tokenizer(tmp_path / "plain", template=None)  # a base model's
    with pytest.raises(DataError, match=r"^the tokenizer of \S*plain \(--tokenizer, else"):
        open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(plain)))
    # a glob that also matches a chat file names that file
    (tmp_path / "glob").mkdir()
    write_records(tmp_path / "glob" / "a-chat.jsonl", records[:2])
    write_records(tmp_path / "glob" / "b-text.jsonl", [{"text": "hello world"}])
    with pytest.raises(DataError, match=r"template: \S*glob/a-chat.jsonl holds conversations"):
        open_dataset(f"jsonl:{tmp_path / 'glob' / '*.jsonl'}")
    text = write_records(tmp_path / "text.jsonl", [{"text": "hello world"}])
    with pytest.raises(DataError, match="holds text records.*--loss-on all"):
        open_dataset(f"jsonl:{text}", DataConfig(loss_on="assistant"))
    unmarked = save_chat_tokenizer(tmp_path / "unmarked", UNMARKED_TEMPLATE)
    with pytest.raises(DataError, match=r"no \{% generation %\} markers.*--loss-on all"):
        open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(unmarked)))
    open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(unmarked), loss_on="all"))
    mixed = write_records(tmp_path / "mixed.jsonl", [records[0], {"body": "x"}])
    with pytest.raises(DataError, match=r"mixed.jsonl:2: not a conversation"):
        open_dataset(f"jsonl:{mixed}", DataConfig(tokenizer=str(folder)))
    # the other way round: not a text field under another name (was: pass --text-field)
    text_first = write_records(tmp_path / "text-first.jsonl", [{"text": "x"}, records[0]])
    with pytest.raises(DataError, match=r"first.jsonl:2: a conversation .* first record .* text"):
        open_dataset(f"jsonl:{text_first}", DataConfig(tokenizer=str(folder)))
    bad = write_records(tmp_path / "bad.jsonl", [{"messages": [{"content": "x"}]}])
    with pytest.raises(DataError, match=r"bad.jsonl:1: turn 0 is not a message"):
        open_dataset(f"jsonl:{bad}", DataConfig(tokenizer=str(folder)))
    no_content = write_records(tmp_path / "nocontent.jsonl", [{"messages": [{"role": "user"}]}])
    with pytest.raises(DataError, match=r"nocontent.jsonl:1: the chat template failed"):
        open_dataset(f"jsonl:{no_content}", DataConfig(tokenizer=str(folder)))


def test_parquet_conversations_read_like_jsonl(chat, tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder, path, records = chat
    chats = [r for r in records if "messages" in r]
    pq.write_table(pa.Table.from_pylist(chats), tmp_path / "chat.parquet")
    from_parquet = open_dataset(
        f"parquet:{tmp_path / 'chat.parquet'}", DataConfig(tokenizer=str(folder))
    )
    from_jsonl = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    assert from_parquet.shapes() == from_jsonl.shapes()[: len(from_parquet)]


def _iterations(dataset, world: int):
    from datacentric.schedule import Assignment, Iteration, MicroBatch
    from datacentric.shapes import bucket_name

    shapes = dataset.shapes()

    def micro(ids, recompute):
        longest = max((shapes[i] for i in ids), key=lambda s: s.tokens)
        return MicroBatch(
            sample_ids=tuple(ids),
            bucket=bucket_name(longest),
            tokens=sum(shapes[i].tokens for i in ids),
            recompute=recompute,
        )

    full, alternate = (True,) * LAYERS, tuple(b % 2 == 0 for b in range(LAYERS))
    sp = Iteration(
        index=0, assignments=(Assignment(0, world, (micro([0, 1], full), micro([2], alternate))),)
    )
    per_rank = tuple(
        Assignment(r, 1, (micro([3 + 2 * r], (False,) * LAYERS), micro([4 + 2 * r], full)))
        for r in range(world)
    )
    data_parallel = Iteration(index=1, assignments=per_rank)
    for iteration in (sp, data_parallel):
        iteration.validate(world)
    return [sp, data_parallel]


def _model():
    from datacentric.models.hf import build_hf_model

    torch.manual_seed(SEED)
    return build_hf_model("qwen2", num_hidden_layers=LAYERS, vocab_size=320)


def _worker(path: str, folder: str, world: int):
    from datacentric.parallel.groups import ProcessGroups
    from datacentric.parallel.loss import loss_tokens_function
    from datacentric.parallel.runtime import DataCentricRuntime
    from datacentric.parallel.step import run_step

    groups = ProcessGroups()
    dataset = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=folder))
    out = []
    for iteration in _iterations(dataset, world):
        model = _model()
        runtime = DataCentricRuntime(
            model, groups, dataset.pack, loss_tokens_function(dataset), sp_sizes=groups.sizes
        )
        run_step(runtime, iteration)
        out.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    return out


def _reference(folder, records, sample_ids):
    """The unmodified model's own masked loss over the global batch, one sample at a time."""
    rendered = [r for r in _template_masks(folder, records) if sum(r[1][1:])]
    model = _model().hf
    model.set_attn_implementation("sdpa")
    items = sum(sum(rendered[i][1][1:]) for i in sample_ids)
    for i in sample_ids:
        ids, mask = rendered[i]
        labels = [t if m else -100 for t, m in zip(ids, mask)]
        out = model(
            input_ids=torch.tensor([ids]),
            labels=torch.tensor([labels]),
            num_items_in_batch=items,
            use_cache=False,
        )
        out.loss.backward()
    return {"hf." + n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_assistant_only_loss_matches_the_model_own_masked_loss_at_world_2(chat) -> None:
    from datacentric.parallel.launch import spawn

    folder, path, records = chat
    world = 2
    dataset = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    results = spawn(_worker, world, str(path), str(folder), world, timeout_s=240)
    for index, iteration in enumerate(_iterations(dataset, world)):
        reference = _reference(folder, records, iteration.sample_ids())
        for name, ref in reference.items():
            assert ref.abs().sum() > 0, f"{name} has no reference gradient"
            got = results[0][index][name]
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7)
            assert torch.equal(got, results[1][index][name]), f"rank 1 differs: {name}"


@pytest.mark.slow
def test_lora_on_conversations_trains_the_assistant_tokens_and_exports_an_adapter(
    tmp_path, capsys, monkeypatch
) -> None:
    """The fine-tuning issue's run: a 2-layer Qwen2 folder with a chat template, 40
    conversations, LoRA on q and v at world 2; its adapter loads with peft."""
    import json

    from transformers import AutoTokenizer, Qwen2ForCausalLM

    folder = tmp_path / "qwen"
    config = tiny_qwen2_config(320)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    save_chat_tokenizer(folder)
    path = write_records(tmp_path / "chat.jsonl", [{"messages": t} for t in conversations(40)])
    argv = ["train", "--model", f"hf:{folder}", "--tokenizer", str(folder)]
    argv += ["--dataset", f"jsonl:{path}", "--iterations", "1", "--training.lr", "1e-2"]
    argv += ["--global-batch-tokens", "100000", "--out", str(tmp_path / "run"), "--json"]
    argv += ["--no-plots", "--no-tensorboard", "--world", "2"]
    argv += ["--lora.rank", "4", "--lora.targets", "q_proj,v_proj"]
    summary = run_json(argv, tmp_path / "cache")
    tok = AutoTokenizer.from_pretrained(folder)
    marked = 0
    for line in path.read_text().splitlines():
        rendered = tok.apply_chat_template(
            json.loads(line)["messages"],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        marked += sum(rendered["assistant_masks"])
    assert summary["samples_seen"] == 40 and summary["loss_tokens"] == marked
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    _check_adapter_export(tmp_path, folder, capsys)


def _check_adapter_export(tmp_path, folder, capsys) -> None:
    """``export`` in this process: the adapter folder peft loads onto the base model."""
    from cli_here import cli_json_here
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    argv = ["export", str(tmp_path / "run"), "--out", str(tmp_path / "adapter"), "--json"]
    assert cli_json_here(argv, capsys)["format"] == "peft-adapter"
    base = AutoModelForCausalLM.from_pretrained(folder)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
    state = loaded.get_base_model().state_dict()
    moved = [k for k in state if ".lora_B." in k]
    assert len(moved) == 2 * 2 and all(state[k].abs().sum() > 0 for k in moved)  # B starts at 0
    for name, value in before.items():  # the base weights are the pretrained ones
        key = name.replace("q_proj.", "q_proj.base_layer.").replace("v_proj.", "v_proj.base_layer.")
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)


def test_a_model_folder_without_a_tokenizer_is_named(tmp_path) -> None:
    """transformers loads a folder with a model's config.json alone as an empty tokenizer;
    the refusal names that folder, not the data ("no document has any token")."""
    folder = tmp_path / "model-only"
    tiny_qwen2_config(320).save_pretrained(folder)
    text = write_records(tmp_path / "text.jsonl", [{"text": "hello world"}])
    with pytest.raises(DataError, match=r"--tokenizer .*model-only: the folder holds no tok"):
        open_dataset(f"jsonl:{text}", DataConfig(tokenizer=str(folder)))
