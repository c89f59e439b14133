"""A causal LM whose config names no attention heads (a recurrent family, a composite
model) is refused before ranks start in one line naming the family, not with an
internal ``AttributeError: ... 'num_attention_heads'``."""

from __future__ import annotations

import pytest
from cli_here import cli_here

transformers = pytest.importorskip("transformers")

from datacentric.models.hf import check_supported  # noqa: E402
from datacentric.models.hf_attention import UnsupportedModelFeature  # noqa: E402

RUN = ["--dataset", "stdlib", "--dataset-limit", "4", "--cost-model", "analytic"]
RUN += ["--no-progress"]


@pytest.mark.parametrize(
    ("family", "config"),
    [
        ("rwkv", lambda: transformers.RwkvConfig(hidden_size=32, num_hidden_layers=2)),
        ("xlstm", lambda: transformers.xLSTMConfig(hidden_size=32, num_hidden_layers=2)),
    ],
)
def test_a_recurrent_family_exits_2_before_ranks_start(tmp_path, capsys, family, config):
    folder = tmp_path / f"{family}_model"
    config().save_pretrained(folder)
    out = tmp_path / "run"
    status, _, err = cli_here(["train", "--model", f"hf:{folder}", *RUN, "--out", str(out)], capsys)
    assert status == 2
    (line,) = err.strip().splitlines()
    assert f"not an attention model ({family}): data-centric parallel splits attention" in line
    assert "internal error" not in line and "AttributeError" not in line
    assert not (out / "config.json").exists()


def test_composite_configs_are_refused_naming_where_their_heads_are():
    for model_type, where in (("blt", "global_config"), ("gemma3", "text_config")):
        config = transformers.AutoConfig.for_model(model_type)
        with pytest.raises(UnsupportedModelFeature, match=f"a composite model .{model_type}.*"):
            check_supported(config, model_type)
        with pytest.raises(UnsupportedModelFeature, match=where):
            check_supported(config, model_type)
