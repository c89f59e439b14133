"""One line per mistake: a suggestion for a mistyped flag, a missing --config file before
torch loads, too little data named by its setting, and once under torchrun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT

from datacentric.cli.main import closest_flag, main
from datacentric.cli.precheck import check_samples_for_model_check
from datacentric.cli.ranks import first_to_say


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--lerning-rate", "--lr"),
        ("--learning_rate", "--lr"),
        ("--max-steps", "--iterations"),
        ("--log-evry", "--log-every"),
        ("--training.lr_shedule", "--training.lr_schedule"),
    ],
)
def test_a_mistyped_flag_gets_the_closest_name(typed, meant, capsys):
    assert main(["train", typed, "3"]) == 2
    err = capsys.readouterr().err.strip()
    # a transformers name also says what it maps to, after the question
    assert err.startswith(
        f"datacentric train: unrecognized arguments: {typed} 3 (did you mean {meant}?"
    )


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--eval_steps", "--validation-every"),
        ("--validation.freq", "--validation-every"),  # torchtitan
        ("--per_device_train_batch_size", "--global-batch-samples"),
        ("--learning_rate", "--lr"),
        ("--num_train_epochs", "--epochs"),
        ("--max_steps", "--iterations"),
        ("--output_dir", "--out"),
        ("--save-steps", "--checkpoint-every"),
    ],
)
def test_another_trainers_flag_gets_our_equivalent(typed, meant, capsys):
    assert main(["train", typed, "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"(did you mean {meant}? " in err and len(err.splitlines()) == 1


def test_no_suggestion_for_a_flag_close_to_nothing():
    assert closest_flag("--no-such-flag", ["--lr", "--epochs"]) is None
    assert closest_flag("--learning-rate", ["--epochs"]) is None  # no --lr in this command


def test_a_missing_config_file_is_reported_before_torch_loads(tmp_path):
    code = (
        "import sys\nfrom datacentric.cli.main import main\n"
        f"status = main(['train', '--config', {str(tmp_path / 'none.toml')!r}])\n"
        "assert status == 2 and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stderr.strip() == f"datacentric train: --config {tmp_path / 'none.toml'}: no such file"
    )


def test_too_few_samples_for_the_model_check_names_the_data_settings():
    with pytest.raises(ValueError, match=r"has 1 sample of 4 tokens or more \(2 in all\)"):
        check_samples_for_model_check([100, 3])
    with pytest.raises(ValueError, match="data.dataset_limit"):
        check_samples_for_model_check([100])
    check_samples_for_model_check([4, 4])
    # many samples, all short (documents cut by --max-tokens 3): the setting that cut them
    with pytest.raises(ValueError, match=r"\(1014 in all\).*or longer samples \(data.max_tokens\)"):
        check_samples_for_model_check([3] * 1014)
    # a split that left too few: the held-out setting is named, as the fix
    with pytest.raises(
        ValueError, match=r"\(1 in all, after validation.dataset split=0.5 held out 1\)"
    ):
        check_samples_for_model_check([100], "split=0.5", 1)
    with pytest.raises(ValueError, match=r"or hold out fewer \(validation.dataset\)$"):
        check_samples_for_model_check([100], "split=0.5", 1)


def test_one_document_for_a_transformers_model_names_the_data_settings(tmp_path, capsys):
    """A transformers model's check on a small copy packed two samples before this line
    was said: one document (a text file shorter than --max-tokens) said only 'the check
    needs 2 samples of 4 tokens or more'."""
    data = tmp_path / "one.jsonl"
    data.write_text('{"text": "a single document of a few words"}\n')
    argv = ["train", "--model", "hf:qwen2", "--dataset", f"jsonl:{data}", "--world", "1"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "has 1 sample of 4 tokens or more (1 in all)" in err and "data.dataset" in err


def test_the_first_rank_of_a_launch_says_a_line(tmp_path, monkeypatch):
    assert first_to_say("anything")  # outside torchrun: always
    attempt = tmp_path / "run_x" / "attempt_0"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
    said = []
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / str(rank) / "error.json"))
        said.append([first_to_say("datacentric train: bad"), first_to_say(f"rank {rank} only")])
    assert said == [[True, True], [False, True]]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
    reason="no torchrun",
)
def test_torchrun_prints_a_configuration_error_once(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    argv = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "datacentric"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*argv, "train", "--no-such-flag"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("datacentric train:")]
    assert len(lines) == 1, done.stderr  # (a suggestion of the closest flag may follow)
    assert lines[0].startswith("datacentric train: unrecognized arguments: --no-such-flag")


@pytest.mark.parametrize("model", ["hf:gpt2", "hf:opt"])
def test_a_sample_past_a_learned_position_table_is_refused_before_ranks(model, tmp_path, capsys):
    """GPT-2 and OPT learn a table of positions: a longer sample failed in the ranks with
    'rank 0 failed: IndexError: index out of range in self'."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path / "model"
    sizes = dict(vocab_size=256, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    if model == "hf:gpt2":
        config = AutoConfig.for_model(
            "gpt2", n_positions=24, n_embd=16, n_layer=1, n_head=2, attn_pdrop=0.0
        )
    else:
        config = AutoConfig.for_model(
            "opt", max_position_embeddings=24, ffn_dim=32, attention_dropout=0.0, **sizes
        )
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    data = tmp_path / "docs.jsonl"
    data.write_text('{"text": "short one"}\n{"text": "' + "x" * 30 + '"}\n')
    argv = ["train", "--model", f"hf:{folder}", "--tokenizer", "bytes", "--world", "1"]
    argv += ["--dataset", f"jsonl:{data}", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "sample 1 (" in err and "docs.jsonl:2) has 30 tokens, more than the 24 positions" in err
    assert "--max-tokens 24 or less" in err
    assert main([*argv, "--max-tokens", "24", "--iterations", "1", "--cost-model", "analytic"]) == 0


@pytest.mark.parametrize(("device", "gpus"), [("cuda", 0), ("cuda:2", 2)])
def test_a_cuda_device_this_machine_lacks_is_one_line_naming_the_setting(
    device, gpus, tmp_path, monkeypatch, capsys
):
    """``--device cuda`` where torch has no CUDA ended in 'internal error AssertionError:
    Torch not compiled with CUDA enabled', raised while the check priced the model."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    data = tmp_path / "docs.jsonl"
    data.write_text('{"text": "a first document of words"}\n{"text": "and a second one"}\n')
    argv = ["train", "--model", "llama", "--dataset", f"jsonl:{data}", "--device", device]
    assert main([*argv, "--cost-model", "analytic", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    have = "2 CUDA device(s), cuda:0 to cuda:1" if gpus else "no CUDA device"
    assert err == (
        f"datacentric train: parallelism.device: {device} is not a device of this machine "
        f"({have}); pass --device cpu, or leave it unset (cuda when available, else the CPU)"
    )
    assert not (tmp_path / "run").exists()  # refused before the run folder is claimed


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_profile_dir_that_is_a_file_is_refused_before_the_ranks(below, tmp_path, capsys):
    """``--profile-dir FILE`` failed when the ranks saved the profile, after measuring
    it: 'rank 0 failed: FileExistsError: [Errno 17] File exists' at --world 2."""
    blocking = tmp_path / "a-file"
    blocking.write_text("not a folder")
    folder = blocking / below if below else blocking
    data = tmp_path / "docs.jsonl"
    data.write_text('{"text": "a first document of words"}\n{"text": "and a second one"}\n')
    argv = ["train", "--model", "llama", "--dataset", f"jsonl:{data}"]
    argv += ["--profile-dir", str(folder), "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    what = f"lies under the file {blocking}" if below else "is a file"
    assert err == (
        f"datacentric train: cost.profile_dir: {folder} {what}; name a folder for the profile "
        "(--profile-dir DIR), or leave it unset (the run's <out>/profile)"
    )
    assert not (tmp_path / "run").exists()


def test_a_node_lacking_the_dataset_is_named_by_its_host(tmp_path, monkeypatch, capsys):
    """Under torchrun on several nodes, a node without the ``--dataset`` file said a line
    naming the file alone, which ``srun``'s merged logs cannot tell apart; on one
    machine the line stays as it was."""
    from datacentric.cli import ranks
    from datacentric.cli.precheck import check_dataset
    from datacentric.settings import load_config

    spec = f"jsonl:{tmp_path / 'absent.jsonl'}"
    config = load_config(None, dataset=spec, model="tiny")
    monkeypatch.setattr(ranks.socket, "gethostname", lambda: "node-b")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    said = []
    for local in ("2", "4"):  # two nodes of 2 ranks, then one of 4
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert check_dataset(config, "train") is None
        said.append(capsys.readouterr().err.strip())
    line = f"{spec}: no file matches (check the path or glob)"
    assert said == [f"datacentric train: host node-b: {line}", f"datacentric train: {line}"]
