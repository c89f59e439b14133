"""A module registered under two names (the adapters' ``blocks`` alias of the wrapped
model's layers) is stored once: the checkpoint keeps each tensor under its first name,
loading puts the alias back, and a checkpoint written with both names still loads."""

from __future__ import annotations

import torch

from datacentric.models.source import build_model_named
from datacentric.train.checkpoints.checkpoint_load import load_checkpoint, read_model_state
from datacentric.train.checkpoints.checkpoint_save import save_checkpoint
from datacentric.train.checkpoints.state_names import alias_names, with_aliases, without_aliases


def _adapter():
    torch.manual_seed(0)
    return build_model_named("hf:qwen2")


def test_the_blocks_alias_is_named_and_dropped_once():
    model = _adapter()
    aliases = alias_names(model)
    assert aliases and all(a.startswith("blocks.") for a in aliases)
    assert all(p.startswith("hf.") for p in aliases.values())
    state = model.state_dict()
    distinct = without_aliases(model, state)
    assert set(state) - set(distinct) == set(aliases)
    assert sum(v.numel() for v in distinct.values()) == sum(
        p.numel() for p in model.parameters()
    ) + sum(b.numel() for n, b in model.named_buffers() if n in state)
    assert set(with_aliases(model, distinct)) == set(state)


def test_a_checkpoint_stores_each_tensor_once_and_resumes(tmp_path):
    model = _adapter()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = save_checkpoint(tmp_path, 1, model, optimizer, {"step": 1})
    saved = read_model_state(path)
    assert not any(k.startswith("blocks.") for k in saved)
    _assert_restores(model, path)


def test_a_checkpoint_with_both_names_still_loads(tmp_path, monkeypatch):
    from datacentric.train.checkpoints import checkpoint_save

    model = _adapter()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # write as before: every alias stored too
    monkeypatch.setattr(checkpoint_save, "without_aliases", lambda model, state: state)
    path = save_checkpoint(tmp_path, 1, model, optimizer, {"step": 1})
    monkeypatch.undo()
    assert any(k.startswith("blocks.") for k in read_model_state(path))
    _assert_restores(model, path)


def _assert_restores(model, path) -> None:
    """A fresh adapter with other weights, loaded from ``path``, holds ``model``'s state
    under every name (the alias included): the same bytes read back."""
    restored = _adapter()
    with torch.no_grad():
        for p in restored.parameters():
            p.add_(1.0)
    load_checkpoint(path, restored, torch.optim.AdamW(restored.parameters(), lr=1e-3))
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
