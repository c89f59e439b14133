"""Every command of a shell block and every Python block in README.md and docs/*.md, so the
docs cannot go stale.

Each ``datacentric`` command must parse with today's flags (no unknown, removed or
deprecated flag),
and every command is either run (cheap ones as written, expensive ones with the tiny
overrides of :data:`RUN`) or skipped for a reason named in :data:`SKIPPED` (a GPU, several
nodes, a placeholder such as ``hf:my-model``, a set-up step). A command in neither fails
the test: a new doc command is classified when it is written. Usage lines (``datacentric
schedule (--dataset NAME | ...)``) and inline mentions (`` `datacentric plan --profile-dir
DIR` ``) may name only the flags their command's ``--help`` shows.

Every Python block is linted with the project's ruff rules and is run (with the tiny inputs
of :data:`PYTHON_BLOCKS`) or skipped for a reason named there; a fragment (names the page
defines around it) may use names it does not define.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
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
    "python benchmarks/gpu_check.py": "GPU check: tests/test_gpu_check.py runs its CPU mode",
    "torchrun --standalone --nproc-per-node 4": "four ranks: the same example runs on two",
    "torchrun --standalone --nproc-per-node 8": "8 GPUs",
    "torchrun --nnodes": "several nodes",
    "datacentric train --config examples/configs/one-gpu.toml": "a GPU",
    "datacentric train --config examples/configs/cpu.toml --dataset jsonl:data/train.jsonl": (
        "a placeholder dataset; the same config runs without it"
    ),
    "datacentric train --config run.toml": "a placeholder settings file (a drawing's label)",
    "datacentric train --dataset ": "placeholder datasets (jsonl:, parquet:, latents:, factory)",
    "datacentric train --model diffusers:my-wan-pipe/transformer": (
        "renders 33 frames at 480x832 every 100 steps: test_prompt_settings renders tiny ones"
    ),
    "datacentric equivalence --model pkg.module:factory": "a placeholder factory",
    "datacentric equivalence --model hf:qwen2 --world 2": (
        "two minutes on two CPU cores: tests/runtime/verify/test_equivalence.py runs the same check"
    ),
    "datacentric tiny --out tiny": "ON_TINY's test runs it first; so does test_tiny_inputs.py",
    "datacentric prepare --pipeline my-wan-pipeline --media clips --out": (
        "clips captioned by NAME.txt files (tiny's list them in captions.csv): "
        "tests/runtime/prepare runs prepare on such folders"
    ),
    "datacentric train --model diffusers:my-wan-pipeline/transformer --lora.rank": (
        "a placeholder prompts file, 30-step renders: test_prompt_settings renders tiny ones"
    ),
    "datacentric export runs/wan-lora": "exports the run of the command above (not run)",
    "datacentric schedule (": "a usage line, not a command",
}


#: Set to 1 to run :data:`ON_TINY` (4 min 36 s on two CPU cores at load 8).
TINY_ENV = "DATACENTRIC_DOC_TINY"
#: command -> the arguments appended so that it finishes in seconds (``None``: as written).
#: Each names the inputs ``datacentric tiny --out tiny`` writes under the names the docs use
#: for a user's own (``my-model/``, ``data/train.jsonl`` and ``.parquet``, ``chat.jsonl``,
#: ``heldout.jsonl``, ``tokenizer.json``, ``my-wan-pipeline/``, ``clips/captions.csv``) and
#: runs, doc by doc in the doc's order, from inside a fresh copy of that folder (with
#: :data:`TINY_ENV` set).
ON_TINY: dict[str, list[str] | None] = {
    "datacentric train --model hf:my-model --dataset jsonl:data/*.jsonl --world 2 "
    "--iterations 100 --out runs/ft": ["--iterations", "2"],
    "datacentric export runs/ft --out my-model-ft": None,
    "datacentric train --model hf:my-model --dataset jsonl:chat.jsonl --lora.rank 16 --world 2 "
    "--epochs 1 --out runs/lora": ["--iterations", "2"],
    "datacentric export runs/lora --out my-adapter": None,
    "datacentric train --dataset jsonl:data/*.jsonl --tokenizer tokenizer.json "
    "--max-tokens 32768 --world 2": ["--iterations", "2"],
    # the block's commands are alternatives, each into runs/train: this one replaces the last
    "datacentric train --dataset parquet:data/ --text-field content --model llama --world 2": [
        "--iterations",
        "2",
        "--overwrite",
    ],
    "datacentric train --model hf:my-model --dataset jsonl:data/train.jsonl --tokenizer "
    "my-model --validation.dataset jsonl:heldout.jsonl --validation.every 2 --iterations 4 "
    "--world 2": ["--iterations", "2"],
    "datacentric train --model hf:my-model --dataset jsonl:chat.jsonl --lora.rank 4 "
    "--iterations 2 --out runs/lora": None,
    "datacentric prepare --pipeline my-wan-pipeline --media clips/captions.csv "
    "--out data/latents": None,
    "datacentric train --model diffusers:my-wan-pipeline --dataset latents:data/latents "
    "--iterations 2 --out runs/wan": None,
    "datacentric train --model hf:my-model --dataset jsonl:data/*.jsonl --world 2 --out runs/ft": [
        "--iterations",
        "2",
    ],
    'python -c "from transformers import AutoModelForCausalLM as M; '
    "M.from_pretrained('my-model-ft')\"": None,
    "datacentric prepare --pipeline my-wan-pipeline --media clips/captions.csv "
    "--out data/latents --world 2": None,
    "datacentric train --model diffusers:my-wan-pipeline --dataset latents:data/latents "
    "--world 2": ["--iterations", "2"],
    "datacentric export runs/train --out my-wan-finetuned": None,
    "datacentric train --world 8 --dataset jsonl:data/*.jsonl --model llama": ["--iterations", "1"],
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
    unclassified = [
        f"{doc}: {c}" for doc, c in commands if c not in RUN | ON_TINY and skip_reason(c) is None
    ]
    assert not unclassified, unclassified
    stale = [c for c in [*RUN, *ON_TINY] if c not in {c for _, c in commands}]
    assert not stale, f"RUN or ON_TINY names commands no doc has any more: {stale}"
    unused = [p for p in SKIPPED if not any(c.startswith(p) for _, c in commands)]
    assert not unused, f"SKIPPED names commands no doc has any more: {unused}"


def datacentric_arguments(command: str) -> list[str] | None:
    """The arguments ``datacentric`` gets from ``command`` (``datacentric ARGS``, or
    ``torchrun ... -m datacentric ARGS``; a ``...`` the doc elides read as a value); None for
    other programs and usage lines."""
    if command.startswith("datacentric schedule ("):
        return None
    words = shlex.split(command)
    if words[0] == "torchrun" and "-m" in words and words[words.index("-m") + 1] == "datacentric":
        words = words[words.index("-m") + 1 :]
    if words[0] != "datacentric":
        return None
    return ["VALUE" if word == "..." else word for word in words[1:]]


def parse_problems(commands: list[tuple[str, str]]) -> list[str]:
    """What is wrong with each ``datacentric`` command of ``commands`` as today's parser
    reads it: an unknown, removed or deprecated flag."""
    from datacentric.cli.main import build_parser

    parser = build_parser()
    problems = []
    for doc, command in commands:
        argv = datacentric_arguments(command)
        if argv is None or argv == ["--version"]:
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
        ("x.md", "torchrun --standalone --nproc-per-node 8 -m datacentric train --lerning-rate 1"),
        ("x.md", "torchrun --nproc-per-node 8 -m datacentric train --dataset ... --lr 1"),
    ]
    problems = parse_problems(planted)
    assert len(problems) == 3 and "--nproc is deprecated" in problems[0], problems
    assert "torchrun" in problems[2] and "--lerning-rate" in problems[2], problems


#: a script a doc runs (``python SCRIPT`` or ``torchrun ... SCRIPT``), then its arguments
SCRIPT = re.compile(r"^(?:python|torchrun(?: --?[\w-]+(?: \d+)?)*) ([\w/.-]+\.py)\b(.*)$")


def script_flags(script: str) -> set[str]:
    """The flags a repository script's parser declares: the ``--`` strings of its
    ``add_argument`` calls (read, not run: importing torch for ``--help`` took a minute)."""
    import ast

    tree = ast.parse((ROOT / script).read_text(encoding="utf-8"))
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and str(arg.value).startswith("--")
    }


def script_flag_problems(commands: list[tuple[str, str]]) -> list[str]:
    """Each flag a doc gives a repository script (``benchmarks/``, ``examples/``) that the
    script's parser does not declare."""
    problems = []
    for doc, command in commands:
        match = SCRIPT.match(command)
        if match is None:
            continue
        script, rest = match.groups()
        unknown = [flag for flag in FLAG.findall(rest) if flag not in script_flags(script)]
        if unknown:
            problems.append(f"{doc}: {command}: not declared by {script}: {unknown}")
    return problems


def test_the_scripts_docs_run_take_the_flags_they_are_given() -> None:
    commands = doc_commands()
    assert any(SCRIPT.match(c) for _, c in commands)
    problems = script_flag_problems(commands)
    assert not problems, problems
    planted = [
        ("x.md", "torchrun --standalone --nproc-per-node 2 examples/hf_llama_sp.py --stpes 2")
    ]
    assert "['--stpes']" in script_flag_problems(planted)[0]


#: the most seconds a command of :data:`RUN` may take: the slowest, the torchrun example,
#: took 10 s at load 5 and at most 70 s at load 9 to 14 (two CPU burners and a second copy
#: of it at once; 34 runs, none failed)
RUN_LIMIT_S = 280
#: a line a torchrun rank wrote (``[rank1]: RuntimeError: ...``)
RANK_LINE = re.compile(r"^\[rank\d+\]:")


def run_command(argv: list[str], limit_s: float, **popen) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of ``argv``; ``None`` for a command still running
    after ``limit_s``, which is stopped with SIGTERM (torchrun then stops its ranks, which
    run in sessions of their own: a kill of torchrun alone left them running), then
    killed."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    ) as process:
        try:
            out, err = process.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                out, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired as still:
                process.kill()
                out, err = (str(still.output or ""), str(still.stderr or ""))
            return None, out, err
    return process.returncode, out, err


def failure_report(command: str, code: int | None, seconds: float, out: str, err: str) -> str:
    """What a failed command said: how it ended and when, the tail of its output, and every
    line a torchrun rank wrote (the rank's error, which torchrun's summary of the failure,
    'exitcode: 1 ... To enable traceback see ...', pushes out of the tail)."""
    ended = "stopped, still running" if code is None else f"exit status {code}"
    ranks = [line for line in err.splitlines() if RANK_LINE.match(line)][-60:]
    return "\n".join(
        [f"{command}: {ended} after {seconds:.0f} s", out[-1500:], *ranks, err[-1500:]]
    )


def test_a_failed_command_s_report_keeps_its_ranks_error() -> None:
    err = "[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: the cause\n"
    err += "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 2000
    report = failure_report("torchrun x.py", 1, 12.3, "step 0\n", err)
    assert "[rank1]: RuntimeError: the cause" in report.splitlines(), report
    assert report.startswith("torchrun x.py: exit status 1 after 12 s\nstep 0\n"), report
    assert failure_report("c", None, 280.2, "", "").startswith(
        "c: stopped, still running after 280 s"
    )


def test_a_command_past_its_limit_is_stopped_with_what_it_wrote() -> None:
    script = "import time; print('begun', flush=True); time.sleep(60)"
    start = time.monotonic()
    code, out, _ = run_command([sys.executable, "-c", script], 2)
    assert (code, out) == (None, "begun\n") and time.monotonic() - start < 30


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
    start = time.monotonic()
    code, out, err = run_command(argv, RUN_LIMIT_S, cwd=ROOT, env=env)
    assert code == 0, failure_report(command, code, time.monotonic() - start, out, err)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """The folder ``datacentric tiny --out tiny`` writes, as docs/model-folders.md runs it."""
    where = tmp_path_factory.mktemp("inputs")
    command = "datacentric tiny --out tiny"
    assert command in {c for _, c in doc_commands()}
    argv = [str(Path(sys.executable).parent / "datacentric"), *shlex.split(command)[1:]]
    done = subprocess.run(argv, cwd=where, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    return where / "tiny"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(TINY_ENV) != "1", reason=f"{TINY_ENV}=1 runs them")
@pytest.mark.parametrize("doc", sorted({doc for doc, c in doc_commands() if c in ON_TINY}))
def test_doc_commands_run_on_tiny_inputs(doc: str, tiny_folder: Path, tmp_path: Path) -> None:
    import shutil

    folder = shutil.copytree(tiny_folder, tmp_path / "tiny")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in [c for d, c in doc_commands() if d == doc and c in ON_TINY]:
        argv = shlex.split(command) + list(ON_TINY[command] or [])
        argv[0] = (
            sys.executable if argv[0] == "python" else str(Path(sys.executable).parent / argv[0])
        )
        done = subprocess.run(
            argv, cwd=folder, capture_output=True, text=True, timeout=280, env=env, check=False
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


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from datacentric.cli.main import build_parser

    return build_parser()._subparsers._group_actions[0].choices


#: a ``--flag`` inside a text (not the end of a longer word such as ``x--y``)
FLAG = re.compile(r"(?<![\w-])--[a-z][\w.-]*[a-z0-9]")
GLOBAL_FLAGS = {"--help", "--debug", "--verbose", "--version"}


def flag_mentions() -> list[tuple[str, str, str]]:
    """(doc, sub-command, text) of every usage block (``datacentric SUB (...``, all its
    lines) and every inline code span ``datacentric SUB ...`` outside the blocks."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in shell_blocks(text):
            usage = re.match(r"\s*datacentric ([a-z]+) \(", block)
            if usage:
                found.append((doc.name, usage.group(1), block))
        prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
        for span in re.finditer(r"`datacentric ([a-z]+)([^`]*)`", prose):
            found.append((doc.name, span.group(1), span.group(2)))
    return found


def flag_problems(mentions: list[tuple[str, str, str]]) -> list[str]:
    """Each flag of ``mentions`` its command's ``--help`` does not show (unknown, retired,
    or deprecated: an old name parses with a note but is hidden)."""
    commands = _subcommands()
    problems = []
    for doc, command, text in mentions:
        if command not in commands:
            problems.append(f"{doc}: datacentric {command}: no such command")
            continue
        shown = {
            flag
            for action in commands[command]._actions
            if action.help != argparse.SUPPRESS
            for flag in action.option_strings
        }
        unknown = [f for f in FLAG.findall(text) if f not in shown | GLOBAL_FLAGS]
        if unknown:
            problems.append(f"{doc}: datacentric {command}: not in its --help: {unknown}")
    return problems


def test_usage_lines_and_inline_commands_name_todays_flags() -> None:
    mentions = flag_mentions()
    assert any(text.lstrip().startswith("datacentric schedule (") for _, _, text in mentions)
    problems = flag_problems(mentions)
    assert not problems, problems
    planted = [("x.md", "schedule", "datacentric schedule (--profile DIR | --model M)")]
    planted.append(("x.md", "simulate", " --preset opensora-short --world 32"))
    assert [p.split(": ")[-1] for p in flag_problems(planted)] == [
        "['--profile']",
        "['--preset']",
    ]


def test_the_profile_dir_flag_reads_as_the_docs_write_it() -> None:
    """The synopses write ``--profile-dir DIR``; the commands' usage shows the same (it
    showed ``--profile-dir PROFILE``, the retired flag's name)."""
    for command in ("schedule", "plan"):
        usage = " ".join(_subcommands()[command].format_usage().split())
        assert "[--profile-dir DIR]" in usage, usage


PYTHON_FENCES = ("python", "py")

#: (doc, how a Python block begins) -> how the test treats it: a dict of replacements runs
#: the block with them (tiny inputs, ``{tmp}`` a scratch folder; empty: as written); a
#: string says why it is not run. Every block is linted; one whose reason begins with
#: "fragment" may use names the page defines around it.
PYTHON_BLOCKS: dict[tuple[str, str], dict[str, str] | str] = {
    ("README.md", "import torch\n\nfrom datacentric import DataCentric\n"): {
        "jsonl:data/train.jsonl": "jsonl:{tmp}/train.jsonl",
        "hf:path/to/model": "hf:llama",
        "iterations=6": "iterations=2",
    },
    ("README.md", "from datacentric import DataCentric\n\ndc = "): (
        "fragment: the lines examples/train_datacentric.py changes (test_train_api runs it)"
    ),
    ("diffusers.md", "import torch\n\nfrom datacentric.models.diffusers_build import"): (
        "fragment: a placeholder folder (path/to/transformer) and the page's batch"
    ),
    ("huggingface.md", "import torch\n\nfrom datacentric.models import HFCausalLM"): {},
    ("model-folders.md", "from transformers import AutoModelForCausalLM"): (
        "downloads a model from the Hub"
    ),
    ("model-folders.md", "from diffusers import WanPipeline"): "downloads a pipeline from the Hub",
    ("prepare.md", "from diffusers import WanPipeline"): (
        "a placeholder pipeline folder and LoRA: tests/runtime/train/test_prompt_settings.py "
        "renders the same way with a tiny one"
    ),
    ("integrations.md", "from datasets import Dataset\n"): (
        "a placeholder model folder (my-model): tests/runtime/integrations runs the drop-in "
        "trainers on tiny ones"
    ),
    ("integrations.md", "from transformers import AutoModelForCausalLM"): (
        "fragment: the page's tokenizer and tokenized dataset, a placeholder folder (my-model)"
    ),
    ("models.md", "import torch\n\nfrom datacentric.models import build_model"): (
        "fragment: the page's batch (a PackedBatch)"
    ),
    ("scheduling.md", "from datacentric.scheduling import build_schedule"): (
        "fragment: the shapes, cost model and plan of the page's earlier steps"
    ),
    ("scheduling.md", "from torch.utils.data import DataLoader"): (
        "fragment: a run's schedule, rank, dataset and model"
    ),
}


def python_blocks() -> list[tuple[str, str]]:
    """(doc, body) of every Python block of README.md and docs/*.md."""
    found = []
    for doc in DOCS:
        body, language = None, ""
        for line in doc.read_text(encoding="utf-8").splitlines():
            fence = re.match(r"^\s*```(\S*)", line)
            if fence and body is None:
                body, language = [], fence.group(1)
            elif fence:
                if language in PYTHON_FENCES:
                    found.append((doc.name, "\n".join(body) + "\n"))
                body = None
            elif body is not None:
                body.append(line)
    return found


def classified_python_blocks() -> list[tuple[str, str, dict[str, str] | str]]:
    """(doc, body, treatment) of every Python block; fails on a block no entry of
    :data:`PYTHON_BLOCKS` (or more than one) describes, and on an entry that describes none."""
    blocks = python_blocks()
    found, unclassified = [], []
    for doc, body in blocks:
        keys = [k for k in PYTHON_BLOCKS if k[0] == doc and body.startswith(k[1])]
        if len(keys) != 1:
            unclassified.append(f"{doc}: {body.splitlines()[0]!r} ({len(keys)} entries)")
        else:
            found.append((doc, body, PYTHON_BLOCKS[keys[0]]))
    assert not unclassified, f"classify in PYTHON_BLOCKS: {unclassified}"
    stale = [
        k for k in PYTHON_BLOCKS if not any(d == k[0] and b.startswith(k[1]) for d, b in blocks)
    ]
    assert not stale, f"PYTHON_BLOCKS names blocks no doc has any more: {stale}"
    return found


def test_every_python_block_passes_the_projects_lint(tmp_path: Path) -> None:
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed (the dev extra)")
    files = []
    for n, (doc, body, how) in enumerate(classified_python_blocks()):
        fragment = isinstance(how, str) and how.startswith("fragment")
        head = "# ruff: noqa: F821\n" if fragment else ""  # names the page defines
        files.append(tmp_path / f"{doc.removesuffix('.md')}_{n}.py")
        files[-1].write_text(head + body, encoding="utf-8")
    planted = tmp_path / "planted.py"
    planted.write_text("optimizer.step()\n", encoding="utf-8")  # the README's NameError
    done = subprocess.run(
        [str(ruff), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
         "--output-format", "concise", *map(str, files), str(planted)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(str(tmp_path))]
    assert [ln for ln in lines if "planted.py" in ln and "F821" in ln], done.stdout
    problems = [ln for ln in lines if "planted.py" not in ln]
    assert not problems, problems


#: runs each block file it is given in a fresh namespace; one line per failure
RUN_BLOCKS = """
import runpy, sys, traceback
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        print("FAILED", path, traceback.format_exc(limit=-2).strip().splitlines()[-1])
"""


def test_python_blocks_run_on_tiny_inputs(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    words = "the quick brown fox jumps over the lazy dog again and again".split()
    records = [{"text": " ".join(words[i:] + words[:i])} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(f'{{"text": "{r["text"]}"}}\n' for r in records))
    files = []
    for n, (doc, body, how) in enumerate(classified_python_blocks()):
        if isinstance(how, str):
            continue
        for old, new in how.items():
            assert old in body, f"{doc}: the block no longer holds {old!r}"
            body = body.replace(old, new.replace("{tmp}", str(tmp_path)))
        files.append(tmp_path / f"{doc.removesuffix('.md')}_{n}.py")
        files[-1].write_text(body, encoding="utf-8")
    assert len(files) >= 2, files
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DATACENTRIC_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", RUN_BLOCKS, *map(str, files)],
        cwd=tmp_path, capture_output=True, text=True, timeout=280, env=env, check=False,
    )  # fmt: skip
    failed = [ln for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
    assert done.returncode == 0 and not failed, (failed, done.stderr[-2000:])
    assert "step 0 loss" in done.stdout, done.stdout  # the README's loop ran
