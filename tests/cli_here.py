"""``datacentric ARGV`` run in the test's own process, for commands whose test is not
about starting a process (bad input, ``export``): a fresh interpreter imports torch and
the model libraries again, which is most of such a command's time."""

from __future__ import annotations

import json


def cli_here(argv: list[str], capsys) -> tuple[int, str, str]:
    """``datacentric ARGV`` in this process: (exit status, stdout, stderr)."""
    from datacentric.cli.main import main

    try:
        status = main(argv)
    except SystemExit as done:
        status = done.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def cli_json_here(argv: list[str], capsys) -> dict:
    """``datacentric ARGV --json`` in this process: its last stdout line as JSON, after
    checking it exited 0."""
    status, out, err = cli_here(argv, capsys)
    assert status == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])
