"""tilefuse: fused transformer-training ops, JIT-compiled on first use.

    import tilefuse
    y = tilefuse.functional.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)

    @tilefuse.fusion
    def softmax(x):                 # x: [..., n]; reductions run over the last dim
        e = tilefuse.exp(x - tilefuse.max(x))
        return e / tilefuse.sum(e)
"""

import torch  # noqa: F401  (loads LibTorch, which _C links, first)

from . import _C
from ._dsl import (
    abs,
    argmax,
    argmin,
    cast,
    clamp,
    cos,
    erf,
    exp,
    expm1,
    floor,
    Fusion,
    fusion,
    gather,
    gelu,
    iota,
    log,
    log1p,
    log_softmax,
    logsumexp,
    max,
    maximum,
    mean,
    min,
    minimum,
    pow,
    relu,
    round,
    rsqrt,
    sigmoid,
    sign,
    silu,
    sin,
    softmax,
    softplus,
    sqrt,
    square,
    sum,
    tanh,
    Value,
    where,
)
from . import emulator, functional

__version__ = "0.1.0"


def compile_count() -> int:
    """Kernels compiled by this process (cache hits excluded)."""
    return _C.compile_count()


__all__ = [
    "abs", "argmax", "argmin", "cast", "clamp", "compile_count", "cos", "emulator", "erf",
    "exp", "expm1", "floor", "functional", "Fusion", "fusion", "gather", "gelu", "iota",
    "log", "log1p", "log_softmax", "logsumexp", "max", "maximum", "mean", "min", "minimum",
    "pow", "relu", "round", "rsqrt", "sigmoid", "sign", "silu", "sin", "softmax", "softplus",
    "sqrt", "square", "sum", "tanh", "Value", "where",
]
