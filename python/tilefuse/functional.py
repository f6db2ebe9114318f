"""Fused ops with the signatures of torch.nn.functional.

Each is a `tilefuse::` op registered with PyTorch's dispatcher in C++
(python/csrc/TorchOps.cpp): it checks its arguments, runs a built-in fusion
(kernels_dsl) on the CPU or the GPU, has a meta implementation (so
torch.compile keeps it in the graph) and autograd through the fused backward
kernel. A call costs one dispatch: no Python runs between it and the kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (registers the tilefuse:: ops)

__all__ = ["rms_norm", "layer_norm", "swiglu", "cross_entropy", "adamw_step_"]

_ops = torch.ops.tilefuse
_rms_norm = _ops.rms_norm.default
_layer_norm = _ops.layer_norm.default
_swiglu = _ops.swiglu.default
_cross_entropy = _ops.cross_entropy.default
_adamw_step = _ops.adamw_step_.default


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """torch.nn.functional.rms_norm over the last dimension, fused."""
    return _rms_norm(input, normalized_shape, weight, eps)


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.layer_norm over the last dimension, fused."""
    return _layer_norm(input, normalized_shape, weight, bias, eps)


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """silu(a) * b (the LLaMA MLP gate), fused."""
    return _swiglu(a, b)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """torch.nn.functional.cross_entropy for [N, C] logits and class indices,
    fused (log-softmax, NLL, label smoothing and the gradient). Targets are
    checked against the number of classes, which on a GPU waits for them."""
    if size_average is not None or reduce is not None:
        raise ValueError("tilefuse.cross_entropy: 'size_average' and 'reduce' are "
                         "deprecated; use 'reduction'")
    return _cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


def adamw_step_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *,
                lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 1e-2, step: int) -> None:
    """One torch.optim.AdamW step on `param`, in place (with its state)."""
    _adamw_step(param, grad, exp_avg, exp_avg_sq, lr=lr, beta1=beta1, beta2=beta2,
                eps=eps, weight_decay=weight_decay, step=step)
