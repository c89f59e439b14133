"""Adding a diffusers family is one declaration: a copy of Flux declared under a new
transformer class (a subclass diffusers does not export) and a new pipeline name is seen
by prepare (the pipeline folder check, its geometry and encoding), training (the tiny
model builds under its plan and equals its own ``forward`` as its pipeline calls it),
render (the pipeline folder check) and the support table (an ``exact`` row with the
declared evidence), and by the older tables' names."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers  # noqa: E402
from test_diffusers import packed_loss  # noqa: E402
from test_diffusers_families import IMAGE_GRIDS, dataset, reference_loss  # noqa: E402

from datacentric.models.diffusers_build import TINY_DIFFUSERS, build_diffusers_model  # noqa: E402
from datacentric.models.diffusers_encode import (  # noqa: E402
    PIPELINES,
    PipelineError,
    pipeline_encoding,
    pipeline_geometry,
    read_model_index,
)
from datacentric.models.diffusers_families import (  # noqa: E402
    FAMILIES,
    family_named,
    register_family,
)
from datacentric.models.diffusers_generic import check_supported  # noqa: E402
from datacentric.models.diffusers_plan import DECLARED_CP_PLANS, cp_plan_of  # noqa: E402
from datacentric.models.diffusers_render import RenderSettings, check_render_pipeline  # noqa: E402
from datacentric.verify.diffusers_calls import PIPELINE_CALLS, flux_call  # noqa: E402
from datacentric.verify.support import EVIDENCE, diffusers_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

EVIDENCE_ID = "tests/runtime/models/test_family_declaration.py::test_a_declared_family_trains"


class CopyFluxTransformer2DModel(diffusers.FluxTransformer2DModel):
    """A transformer class diffusers does not export: Flux's, under a new name."""


@pytest.fixture
def copy_family() -> Iterator[str]:
    """Flux's declaration, copied under the new class, tiny name and pipeline."""
    flux = family_named("FluxTransformer2DModel")
    assert flux is not None
    family = dataclasses.replace(
        flux,
        transformer=CopyFluxTransformer2DModel.__name__,
        model_class=CopyFluxTransformer2DModel,
        tiny="copy-flux",
        pipeline="CopyFluxPipeline",
        evidence=(EVIDENCE_ID,),
    )
    register_family(family)
    try:
        yield family.transformer
    finally:
        del FAMILIES[family.transformer]


def pipeline_folder(root: Path, pipeline: str, transformer: str) -> Path:
    """A pipeline folder as prepare and render read it before loading: the index and
    the VAE's config."""
    index = {
        "_class_name": pipeline,
        "transformer": ["diffusers", transformer],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    (root / "vae").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    (root / "vae" / "config.json").write_text(
        json.dumps({"block_out_channels": [8, 8, 8, 8]}), encoding="utf-8"
    )
    return root


def test_a_declared_family_trains(copy_family: str) -> None:
    """Training and verification: the tiny name builds the new class under the family's
    plan, and its packed loss and gradients equal its own forward called as the
    declared pipeline call calls it."""
    torch.manual_seed(0)
    model = build_diffusers_model("copy-flux")
    assert type(model.transformer) is CopyFluxTransformer2DModel
    assert model.family is FAMILIES[copy_family]
    torch.manual_seed(0)
    reference = CopyFluxTransformer2DModel.from_config(TINY_DIFFUSERS["copy-flux"][1])
    data = dataset(model, IMAGE_GRIDS)
    ref = reference_loss(reference, data, IMAGE_GRIDS)
    ours = packed_loss(model, data, [0, 1, 2, 3])
    (ref + ours).backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)
    ref_grads = dict(reference.named_parameters())
    for name, param in model.transformer.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name].grad, rtol=1e-4, atol=1e-6)


def test_prepare_render_and_the_support_table_see_a_declared_family(
    copy_family: str, tmp_path: Path
) -> None:
    family = FAMILIES[copy_family]
    folder = pipeline_folder(tmp_path / "pipe", "CopyFluxPipeline", copy_family)
    # prepare: the folder's pipeline is known, an image pipeline of 16-pixel multiples
    assert read_model_index(folder)["_class_name"] == "CopyFluxPipeline"
    assert pipeline_geometry(folder) == (1, 16)
    assert pipeline_encoding("CopyFluxPipeline") is family.encoding
    # render: the folder renders the trained class, as images (no frame count)
    assert check_render_pipeline(folder, copy_family, RenderSettings(height=32)) is True
    with pytest.raises(PipelineError, match="renders images"):
        check_render_pipeline(folder, copy_family, RenderSettings(num_frames=5))
    # the pre-check and the support table
    assert check_supported(CopyFluxTransformer2DModel, family.tiny_config) == family.cp_plan
    rows = {row["class"]: row for row in diffusers_rows()}
    assert rows[copy_family]["status"] == "exact"
    assert rows[copy_family]["evidence"] == (EVIDENCE_ID,)
    assert "diffusers:copy-flux" in rows[copy_family]["reason"]
    # the older tables' names read the declaration
    assert PIPELINES["CopyFluxPipeline"] is family.encoding
    assert DECLARED_CP_PLANS[copy_family] is family.cp_plan
    assert PIPELINE_CALLS[copy_family] is flux_call
    assert EVIDENCE[copy_family] == (EVIDENCE_ID,)


def test_without_the_declaration_nothing_knows_the_family(tmp_path: Path) -> None:
    """The same checks fail without the declaration (the test above depends on it)."""
    folder = pipeline_folder(tmp_path / "pipe", "CopyFluxPipeline", "CopyFluxTransformer2DModel")
    with pytest.raises(
        PipelineError, match="_class_name is 'CopyFluxPipeline', not a pipeline datacentric reads"
    ):
        read_model_index(folder)
    with pytest.raises(ValueError, match="neither a tiny name"):
        build_diffusers_model("copy-flux")
    assert "CopyFluxTransformer2DModel" not in {row["class"] for row in diffusers_rows()}


def test_a_family_is_declared_once(copy_family: str) -> None:
    flux = FAMILIES["FluxTransformer2DModel"]
    with pytest.raises(ValueError, match="pipeline 'FluxPipeline' is declared twice"):
        register_family(dataclasses.replace(flux, transformer="Other", tiny="other"))
    with pytest.raises(ValueError, match="tiny 'copy-flux' is declared twice"):
        register_family(
            dataclasses.replace(
                flux, transformer="Other", tiny="copy-flux", pipeline=None, encoding=None
            )
        )
    with pytest.raises(ValueError, match="declare pipeline and encoding together"):
        register_family(dataclasses.replace(flux, transformer="Other", tiny=None, pipeline=None))
    assert "Other" not in FAMILIES


def test_a_plan_assigned_to_the_old_table_declares_it_with_a_warning() -> None:
    """``DECLARED_CP_PLANS[name] = plan`` (as docs/diffusers.md told before) still
    declares a plan; the other tables' names are read-only."""
    plan = FAMILIES["FluxTransformer2DModel"].cp_plan
    assert plan is not None
    try:
        with pytest.warns(DeprecationWarning, match="register_family"):
            DECLARED_CP_PLANS["CopyFluxTransformer2DModel"] = plan
        assert cp_plan_of(CopyFluxTransformer2DModel) is plan
        assert FAMILIES["CopyFluxTransformer2DModel"].cp_plan is plan
    finally:
        FAMILIES.pop("CopyFluxTransformer2DModel", None)
    with pytest.raises(TypeError, match="register_family"):
        TINY_DIFFUSERS["copy"] = ("CopyFluxTransformer2DModel", {})  # type: ignore[index]


def test_a_support_check_looks_its_family_up_once(monkeypatch):
    """The check reads one declaration for what it refuses, fills and plans."""
    from datacentric.models import diffusers_plan

    looked_up: list[str] = []

    def counted(class_name: str):
        looked_up.append(class_name)
        return family_named(class_name)

    monkeypatch.setattr(diffusers_plan, "family_named", counted)
    flux = family_named("FluxTransformer2DModel")
    assert flux is not None
    assert check_supported(diffusers.FluxTransformer2DModel, flux.tiny_config) == flux.cp_plan
    assert looked_up == ["FluxTransformer2DModel"]


def test_a_build_looks_its_family_up_by_class_once_and_hands_it_on(monkeypatch, tmp_path):
    """A folder's build looks the family of its config's class up once and hands it to
    the support check; the adapter looks its own up once and hands it to its check: two
    lookups by the class per build, none in the check (before: four, the check looking
    it up again in the build and in the adapter)."""
    from datacentric.models import diffusers_build, diffusers_generic, diffusers_plan

    looked_up: list[str] = []

    def counted(where: str):
        def lookup(class_name: str):
            looked_up.append(where)
            return family_named(class_name)

        return lookup

    for module in (diffusers_build, diffusers_generic, diffusers_plan):
        monkeypatch.setattr(module, "family_named", counted(module.__name__.split(".")[-1]))
    flux = family_named("FluxTransformer2DModel")
    assert flux is not None
    config = {"_class_name": flux.transformer, **flux.tiny_config}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    torch.manual_seed(0)
    model = build_diffusers_model(str(tmp_path))
    assert model.family is flux
    assert looked_up == ["diffusers_build", "diffusers_generic"]
