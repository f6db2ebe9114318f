"""tilefuse: fused transformer-training ops, JIT-compiled on first use.

    import tilefuse
    y = tilefuse.functional.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)

    @tilefuse.fusion
    def softmax(x):                 # x: [..., n]; reductions run over the last dim
        e = tilefuse.exp(x - tilefuse.max(x))
        return e / tilefuse.sum(e)
"""

import hashlib
import pathlib

import torch  # noqa: F401  (loads LibTorch, which _C links, first)

from . import _C
from ._dsl import (
    abs,
    add,
    addcdiv,
    addcmul,
    argmax,
    argmin,
    cast,
    clamp,
    cos,
    erf,
    exp,
    expm1,
    floor,
    fma,
    Fusion,
    fusion,
    gather,
    gelu,
    iota,
    item,
    lerp,
    log,
    log1p,
    log_softmax,
    logsumexp,
    max,
    maximum,
    mean,
    min,
    minimum,
    per_tensor,
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


def _tag_torch_compile_caches() -> None:
    """torch.compile's on-disk caches (FX graphs, AOTAutograd) key on graphs
    that call tilefuse's ops, not on what the ops do: a graph an older
    tilefuse traced could call an op whose arguments or gradient formula
    have since changed. Their keys take torch.compiler.config.cache_key_tag,
    to which this adds a hash of the compiler, the ops and this package."""
    digest = hashlib.sha256(f"{_C.compiler_version()}\n{_C.op_source_hash()}\n".encode())
    for path in sorted(pathlib.Path(__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    tag = f"tilefuse-{digest.hexdigest()[:16]}"
    config = torch.compiler.config
    if tag not in config.cache_key_tag:
        config.cache_key_tag = f"{config.cache_key_tag}+{tag}" if config.cache_key_tag else tag


_tag_torch_compile_caches()


def compile_count() -> int:
    """Kernels compiled by this process (cache hits excluded)."""
    return _C.compile_count()


def kernel_launches() -> int:
    """Kernel launches this process made: GPU launches (emulated ones too)
    and CPU kernel runs (one parallel loop each)."""
    return _C.kernel_launches()


__all__ = [
    "abs", "add", "addcdiv", "addcmul", "argmax", "argmin", "cast", "clamp",
    "compile_count", "cos", "emulator", "erf", "exp", "expm1", "floor", "fma", "functional",
    "Fusion", "fusion", "gather", "gelu", "iota", "item", "kernel_launches", "lerp", "log",
    "log1p", "log_softmax", "logsumexp", "max", "maximum", "mean", "min", "minimum",
    "per_tensor", "pow", "relu", "round", "rsqrt", "sigmoid", "sign", "silu", "sin",
    "softmax", "softplus", "sqrt", "square", "sum", "tanh", "Value", "where",
]
