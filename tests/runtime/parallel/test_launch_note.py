"""More local gloo ranks than CPU cores: ``launch`` says so in one line, and runs."""

from __future__ import annotations

import torch.distributed as dist

from datacentric.parallel import launch as launch_module


def _rank() -> int:
    return dist.get_rank()


def test_oversubscribed_cores_get_a_one_line_note(monkeypatch, capsys) -> None:
    note = launch_module.oversubscription_note(8, "gloo", 2)
    assert note is not None and "8 local ranks on 2 CPU core" in note and "\n" not in note
    assert launch_module.oversubscription_note(2, "gloo", 2) is None
    assert launch_module.oversubscription_note(8, "nccl", 2) is None
    monkeypatch.setattr(launch_module, "cpu_cores", lambda: 1)
    results = launch_module.launch(_rank, nproc=2, device="cpu", timeout_s=120)
    assert results == {0: 0, 1: 1}
    err = capsys.readouterr().err
    assert err.count("2 local ranks on 1 CPU core(s)") == 1, err
