"""A run's start-up builds each thing once: the check before the ranks start and the
ranks share the assembly's steps, and what the check found is handed on, not redone."""

from __future__ import annotations

import json
import pickle
from collections import Counter

import pytest
from run_config import SMALL_TRAIN_FLAGS, small_config

import datacentric.data.sources as sources
import datacentric.models.source as model_source
import datacentric.train.assemble as assemble
import datacentric.train.build as build
from datacentric.cli.main import main
from datacentric.parallel.groups import ProcessGroups
from datacentric.scheduling.global_batches import GlobalBatchSize, size_global_batch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def opened(monkeypatch) -> Counter:
    """Counts, in this process, each dataset string opened and each model built (on the
    meta device or with weights)."""
    seen: Counter = Counter()
    open_dataset, build_source = sources.open_dataset, model_source._build_source

    def counted_open(spec, *args, **kwargs):
        seen[f"dataset {spec}"] += 1
        return open_dataset(spec, *args, **kwargs)

    def counted_build(source, *, device, **kwargs):
        seen["model on meta" if str(device) == "meta" else "model with weights"] += 1
        return build_source(source, device=device, **kwargs)

    for module in (sources, build):  # the run's data opens in data/sources
        monkeypatch.setattr(module, "open_dataset", counted_open)
    monkeypatch.setattr(model_source, "_build_source", counted_build)
    return seen


def test_train_in_one_process_opens_each_dataset_and_the_model_once(tmp_path, opened, capsys):
    held_out = tmp_path / "held_out.jsonl"
    lines = [json.dumps({"text": f"held-out document {i} " * (3 + i)}) for i in range(3)]
    held_out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["train", "--out", str(tmp_path / "run"), *SMALL_TRAIN_FLAGS, "--iterations", "1"]
    argv += ["--validation.dataset", f"jsonl:{held_out}", "--no-plots", "--no-tensorboard"]
    argv += ["--validation.every", "1", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    # the check and the rank share one process here: each dataset opened once, one meta
    # build for every check of the model, and the one build with weights that trains
    assert opened == {
        "dataset stdlib": 1,
        f"dataset jsonl:{held_out}": 1,
        "model on meta": 1,
        "model with weights": 1,
    }
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["iterations_done"] == 1 and summary["final_val_loss"] is not None


def test_the_ranks_train_the_global_batch_the_check_sized(tmp_path, monkeypatch):
    config = small_config(tmp_path / "run", tokens_per_iteration=None)
    sized = GlobalBatchSize(777, "sized for the test")
    prechecked = assemble.Prechecked(sized, data=("not", "pickled"))
    spawned = pickle.loads(pickle.dumps(prechecked))  # what a spawned rank receives
    assert spawned.global_batch == sized and spawned.data is None

    def not_again(*args, **kwargs):
        raise AssertionError("the global batch was sized again on a rank")

    monkeypatch.setattr(assemble, "run_global_batch", not_again)
    run = assemble.assemble_run(config, ProcessGroups.local(), spawned)
    assert run.config.scheduling.global_batch_tokens == 777  # recorded by the run
    assert run.dc.pipeline.options.global_batch_tokens == 777  # and trained
    assert config.scheduling.global_batch_tokens is None  # the caller's settings stay


def test_without_a_check_the_assembly_sizes_the_global_batch_itself(tmp_path):
    config = small_config(tmp_path / "run", tokens_per_iteration=None)
    run = assemble.assemble_run(config, ProcessGroups.local())
    tokens = [shape.tokens for shape in run.dataset.shapes()]
    expected = size_global_batch(config.scheduling, tokens)
    assert run.config.scheduling.global_batch_tokens == expected.tokens
    assert run.dc.pipeline.options.global_batch_tokens == expected.tokens


def test_a_transformers_run_builds_its_model_once_per_process(tmp_path, opened, capsys):
    """An ``hf:`` folder with LoRA adapters: the check builds it on the meta device once,
    the rank once with its weights; the step records' MFU reads the built model before
    its adapters are injected (the spec the model built again on meta would give)."""
    pytest.importorskip("transformers")
    from runtime.models.test_model_source import _pretrained_folder

    from datacentric.profiling.factory import named_spec, run_spec

    folder = tmp_path / "hf"
    texts = _pretrained_folder(folder)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    argv = ["train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{docs}", "--max-tokens", "64"]
    argv += ["--tokenizer", str(folder / "tokenizer.json"), "--iterations", "1", "--no-progress"]
    argv += ["--out", str(tmp_path / "run"), "--cost-model", "analytic", "--no-plots"]
    argv += ["--lora.rank", "2", "--lora.targets", "q_proj,v_proj"]
    assert main([*argv, "--no-tensorboard"]) == 0, capsys.readouterr().err
    assert opened == {f"dataset jsonl:{docs}": 1, "model on meta": 1, "model with weights": 1}
    module = model_source.build_model_named(f"hf:{folder}", device="meta")
    assert run_spec(f"hf:{folder}", module, {}) == named_spec(f"hf:{folder}", {})
