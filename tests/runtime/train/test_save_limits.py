"""A checkpoint save stopped by a full disk, a quota or a file-size limit says so, sync
and async alike, whether the error comes from ``OSError`` (ENOSPC, EFBIG) or from
torch's writer (``[enforce fail at inline_container.cc:...] . unexpected pos``); the
previous checkpoint stays ``latest``."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap

import pytest
import torch
from repo_paths import ROOT

from datacentric.train.checkpoints import checkpoint as ckpt
from datacentric.train.checkpoints import checkpoint_save

LINE = "no space left on device while saving checkpoint step 2 to"

#: Saves step 1, lowers the file-size limit (Python ignores SIGXFSZ, so a write past it
#: fails with EFBIG), then saves step 2 synchronously and in the background.
SCRIPT = textwrap.dedent(
    """
    import resource, sys, torch
    from datacentric.train.checkpoints import checkpoint as ckpt
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    for mode, limit in (("sync", 600), ("async", 600), ("sync", 20000), ("async", 20000)):
        out = f"{sys.argv[1]}/{mode}-{limit}"
        ckpt.save_checkpoint(out, 1, model, opt, {"n": 1})
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            ckpt.start_checkpoint(out, 2, model, opt, {"n": 2}, async_save=mode == "async").wait()
        except ckpt.CheckpointError as err:
            print(mode, limit, str(err).splitlines()[0], ckpt.latest_checkpoint(out).name)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    """
)


@pytest.mark.slow
def test_a_file_size_limit_during_a_save_is_named(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    assert len(lines) == 4, done.stdout + done.stderr
    for line in lines:
        assert LINE in line and line.endswith("step-00000001"), line


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
        OSError(errno.EFBIG, "File too large"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
)
def test_each_form_of_a_short_write_reads_as_a_full_disk(tmp_path, monkeypatch, error) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    kept = ckpt.save_checkpoint(tmp_path, 1, model, opt, {"n": 1})

    def short_write(*args, **kwargs):
        raise error

    monkeypatch.setattr(checkpoint_save.torch, "save", short_write)  # the RNG file's writer
    with pytest.raises(ckpt.CheckpointError, match=LINE):
        ckpt.save_checkpoint(tmp_path, 2, model, opt, {"n": 2})
    assert ckpt.latest_checkpoint(tmp_path) == kept
    monkeypatch.setattr(
        checkpoint_save.torch, "save", lambda *a, **k: (_ for _ in ()).throw(KeyError("x"))
    )
    with pytest.raises(
        ckpt.CheckpointError, match="saving checkpoint step 2 to .* failed: (rank 0: )?KeyError"
    ):
        ckpt.save_checkpoint(tmp_path, 2, model, opt, {"n": 2})
