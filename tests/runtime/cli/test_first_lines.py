"""A long command says what it will do before it pays for its heavy imports: the first
line of ``demo``, ``train``, ``profile``, ``prepare``, ``schedule``, ``simulate`` and
``equivalence`` is written on stdout before torch, transformers or diffusers is imported
(with ``--json`` none: stdout is the JSON's, stderr the one line of a failure), after at
most :data:`FIRST_LINE_CPU_S` of the process's CPU time (what an idle machine's wall time
to it would be; a loaded one's wall time is not the command's). Measured to the first line
on a 2-core machine at load 5.8: 0.4-0.9 s each, where ``train`` took 5.3 s, ``prepare``
5.9 s and ``profile`` 17.6 s before."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from repo_paths import ROOT

#: Ends the process at the first line written to stdout or stderr, saying which heavy
#: modules were loaded by then.
FIRST_LINE = """
    import os, sys, time

    class FirstLine:
        def __init__(self, name):
            self.name = name

        def write(self, text):
            if text.strip():
                heavy = [m for m in ("torch", "transformers", "diffusers") if m in sys.modules]
                cpu = time.process_time()
                os.write(1, f"{self.name}; heavy {heavy}; cpu {cpu:.2f}; {text.strip()}".encode())
                os._exit(0)
            return len(text)

        def flush(self):
            pass

        def isatty(self):
            return False

    sys.stdout, sys.stderr = FirstLine("stdout"), FirstLine("stderr")
    from datacentric.cli.main import main

    main(sys.argv[1:])
"""

#: The most CPU seconds a command's process spends before its first line (the issue's
#: "within 3 s on an idle machine").
FIRST_LINE_CPU_S = 3.0

#: command -> (its arguments, the stream and the start of its first line)
COMMANDS = {
    "demo": (["--out", "{tmp}"], "stdout", "datacentric demo: llama on the standard-library"),
    "train": (
        ["--config", "examples/configs/cpu.toml", "--iterations", "3", "--out", "{tmp}"],
        "stdout",
        "datacentric train: llama on stdlib, 3 steps, 2 ranks, into {tmp} (loading torch",
    ),
    "profile": (
        ["--model", "llama", "--dataset", "stdlib", "--world", "2", "--memory-gb", "2"]
        + ["--profile-dir", "{tmp}"],
        "stdout",
        "datacentric profile: llama on stdlib, 2 gloo ranks, memory cap 2.0 GiB, into {tmp}",
    ),
    "prepare": (
        ["--pipeline", "{tmp}/wan", "--media", "{tmp}/clips.csv", "--out", "{tmp}/latents"],
        "stdout",
        "datacentric prepare: encoding {tmp}/clips.csv with {tmp}/wan's VAE",
    ),
    "equivalence": (
        ["--model", "llama", "--world", "2"],
        "stdout",
        "datacentric equivalence: llama on 2 ranks: one mixed step against one process",
    ),
    "schedule": (
        ["--dataset", "sft-longtail", "--world", "8", "--policy", "dcp-opt"],
        "stdout",
        "datacentric schedule: dcp-opt on sft-longtail at 8 ranks with the analytic",
    ),
    "simulate": (
        ["--dataset", "opensora-short", "--world", "32"],
        "stdout",
        "datacentric simulate: the default policies on opensora-short at 32 ranks",
    ),
}


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_the_first_line_comes_before_torch_is_imported(case: str, tmp_path) -> None:
    arguments, stream, start = COMMANDS[case]
    argv = [case.split()[0], *(a.replace("{tmp}", str(tmp_path)) for a in arguments)]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIRST_LINE), *argv],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    said = done.stdout[-2000:] + done.stderr[-2000:]
    where, heavy, cpu, line = (done.stdout.split("; ", 3) + ["", "", "", ""])[:4]
    assert (where, heavy) == (stream, "heavy []"), said
    assert line.startswith(start.replace("{tmp}", str(tmp_path))), said
    assert cpu.startswith("cpu ") and float(cpu[4:]) <= FIRST_LINE_CPU_S, said


def test_json_output_gets_no_first_line(capsys) -> None:
    from datacentric.cli.ranks import announce

    announce("train", "llama on stdlib", json_output=True)
    assert capsys.readouterr() == ("", "")  # stdout is the JSON's, stderr the failure's
    announce("train", "llama on stdlib")
    assert capsys.readouterr() == ("datacentric train: llama on stdlib\n", "")
