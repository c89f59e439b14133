"""A validation render prints nothing of other libraries: loading its pipeline left a
blank line per component on a terminal (diffusers' "Loading pipeline components" and
transformers' "Loading weights" bars) when a run started from Python, where no command
had switched them off; ``--verbose`` (``DATACENTRIC_VERBOSE=1``) shows them again."""

from __future__ import annotations

import pytest
import torch
from prepare_media import save_wan_pipeline

from datacentric.log import QUIET_ENV, VERBOSE_ENV

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")


def _open_and_render(folder) -> None:
    from diffusers import WanTransformer3DModel

    from datacentric.models.diffusers_render import RenderSettings, render
    from datacentric.train.validation.renders import PipelineSamples

    transformer = WanTransformer3DModel.from_pretrained(folder / "transformer")
    settings = RenderSettings(height=16, width=16, num_frames=5, num_inference_steps=2)
    samples = PipelineSamples([], str(folder), settings, 16, 0, folder / "run")
    pipe = samples._pipeline(transformer_holder(transformer), torch.device("cpu"))
    for _ in range(2):
        render(pipe, "a cat", settings, torch.Generator().manual_seed(0))


def transformer_holder(transformer: torch.nn.Module) -> torch.nn.Module:
    """A run's model as the renders find it: a module holding the diffusers transformer."""
    holder = torch.nn.Module()
    holder.transformer = transformer
    return holder


def test_a_render_and_its_pipeline_print_nothing_unless_verbose(tmp_path, monkeypatch, capfd):
    import diffusers.utils.logging as diffusers_logs
    import transformers.utils.logging as transformers_logs

    folder = save_wan_pipeline(tmp_path / "wan")
    for name in QUIET_ENV:  # as a script that imported datacentric would run: bars on
        monkeypatch.delenv(name, raising=False)
    for logs in (diffusers_logs, transformers_logs):
        logs.enable_progress_bar()
    capfd.readouterr()
    _open_and_render(folder)
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), (out, err)
    # the libraries' own switches are as they were
    assert diffusers_logs.is_progress_bar_enabled() and transformers_logs.is_progress_bar_enabled()
    monkeypatch.setenv(VERBOSE_ENV, "1")
    _open_and_render(folder)
    err = capfd.readouterr().err
    assert "Loading pipeline components" in err and "Loading weights" in err, err
