"""Every command of a shell block in README.md and docs/*.md, so the docs cannot go stale.

Each ``datacentric`` command must parse with today's flags (no unknown, removed or
deprecated flag),
and every command is either run (cheap ones as written, expensive ones with the tiny
overrides of :data:`RUN`) or skipped for a reason named in :data:`SKIPPED` (a GPU, several
nodes, a placeholder such as ``hf:my-model``, a set-up step). A command in neither fails
the test: a new doc command is classified when it is written.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
COMMAND = re.compile(r"^(\$ )?(datacentric|python|torchrun|pip|make)\b")

#: command (as the doc writes it, comment cut) -> the arguments this test appends so that it
#: finishes in seconds on two CPU cores (``None``: run as written)
RUN: dict[str, list[str] | None] = {
    "datacentric --version": None,
    "datacentric config --show --config examples/configs/cpu.toml --training.lr 1e-3": None,
    "datacentric schedule --config examples/configs/cpu.toml --model llama --hardware cpu-local": (
        None
    ),
    "datacentric simulate --dataset opensora-short --world 32 --hardware h100-sxm "
    "--policy static,dcp-pac,dcp-opt": ["--dataset-limit", "64"],
    "datacentric train --config examples/configs/cpu.toml": ["--iterations", "1"],
    "torchrun --standalone --nproc-per-node 2 examples/hf_llama_sp.py": ["--steps", "2"],
}

#: command prefix -> why it is not run here (every other doc command must be in RUN)
SKIPPED = {
    "make ": "set-up and the whole suite (what runs this test)",
    "pip install": "set-up",
    "python -c": "loads a model folder a previous (skipped) command wrote",
    "python benchmarks/gpu_check.py": "GPU check: tests/test_gpu_check.py runs its CPU mode",
    "torchrun --standalone --nproc-per-node 4": "four ranks: the same example runs on two",
    "torchrun --standalone --nproc-per-node 8": "8 GPUs",
    "torchrun --nnodes": "several nodes",
    "datacentric train --config examples/configs/one-gpu.toml": "a GPU",
    "datacentric train --world 8": "8 ranks on a placeholder dataset (jsonl:data/*.jsonl)",
    "datacentric train --config examples/configs/cpu.toml --dataset jsonl:data/train.jsonl": (
        "a placeholder dataset; the same config runs without it"
    ),
    "datacentric train --config run.toml": "a placeholder settings file (a drawing's label)",
    "datacentric train --model hf:my-model": "a placeholder model folder",
    "datacentric train --dataset ": "placeholder datasets (jsonl:, parquet:, latents:, factory)",
    "datacentric export runs/": "exports the run of a placeholder model",
    "datacentric prepare --pipeline my-": (
        "a placeholder pipeline folder: tests/runtime/prepare runs prepare on a tiny one"
    ),
    "datacentric train --model diffusers:my-": "a placeholder pipeline folder",
    "datacentric equivalence --model pkg.module:factory": "a placeholder factory",
    "datacentric equivalence --model hf:qwen2 --world 2": (
        "two minutes on two CPU cores: tests/runtime/verify/test_equivalence.py runs the same check"
    ),
    "datacentric schedule (": "a usage line, not a command",
    "datacentric plans ": "prose inside a block, not a command",
}


def shell_blocks(text: str) -> list[str]:
    """The bodies of the fenced blocks of ``text`` whose language is a shell's (or none)."""
    blocks, body, language = [], None, ""
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and body is None:
            body, language = [], fence.group(1)
        elif fence:
            if language in SHELL_FENCES:
                blocks.append("\n".join(body))
            body = None
        elif body is not None:
            body.append(line)
    return blocks


def doc_commands() -> list[tuple[str, str]]:
    """(doc, command) for every command line of every shell block (continuations joined,
    comments cut)."""
    found = []
    for doc in DOCS:
        for block in shell_blocks(doc.read_text(encoding="utf-8")):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                # a comment, or a drawing's next column, follows a gap or " #"
                command = " ".join(re.split(r"\s{3,}| #", line.strip())[0].split())
                if COMMAND.match(command):
                    found.append((doc.name, command.removeprefix("$ ")))
    return found


def skip_reason(command: str) -> str | None:
    return next((why for prefix, why in SKIPPED.items() if command.startswith(prefix)), None)


def test_every_doc_command_is_run_or_skipped_by_name() -> None:
    commands = doc_commands()
    assert len(commands) > 20, commands  # the parser found the blocks
    unclassified = [f"{doc}: {c}" for doc, c in commands if c not in RUN and skip_reason(c) is None]
    assert not unclassified, unclassified
    stale = [c for c in RUN if c not in {c for _, c in commands}]
    assert not stale, f"RUN names commands no doc has any more: {stale}"


def parse_problems(commands: list[tuple[str, str]]) -> list[str]:
    """What is wrong with each ``datacentric`` command of ``commands`` as today's parser
    reads it: an unknown, removed or deprecated flag."""
    from datacentric.cli.main import build_parser

    parser = build_parser()
    problems = []
    for doc, command in commands:
        if not command.startswith("datacentric ") or skip_reason(command) in (
            SKIPPED["datacentric schedule ("],
            SKIPPED["datacentric plans "],
        ):
            continue
        argv = shlex.split(command)[1:]
        if argv == ["--version"]:
            continue
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                _, extra = parser.parse_known_args(argv)
        except SystemExit:
            problems.append(f"{doc}: {command}: {stderr.getvalue().strip()}")
            continue
        if extra:
            problems.append(f"{doc}: {command}: unknown {extra}")
        if "deprecated" in stderr.getvalue():  # an old flag name still parses, with a note
            problems.append(f"{doc}: {command}: {stderr.getvalue().strip()}")
    return problems


def test_every_datacentric_command_parses_with_todays_flags() -> None:
    problems = parse_problems(doc_commands())
    assert not problems, problems


def test_the_parse_check_catches_unknown_and_deprecated_flags() -> None:
    planted = [
        ("x.md", "datacentric train --nproc 2"),
        ("x.md", "datacentric train --lerning-rate 1"),
    ]
    problems = parse_problems(planted)
    assert len(problems) == 2 and "--nproc is deprecated" in problems[0], problems


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(RUN))
def test_doc_command_runs(command: str, tmp_path: Path) -> None:
    argv = shlex.split(command) + list(RUN[command] or [])
    bin_dir = Path(sys.executable).parent
    if argv[0] in ("datacentric", "torchrun"):
        argv[0] = str(bin_dir / argv[0])
    if argv[0].endswith("datacentric") and "train" in argv:
        argv += ["--out", str(tmp_path / "run")]  # not the doc's runs/ folder
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=280, env=env, check=False
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"


def test_the_readme_commands_after_make_setup_run_in_a_fresh_shell() -> None:
    """The README's set-up block, pasted after ``make setup`` into a new shell (nothing of
    ours on PATH), leaves ``datacentric`` runnable."""
    venv = ROOT / ".venv"
    if not (venv / "bin" / "datacentric").exists():
        pytest.skip("no .venv made by make setup in this checkout")
    block = next(b for b in shell_blocks((ROOT / "README.md").read_text()) if "make setup" in b)
    after = [line.split("  #")[0].strip() for line in block.splitlines()]
    after = [line for line in after[after.index("make setup") + 1 :] if line]
    assert any(line.startswith("datacentric") for line in after), block
    fresh = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-c", "\n".join(after)],
        cwd=ROOT,
        env=fresh,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{after}\n{done.stdout[-800:]}\n{done.stderr[-800:]}"
