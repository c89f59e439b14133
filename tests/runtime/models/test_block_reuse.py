"""A causal LM that calls a block twice in one forward (Dory, a recurrent-depth model
looping over its middle layers): the pre-check counts each block's calls and, where
FSDP2 would hold it on several ranks, holds it with DDP instead, with a note, before
ranks start; under DDP the model is exact against its own forward in one process."""

from __future__ import annotations

import json

import pytest
import torch
from cli_here import cli_here

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = ["--dataset", "stdlib", "--dataset-limit", "8", "--max-tokens", "128"]
RUN += ["--cost-model", "analytic", "--iterations", "1", "--no-progress"]


@pytest.fixture
def dory(tmp_path) -> str:
    """A 4-layer Dory: one input layer, two recurrent layers run twice, one output layer."""
    try:
        config = transformers.AutoConfig.for_model(
            "dory",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            n_input_layers=1,
            n_output_layers=1,
            n_recurrent_loops=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=300,
            max_position_embeddings=4096,
        )
    except ValueError:
        pytest.skip(f"transformers {transformers.__version__} has no Dory")
    torch.manual_seed(0)
    folder = tmp_path / "dory"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return f"hf:{folder}"


def test_the_pre_check_counts_block_calls_and_chooses_ddp(dory, tmp_path, capsys):
    from datacentric.cli.flags import config_from_args
    from datacentric.cli.main import build_parser
    from datacentric.cli.precheck import check_dataset
    from datacentric.data.stdlib import StdlibCorpus
    from datacentric.models.hf import small_copy
    from datacentric.models.source import build_model_named
    from datacentric.settings.sections import ModelConfig, ParallelismConfig
    from datacentric.train.build import BlockReuseError, check_model
    from datacentric.verify.model_contract import block_calls

    copy = small_copy(build_model_named(dory, device="meta"))
    data = StdlibCorpus(max_tokens=64, limit=4)
    assert block_calls(copy, data) == [1, 2, 2, 1]
    fsdp2 = ParallelismConfig(world=2, shard="fsdp2")
    with pytest.raises(BlockReuseError, match="calls block 1 2 times.*pass --shard ddp"):
        check_model(ModelConfig(model=dory), data, parallelism=fsdp2)
    # one rank holds the model whole, and DDP gathers nothing: both pass the check
    check_model(ModelConfig(model=dory), data, parallelism=ParallelismConfig(world=1))
    check_model(ModelConfig(model=dory), data, parallelism=ParallelismConfig(world=2, shard="ddp"))
    # train's check before ranks start: the default FSDP2 becomes DDP, said in a note
    argv = ["train", "--model", dory, *RUN, "--world", "2", "--out", str(tmp_path / "run")]
    config = config_from_args(build_parser().parse_args(argv))
    assert config.parallelism.shard == "fsdp2"
    capsys.readouterr()
    prechecked = check_dataset(config, "train")
    err = capsys.readouterr().err
    assert prechecked is not None and prechecked.shard == "ddp", err
    assert "DoryForCausalLM calls block 1 2 times in one forward" in err
    assert "held with DDP (--shard ddp" in err


@pytest.mark.slow
def test_the_default_settings_train_it_with_ddp(dory, tmp_path, capsys):
    out = tmp_path / "run"
    status, stdout, err = cli_here(
        ["train", "--model", dory, *RUN, "--world", "2", "--json", "--out", str(out)], capsys
    )
    assert status == 0, err
    assert json.loads(stdout.strip().splitlines()[-1])["iterations_done"] == 1
    assert json.loads((out / "config.json").read_text())["parallelism"]["shard"] == "ddp"


@pytest.mark.slow
def test_under_ddp_its_gradients_equal_its_own_forward_in_one_process(dory, capsys):
    """SP 2, accumulation and recomputation on 2 ranks against transformers' own forward
    of each sample alone in one process: every gradient within 1e-5."""
    status, out, err = cli_here(
        ["equivalence", "--model", dory, "--world", "2", "--wrapper", "ddp", "--json"], capsys
    )
    assert status == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["passed"] and report["max_rel_grad_err"] <= 1e-5
    assert report["reference"].startswith("transformers DoryForCausalLM.forward")
