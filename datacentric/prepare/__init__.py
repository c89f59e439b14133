"""``prepare``: raw clips and captions encoded by a diffusers pipeline's own VAE and text
encoders into a ``latents:DIR`` folder, balanced over ranks and resumable
(:mod:`datacentric.prepare.run`; what is done to each clip: :mod:`datacentric.prepare.plan`)."""

from datacentric.lazy_exports import lazy_exports

_LAZY = {
    "PrepareJob": "datacentric.prepare.plan",
    "prepare": "datacentric.prepare.run",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
