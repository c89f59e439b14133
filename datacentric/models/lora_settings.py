"""The ``[lora]`` section's spec, under its older path: it lives in
:mod:`datacentric.models.model_args` beside the :class:`~datacentric.models.model_args.ModelSource`
that carries it."""

from datacentric.models.model_args import ALL_LINEAR, LoraError, LoraSpec, lora_of, lora_spec

__all__ = ["ALL_LINEAR", "LoraError", "LoraSpec", "lora_of", "lora_spec"]
