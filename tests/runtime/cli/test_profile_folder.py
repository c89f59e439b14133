"""``datacentric profile``'s default ``--profile-dir`` is one folder under ``runs/``
whatever names the model: a preset, a model folder or a factory."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from datacentric.cli.profile import _profile_dir


@pytest.mark.parametrize(
    ("model", "folder"),
    [
        ("llama-tiny", "runs/profile-llama-tiny-world2"),
        ("llama-7b", "runs/profile-llama-7b-world2"),
        ("hf:/abs/models/tiny-llama", "runs/profile-tiny-llama-world2"),
        ("hf:./rel/tiny-llama/", "runs/profile-tiny-llama-world2"),
        ("diffusers:~/my wan", "runs/profile-my_wan-world2"),
        ("tests.user_models:tiny_gpt", "runs/profile-tests.user_models_tiny_gpt-world2"),
    ],
)
def test_the_default_profile_dir_is_one_folder_named_after_the_model(model, folder):
    """A model folder (``hf:/abs/dir``) made folders nested under ``runs/profile-hf:``,
    and a factory's ``:`` stood in the name; a preset's name is kept as it was."""
    chosen = _profile_dir(argparse.Namespace(model=model, world=2, out=None))
    assert chosen == folder
    assert Path(chosen).parent == Path("runs")


def test_a_given_profile_dir_is_kept():
    given = argparse.Namespace(model="hf:/abs/dir", world=2, out="somewhere/profile")
    assert _profile_dir(given) == "somewhere/profile"
