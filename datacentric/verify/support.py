"""The support table: every transformers causal LM and diffusers transformer installed.

:func:`support_table` lists one row per class, ``{"class", "status", "reason",
"evidence"}``, from the code's own checks:

- ``"refused"``: the pre-check that runs before any rank starts refuses the class with
  its default config (``models.hf.check_supported`` for a transformers causal LM,
  ``models.diffusers_plan.check_supported`` for a diffusers transformer);
  ``reason`` is the pre-check's line;
- ``"exact"``: the pre-check passes and a test compares the class's training step with
  its unmodified ``forward`` on each sample alone (:data:`EVIDENCE`, the test's id;
  ``tests/runtime/verify/test_support_table.py`` checks that every named test exists and that every
  tiny model the tests train has its row here; ``test_support_precheck.py`` runs each
  through the whole pre-check ``train`` runs);
- ``"untested"``: no refusal is read from its config (or the class cannot be built with
  its defaults), and no test has run it through the pre-check or shown it exact.

The classes are those installed: transformers' causal-LM mapping
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) and every ``*Transformer2DModel`` /
``*Transformer3DModel`` that diffusers exports, and any a declared family brings
(:mod:`datacentric.models.diffusers_families`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Mapping
from typing import Any

from datacentric.models.diffusers_families import FAMILIES, FamilyView

_HF_WORLD_4 = (
    "tests/runtime/verify/test_equivalence.py::"
    "test_hf_models_at_world_4_match_the_unmodified_models_with_sp_4"
)

HF_EVIDENCE: dict[str, tuple[str, ...]] = {
    "LlamaForCausalLM": (
        "tests/runtime/models/test_hf.py::test_hf_llama_sp_and_accumulation_match_one_process_at_world_2",
    ),
    "MistralForCausalLM": (_HF_WORLD_4,),
    "Qwen2ForCausalLM": (_HF_WORLD_4,),
    "GPT2LMHeadModel": (_HF_WORLD_4,),
    "Gemma3nForCausalLM": (
        "tests/runtime/models/test_hf_families.py::"
        "test_per_layer_widths_are_priced_and_the_model_exact_at_world_2",
    ),
}
"""Transformers classes shown exact, and the tests that show it."""

EVIDENCE: Mapping[str, tuple[str, ...]] = FamilyView(
    lambda family: (family.transformer, family.evidence) if family.evidence else None,
    HF_EVIDENCE,
)
"""Classes shown exact, and the tests that show it (pytest ids, relative to the
repository): each diffusers family's ``evidence``
(:mod:`~datacentric.models.diffusers_families`), then :data:`HF_EVIDENCE`."""

DIFFUSERS_CLASS = re.compile(r"Transformer[23]DModel$")


UNTESTED = (
    "no refusal read from its config; no test has run it through the pre-check (whose run "
    "of a small copy before ranks start may still refuse it) or compared it with its own "
    "forward"
)


def _row(name: str, refusal: str | None, untested: str, tiny: str | None) -> dict[str, Any]:
    if refusal is not None:
        return {"class": name, "status": "refused", "reason": refusal, "evidence": None}
    if name in EVIDENCE and tiny is not None:
        reason = f"passes the pre-check with the tested config ({tiny}); its tests compare it "
        reason += "with its own forward on each sample"
        return {"class": name, "status": "exact", "reason": reason, "evidence": EVIDENCE[name]}
    return {"class": name, "status": "untested", "reason": untested, "evidence": None}


def _default_config(cls: type) -> dict[str, Any]:
    """A diffusers class's config as its ``__init__`` defaults give it."""
    params = inspect.signature(cls.__init__).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def diffusers_rows() -> Iterator[dict[str, Any]]:
    """One row per diffusers ``*Transformer2DModel`` / ``*Transformer3DModel``."""
    import diffusers

    from datacentric.models.diffusers_plan import UnsupportedVideoModel, check_supported

    classes = {n: getattr(diffusers, n) for n in dir(diffusers) if DIFFUSERS_CLASS.search(n)}
    classes.update({f.transformer: f.model_class for f in FAMILIES.values() if f.model_class})
    for name, cls in sorted(classes.items()):
        family = FAMILIES.get(name)
        tiny_name, config = (family.tiny, family.tiny_config) if family else (None, {})
        tiny_name = tiny_name if config else None
        try:
            check_supported(cls, {**_default_config(cls), **config})
            refusal = None
        except UnsupportedVideoModel as error:
            refusal = str(error)
        yield _row(name, refusal, UNTESTED, tiny_name and f"diffusers:{tiny_name}")


def transformers_rows() -> Iterator[dict[str, Any]]:
    """One row per transformers causal LM (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from datacentric.models.hf import check_supported, tiny_hf_config
    from datacentric.models.hf_attention import UnsupportedModelFeature
    from datacentric.models.hf_tiny import TINY_CONFIGS

    tiny = {str(v["model_type"]): name for name, v in TINY_CONFIGS.items()}
    names: dict[str, str] = {}
    for model_type, entry in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        for class_name in entry if isinstance(entry, (list, tuple)) else [entry]:
            if model_type in tiny or class_name not in names:  # a tested type first
                names[class_name] = model_type
    for class_name, model_type in sorted(names.items()):
        tiny_name = tiny.get(model_type)
        try:
            config = (
                tiny_hf_config(tiny_name)
                if tiny_name
                else transformers.AutoConfig.for_model(model_type)
            )
            cls = getattr(transformers, class_name)
        except Exception as error:  # noqa: BLE001 - an optional dependency, a removed class
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            note = f"not built with its defaults here ({first[:160]})"
            yield _row(class_name, None, note, None)
            continue
        refusal, note = None, UNTESTED
        try:
            check_supported(config, class_name, cls)
        except UnsupportedModelFeature as error:
            refusal = str(error)
        except Exception as error:  # noqa: BLE001 - a config the check cannot read
            note = f"its default config cannot be checked ({type(error).__name__}: {error})"
        yield _row(class_name, refusal, note, tiny_name and f"hf:{tiny_name}")


def support_table() -> dict[str, list[dict[str, Any]]]:
    """``{"transformers": rows, "diffusers": rows}`` (see the module docstring); a
    library that is not installed gives no rows."""
    table: dict[str, list[dict[str, Any]]] = {}
    for key, rows in (("transformers", transformers_rows), ("diffusers", diffusers_rows)):
        try:
            table[key] = list(rows())
        except ImportError:
            table[key] = []
    return table


def support_markdown(library: str, rows: list[dict[str, Any]]) -> str:
    """``rows`` of :func:`support_table` as the Markdown table ``docs/models.md`` holds
    (a ``library`` heading; each row's class, status, reason and evidence)."""
    lines = [f"### {library} ({len(rows)} classes)", "", "| class | status | why | evidence |"]
    lines.append("|---|---|---|---|")
    for row in rows:
        reason = str(row["reason"]).replace("|", "\\|")
        evidence = "<br>".join(f"`{e}`" for e in row["evidence"] or ())
        lines.append(f"| `{row['class']}` | {row['status']} | {reason} | {evidence} |")
    return "\n".join(lines) + "\n"
