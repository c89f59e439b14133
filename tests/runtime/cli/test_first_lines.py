"""A long command says what it will do before it pays for its heavy imports: ``demo``'s
first line is written before torch is imported (within a second where importing torch
took seven on a loaded machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from repo_paths import ROOT

#: Ends the process at the first line written to stdout, saying whether torch was loaded.
FIRST_LINE = """
    import os, sys

    class FirstLine:
        def write(self, text):
            if text.strip():
                loaded = "torch" in sys.modules
                os.write(2, f"torch loaded: {loaded}; {text[:40]}".encode())
                os._exit(0)

        def flush(self):
            pass

    sys.stdout = FirstLine()
    from datacentric.cli.main import main

    main(sys.argv[1:])
"""


def test_demo_says_what_it_will_do_before_importing_torch(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIRST_LINE), "demo", "--out", str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "torch loaded: False; datacentric demo: llama" in done.stderr, done.stderr[-2000:]
