"""A model built from Python prints no loader bar: building an ``hf:DIR`` model for a run
started from Python (no command had switched transformers' bars off) showed its "Loading
weights" bar; ``--verbose`` (``DATACENTRIC_VERBOSE=1``) shows it again, and the
library's own switch is left as it was."""

from __future__ import annotations

import pytest
import torch
from chat_data import tiny_qwen2_config

from datacentric.log import QUIET_ENV, VERBOSE_ENV
from datacentric.settings.sections import ModelConfig
from datacentric.train.build import build_run_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_building_an_hf_model_from_python_shows_no_bar_unless_verbose(tmp_path, monkeypatch, capfd):
    import transformers.utils.logging as transformers_logs
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(tiny_qwen2_config(64)).save_pretrained(tmp_path / "m")
    for name in QUIET_ENV:  # as a script that imported datacentric would run: bars on
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    transformers_logs.enable_progress_bar()
    model = ModelConfig(model=f"hf:{tmp_path / 'm'}")
    capfd.readouterr()
    build_run_model(model, None, torch.device("cpu"))
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err, err
    assert transformers_logs.is_progress_bar_enabled()  # as it was
    monkeypatch.setenv(VERBOSE_ENV, "1")
    build_run_model(model, None, torch.device("cpu"))
    assert "Loading weights" in capfd.readouterr().err


def test_building_a_preset_imports_neither_loader_library():
    """A preset loads nothing through transformers or diffusers: its build (and the
    meta build the pre-check makes) leaves both unimported, where silencing their bars
    imported them (over a second of each rank's start-up)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from datacentric.settings.sections import ModelConfig\n"
        "from datacentric.train.build import build_run_model, check_model\n"
        "build_run_model(ModelConfig(model='llama'), None, torch.device('cpu'))\n"
        "check_model(ModelConfig(model='dit'), None)\n"
        "print(sorted(m for m in ('transformers', 'diffusers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
