"""Training configuration, checkpoint integrity and run positions (single process)."""

import json

import pytest
import torch
from repo_paths import ROOT

from datacentric.scheduling.resume import Position
from datacentric.settings import load_config
from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
from datacentric.train.checkpoints.checkpoint_load import load_checkpoint, weights_sha256
from datacentric.train.checkpoints.checkpoint_save import save_checkpoint
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint, verify_checkpoint


def test_toml_and_flags_merge(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nmodel = "dit"\nlr = 0.01\nbetas = [0.8, 0.9]\n')
    config = load_config(path, lr=None, seed=3)
    assert (config.model.model, config.training.lr, config.job.seed) == ("dit", 0.01, 3)
    assert config.training.betas == (0.8, 0.9)


def test_unknown_keys_are_named_with_a_suggestion(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("learning_rate = 0.1\npolicy = 'dcp-opt'\n")
    with pytest.raises(ValueError, match="unknown key 'learning_rate'"):
        load_config(path)
    with pytest.raises(ValueError, match="did you mean 'epochs'"):
        load_config(None, epoch=2)
    with pytest.raises(ValueError, match="fault_inject: must be 'RANK:ITERATION'"):
        load_config(None, fault_inject="soon")


def _model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def test_checkpoint_round_trip_is_bitwise(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    state = {"position": Position(iterations_done=1).to_json(), "iterations_done": 1}
    path = save_checkpoint(tmp_path, 1, model, optimizer, state)
    assert latest_checkpoint(tmp_path) == path
    assert not list(path.parent.glob("*.tmp"))
    other, other_opt = _model_and_optimizer(1)
    assert weights_sha256(other.state_dict()) != weights_sha256(model.state_dict())
    loaded = load_checkpoint(path, other, other_opt)
    assert loaded["iterations_done"] == 1
    assert weights_sha256(other.state_dict()) == weights_sha256(model.state_dict())
    for a, b in zip(optimizer.state.values(), other_opt.state.values()):
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"], rtol=0, atol=0)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    path = save_checkpoint(tmp_path, 2, model, optimizer, {"x": 1})
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-4] + b"oops")
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        verify_checkpoint(path)
    (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        verify_checkpoint(path)


def test_position_json_round_trip():
    p = Position(epoch=1, iterations_done=4, consumed=[3, 1], segment_world=2)
    assert Position.from_json(json.loads(json.dumps(p.to_json()))) == p


def test_example_config_loads_and_show_round_trips(tmp_path, capsys):

    from datacentric.cli.main import main

    example = ROOT / "examples" / "config.toml"
    config = load_config(example)
    assert config.parallelism.world == 2 and config.checkpoint.keep_last == 2
    assert config.scheduling.policy == "dcp-opt"
    assert main(["config", "--show", "--config", str(example), "--lr", "0.01"]) == 0
    shown = tmp_path / "shown.toml"
    shown.write_text(capsys.readouterr().out)
    again = load_config(shown)
    assert again == load_config(example, lr=0.01)


def test_every_train_flag_has_help_with_default():
    from datacentric.cli.main import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        if action.dest in ("help",) or action.help == "==SUPPRESS==":
            continue
        assert action.help, action.option_strings
        if action.dest not in ("config", "json") and action.option_strings != ["--quiet"]:
            assert "[default:" in action.help, action.option_strings


def test_policy_choices_match_the_scheduler():
    import typing

    from datacentric.scheduling import POLICIES
    from datacentric.settings.scheduling import Policy

    assert set(typing.get_args(Policy)) == set(POLICIES)
