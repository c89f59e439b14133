"""A model folder is trained as what it holds: an ``hf:`` folder that also holds a PEFT
adapter (which transformers would attach unasked) is refused in one line naming the
adapter's files, by the resolver and by ``train`` before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest

peft = pytest.importorskip("peft")

from chat_data import tiny_qwen2_config  # noqa: E402

from datacentric.cli.main import main  # noqa: E402
from datacentric.models.source import ModelSourceError, resolve_model, weight_files  # noqa: E402


def _base_folder(folder: Path) -> Path:
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(tiny_qwen2_config(256)).save_pretrained(folder)
    return folder


def test_a_folder_holding_an_adapter_is_refused(tmp_path, capsys) -> None:
    from transformers import AutoModelForCausalLM

    folder = _base_folder(tmp_path / "base")
    assert resolve_model(f"hf:{folder}").has_weights
    wrapped = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(folder),
        peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    )
    wrapped.save_pretrained(folder)  # adapter_config.json, adapter_model.safetensors
    assert [p.name for p in weight_files(folder)] == ["model.safetensors"]
    with pytest.raises(ModelSourceError, match="adapter_config.json, adapter_model.safetensors"):
        resolve_model(f"hf:{folder}")
    out = tmp_path / "run"
    capsys.readouterr()  # the saves' progress bars
    status = main(["train", "--model", f"hf:{folder}", "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(err) == 1, err
    assert "holds a PEFT adapter" in err[0] and str(folder) in err[0], err
    assert not out.exists()
