"""What transformers reads to know a script runs under a launcher, set before the
script's own ``TrainingArguments`` / ``SFTConfig`` exists.

Under ``torchrun`` (or ``accelerate launch``) on a machine without an accelerator,
transformers' device set-up asks accelerate for the launch: accelerate sees no
accelerator and no CPU request, initialises the default process group anyway and reports
no distribution, so transformers logs on every rank that DDP wants
``python -m torch.distributed.launch`` -- advice that is wrong (torchrun is the launcher
it deprecated) and misleading (the drop-in runs distributed). With
``ACCELERATE_USE_CPU=true``, accelerate reads the launcher's ranks as its multi-CPU
launch (gloo), so transformers knows it is distributed and says nothing; datacentric
then joins that group. Nothing changes with an accelerator (accelerate finds the launch)
or without a launcher.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import torch


def tell_transformers_the_launch(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set ``ACCELERATE_USE_CPU=true`` in ``environ`` when a launcher started this
    process (``LOCAL_RANK`` set, ``WORLD_SIZE`` above 1) and no accelerator is
    available, unless the variable is set already; whether it was set."""
    launched = "LOCAL_RANK" in environ and int(environ.get("WORLD_SIZE", "1") or 1) > 1
    if not launched or "ACCELERATE_USE_CPU" in environ:
        return False
    if torch.accelerator.current_accelerator(check_available=True) is not None:
        return False
    environ["ACCELERATE_USE_CPU"] = "true"
    return True
