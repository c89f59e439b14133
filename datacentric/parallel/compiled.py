"""Per-block ``torch.compile``, under its older path: it lives in
:mod:`datacentric.parallel.recompute`, beside the recomputation switch each block's
compiled forward runs under (the module doc there says the order)."""

from datacentric.parallel.recompute import (
    BACKEND_ENV,
    DEFAULT_BACKEND,
    compile_backend,
    compile_blocks,
    is_compiled,
)

__all__ = ["BACKEND_ENV", "DEFAULT_BACKEND", "compile_backend", "compile_blocks", "is_compiled"]
