"""An unknown ``--model`` name is refused as one, naming it, whatever it looks like as a
path: a ``~user`` of no such user said 'Could not determine home directory.' and a name
longer than a file name may be '[Errno 36] File name too long', neither naming --model.
A folder of that name holding a model still gets its hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datacentric.models.source import ModelSourceError, resolve_model


@pytest.mark.parametrize("name", ["~no_such_user_here/model", "m" * 300])
def test_a_name_that_is_no_path_here_is_an_unknown_model(name: str) -> None:
    with pytest.raises(ModelSourceError, match=f"unknown model '{name[:40]}.*use a preset"):
        resolve_model(name)


def test_a_folder_holding_a_model_still_gets_its_prefix_named(tmp_path: Path) -> None:
    folder = tmp_path / "my model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelSourceError, match=f"give --model hf:{folder}; or use a preset"):
        resolve_model(str(folder))
