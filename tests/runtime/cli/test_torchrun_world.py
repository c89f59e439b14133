"""Under torchrun (``[parallelism] world`` unset) the check before the ranks start
counts the run's steps on torchrun's world, as the ranks do."""

from __future__ import annotations

import pytest

from datacentric.cli.precheck import check_validation
from datacentric.cli.train import start_line
from datacentric.settings import load_config
from datacentric.shapes import SampleShape


class Shapes:
    """A training set of 40 samples of 65,536 tokens (2.6M: the default global batch,
    ``world * 2**18`` tokens, holds; 3 steps on 4 ranks, 10 on one)."""

    def shapes(self) -> list[SampleShape]:
        return [SampleShape(tokens=2**16)] * 40


@pytest.mark.parametrize(("torchrun", "refused"), [(True, True), (False, False)])
def test_validation_every_is_checked_on_torchrun_s_world(torchrun, refused, monkeypatch):
    """The check counted one rank under torchrun (``world or 1``): every=5 passed for a
    run of 3 steps on 4 ranks, whose validation then ran only after its last step."""
    if torchrun:
        for key, value in dict(RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="4").items():
            monkeypatch.setenv(key, value)
    else:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(key, raising=False)
    config = load_config(None, validation_dataset="split=0.1", validation_every=5)
    options = config.scheduling
    if not refused:
        check_validation(config, options, None, None, Shapes(), None)
        return
    with pytest.raises(ValueError, match=r"validation.every: 5 is more than the run's 3 steps"):
        check_validation(config, options, None, None, Shapes(), None)


@pytest.mark.parametrize(("env", "world", "ranks"), [({}, 3, "3 ranks"), ({}, None, "1 rank")])
def test_train_s_start_line_counts_the_ranks_that_run(env, world, ranks, monkeypatch):
    """Outside torchrun the start line counts ``--world``'s ranks (one without it)."""
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    config = load_config(None, world=world)
    assert f", {ranks}, " in start_line(config)


@pytest.mark.parametrize("world", [None, 2, 3])
def test_train_s_start_line_under_torchrun_counts_torchrun_s_world(world, monkeypatch):
    """Under torchrun the start line said ``--world``'s value (3 ranks) where torchrun
    started 2, just before the refusal of the two worlds."""
    for key, value in dict(RANK="0", WORLD_SIZE="2").items():
        monkeypatch.setenv(key, value)
    config = load_config(None, world=world)
    assert ", 2 ranks, " in start_line(config)


TORCHRUN_ENV = dict(
    RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500"
)


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (
            ["profile", "--model", "llama", "--lengths", "64", "--memory-gb", "1", "--world", "3"],
            "--world N",
        ),
        (["equivalence", "--model", "llama", "--world", "3"], "--world N"),
        (["equivalence", "--model", "llama"], "--world N"),
    ],
)
def test_commands_that_start_their_own_ranks_are_refused_under_torchrun(
    argv, fix, monkeypatch, capsys
):
    """``profile`` and ``equivalence`` under torchrun ignored its ranks and started
    their own ``--world`` ranks in each of torchrun's processes (2 x 3 ranks), exit 0;
    now one line names torchrun's world and how to run them, exit 2, before any rank."""
    from datacentric.cli.main import main

    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"datacentric {argv[0]}: runs under torchrun (WORLD_SIZE=2)")
    assert "without torchrun" in err[0] and fix in err[0]
