"""Every class the support table marks as passing the pre-check (``exact``: "passes the
pre-check with the tested config") is built here from that tiny config and run through
the pre-check ``train`` runs before ranks start (``train.build.check_model``: the build
on the meta device, the contract's attributes, the small copy's forward for a
transformers model, the block calls, the text rows)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

from datacentric.verify.support import EVIDENCE  # noqa: E402


def _tiny_names() -> dict[str, str]:
    """``{class: model string}`` of every tiny model whose class the table lists."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from datacentric.models.diffusers_families import FAMILIES
    from datacentric.models.hf_tiny import TINY_CONFIGS

    names = {
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[values["model_type"]]: f"hf:{name}"
        for name, values in TINY_CONFIGS.items()
    }
    names.update(
        {cls: f"diffusers:{family.tiny}" for cls, family in FAMILIES.items() if family.tiny}
    )
    return names


def test_every_class_marked_as_passing_has_a_tiny_model_here():
    assert set(EVIDENCE) <= set(_tiny_names()), set(EVIDENCE) - set(_tiny_names())


def _data(model_string: str):  # noqa: ANN202
    """Samples the model takes: text for a causal LM; for a diffusers transformer,
    latents of its channels with text rows of its width (images for an image model)."""
    from datacentric.data.stdlib import StdlibCorpus
    from datacentric.data.video import SyntheticVideoDataset
    from datacentric.models.diffusers_build import text_width
    from datacentric.models.source import build_model_named
    from datacentric.shapes import SampleShape

    if model_string.startswith("hf:"):
        return StdlibCorpus(max_tokens=64, limit=4)
    model = build_model_named(model_string, device="meta")
    frames = 1 if type(model.transformer).__name__.endswith("2DModel") else 2
    rows = int(getattr(model.config, "max_text_seq_length", 0) or 6)
    return SyntheticVideoDataset(
        [SampleShape.video(frames, 2, 3), SampleShape.video(1, 3, 4)],
        channels=model.channels,
        context_shape=(rows, text_width(model.config)),
    )


@pytest.mark.parametrize("class_name", sorted(EVIDENCE))
def test_the_class_passes_the_pre_check(class_name: str):
    from datacentric.settings.sections import ModelConfig, ParallelismConfig
    from datacentric.train.build import check_model

    model_string = _tiny_names()[class_name]
    module = check_model(
        ModelConfig(model=model_string),
        _data(model_string),
        parallelism=ParallelismConfig(world=2),
    )
    assert module.blocks is not None
