"""Fused ops with the signatures of torch.nn.functional.

Each is a `tilefuse::` op registered with PyTorch's dispatcher in C++
(python/csrc/TorchOps.cpp and the op files it names): it checks its
arguments, runs a built-in fusion (kernels_dsl) on the CPU or the GPU, has a
meta implementation (so torch.compile keeps it in the graph) and autograd
through the fused backward kernel. A call costs one dispatch: no Python runs
between it and the kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (registers the tilefuse:: ops)

__all__ = ["rms_norm", "layer_norm", "swiglu", "geglu", "cross_entropy", "adamw_step_"]

_ops = torch.ops.tilefuse
_rms_norm = _ops.rms_norm.default
_layer_norm = _ops.layer_norm.default
_swiglu = _ops.swiglu.default
_geglu = _ops.geglu.default
_cross_entropy = _ops.cross_entropy.default
_adamw_step = _ops.adamw_step_.default
_adamw_step_tensor_lr = _ops.adamw_step_.Tensor


def _shape(normalized_shape):
    """normalized_shape as a list; an int is one dimension (as nn.LayerNorm
    and nn.RMSNorm take it)."""
    if isinstance(normalized_shape, (int, torch.SymInt)):
        return [normalized_shape]
    return normalized_shape


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None, *, offset: float = 0.0,
             casting_mode: str = "gemma") -> Tensor:
    """torch.nn.functional.rms_norm over the trailing `normalized_shape`
    dimensions, fused: `x * rsqrt(mean(x^2) + eps) * (offset + weight)`.

    `offset` is Gemma's (1.0 with zero-centered weights). `casting_mode` says
    where a bf16/f16 input is rounded, as the model families do it:

    - "gemma" (default): everything in float32, one rounding to the input's
      dtype at the end; the output has the input's dtype. This is exactly
      what torch.nn.functional.rms_norm computes (PyTorch 2.11, fused kernel
      and composite alike, any weight dtype), hence the default, and what
      Hugging Face's GemmaRMSNorm does.
    - "llama": float32 statistics, the normalized input rounded to its dtype
      before the weight multiplies it, output in the promoted dtype of input
      and weight (Hugging Face's LlamaRMSNorm: `weight * hidden.to(dtype)`;
      a bf16 input with an f32 weight gives f32).
    - "none": the input's dtype throughout (the weight is cast to it), each
      step rounded as PyTorch's ops on that dtype round it.

    `eps=None` is `torch.finfo(torch.float32).eps` (float64 inputs:
    float64's), as in PyTorch.
    """
    return _rms_norm(input, _shape(normalized_shape), weight, eps, offset=offset,
                     casting_mode=casting_mode)


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.layer_norm over the trailing `normalized_shape`
    dimensions, fused."""
    return _layer_norm(input, _shape(normalized_shape), weight, bias, eps)


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """silu(a) * b (the LLaMA MLP gate), fused."""
    return _swiglu(a, b)


def geglu(a: Tensor, b: Tensor, approximate: str = "none") -> Tensor:
    """gelu(a, approximate=approximate) * b (the GeGLU MLP gate; Gemma uses
    approximate='tanh'), fused."""
    return _geglu(a, b, approximate)


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


def adamw_step_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                max_exp_avg_sq: Tensor | None = None, *, lr: float | Tensor,
                beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 1e-2, step: int, amsgrad: bool = False,
                maximize: bool = False) -> None:
    """One torch.optim.AdamW step (foreach=False) on `param`, in place (with
    its state), operation for operation as PyTorch computes it.

    `step` counts from 1. With `amsgrad`, `max_exp_avg_sq` holds the running
    maximum of `exp_avg_sq`. The state may be float32 for a bfloat16 or
    float16 `param` (and `grad`). `lr` may be a one-element float32/float64
    tensor (read on the host: a GPU lr waits for the device), so that a
    schedule does not recompile under torch.compile."""
    step_op = _adamw_step_tensor_lr if isinstance(lr, Tensor) else _adamw_step
    step_op(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr=lr, beta1=beta1,
            beta2=beta2, eps=eps, weight_decay=weight_decay, step=step,
            amsgrad=amsgrad, maximize=maximize)
