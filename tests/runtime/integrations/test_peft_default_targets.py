"""A drop-in trainer given a ``peft_config`` without ``target_modules`` adapts peft's
default for the model's type, the one ``datacentric.models.lora`` reads, from a model or
its folder; a type peft has none for stops in one line."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")


def test_peft_s_default_targets_of_a_model_or_its_folder(tmp_path, capsys) -> None:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    from transformers import GPT2LMHeadModel

    from datacentric.integrations.run_inputs import _peft_default_targets
    from datacentric.models.hf import tiny_hf_config

    config = tiny_hf_config("gpt2")
    assert _peft_default_targets(GPT2LMHeadModel(config)) == "c_attn"
    config.save_pretrained(tmp_path / "gpt2")
    assert _peft_default_targets(str(tmp_path / "gpt2")) == "c_attn"
    qwen2 = tiny_hf_config("qwen2")
    qwen2.save_pretrained(tmp_path / "qwen2")
    expected = ",".join(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["qwen2"])
    assert _peft_default_targets(str(tmp_path / "qwen2")) == expected == "q_proj,v_proj"
    config.model_type = "a-type-peft-does-not-know"

    class Model:
        pass

    model = Model()
    model.config = config
    with pytest.raises(SystemExit) as stopped:
        _peft_default_targets(model)
    assert stopped.value.code == 2
    line = "peft_config: set target_modules (peft has no default for 'a-type-peft-does-not-know')"
    assert capsys.readouterr().err == f"datacentric SFTTrainer: {line}\n"


def test_a_lora_config_saying_fan_in_fan_out_is_taken(capsys) -> None:
    """peft's advice for GPT-2's Conv1D (``fan_in_fan_out=True``) is taken: peft and
    datacentric's LoRA both set it by each adapted layer's type."""
    from types import SimpleNamespace

    from peft import LoraConfig
    from transformers import GPT2LMHeadModel

    from datacentric.integrations.session import DropInTrainer
    from datacentric.models.hf import tiny_hf_config

    peft = LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)
    session = SimpleNamespace(
        peft_config=peft, model=GPT2LMHeadModel(tiny_hf_config("gpt2")), command="SFTTrainer"
    )
    settings = DropInTrainer._lora_settings(session)
    assert settings["targets"] == "c_attn" and settings["rank"] == 4
    session.peft_config = LoraConfig(r=4, target_modules=["c_attn"], use_dora=True)
    with pytest.raises(SystemExit):
        DropInTrainer._lora_settings(session)
    assert "use_dora=True: not supported" in capsys.readouterr().err


def test_a_peft_model_is_refused_naming_where_its_config_goes(capsys) -> None:
    """transformers' ``Trainer`` takes a ``PeftModel``; the drop-in one takes no adapter
    and no ``peft_config`` argument: the line names the trainer that does."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2LMHeadModel, TrainingArguments

    from datacentric.integrations.transformers import Trainer
    from datacentric.models.hf import tiny_hf_config

    model = get_peft_model(GPT2LMHeadModel(tiny_hf_config("gpt2")), LoraConfig(r=2))
    args = TrainingArguments(output_dir="x", report_to="none", use_cpu=True)
    with pytest.raises(SystemExit):
        Trainer(model=model, args=args, train_dataset=Dataset.from_list([{"input_ids": [1]}]))
    assert "and peft_config to datacentric.integrations.trl.SFTTrainer" in capsys.readouterr().err


def test_sft_trainer_s_model_is_the_peft_model_before_and_after_train(tmp_path, monkeypatch):
    """As TRL's: ``trainer.model`` is a ``PeftModel`` from the constructor on (scripts call
    ``trainer.model.print_trainable_parameters()``), the same object after ``train()``
    holding the trained adapter that ``save_model`` writes; the base weights untouched."""
    import sys
    from pathlib import Path

    import torch
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    base = AutoModelForCausalLM.from_pretrained(folder)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    config = SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        learning_rate=5e-2,
        report_to="none",
        bf16=False,
        use_cpu=True,
    )
    trainer = SFTTrainer(
        model=base,
        args=config,
        train_dataset=Dataset.from_list([{"text": "hello world " * (1 + i)} for i in range(4)]),
        processing_class=AutoTokenizer.from_pretrained(folder),
        peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    )
    wrapped = trainer.model
    assert isinstance(wrapped, PeftModel)
    wrapped.print_trainable_parameters()
    trainer.train()
    assert trainer.model is wrapped
    trainer.save_model()
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(folder), config.output_dir
    )
    have, want = wrapped.state_dict(), loaded.state_dict()
    lora = [name for name in want if "lora_B" in name]
    assert lora and all(torch.equal(have[name], want[name]) for name in want)
    assert any(want[name].abs().sum() > 0 for name in lora)  # trained: B moved from 0
    for name, tensor in wrapped.get_base_model().state_dict().items():
        if "lora_" not in name:
            torch.testing.assert_close(tensor, before[name.replace(".base_layer.", ".")])
