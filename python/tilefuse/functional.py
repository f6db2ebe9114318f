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

__all__ = ["rms_norm", "layer_norm", "swiglu", "geglu", "cross_entropy", "linear_cross_entropy",
           "adamw_step_"]

_ops = torch.ops.tilefuse
_rms_norm = _ops.rms_norm.default
_layer_norm = _ops.layer_norm.default
_swiglu = _ops.swiglu.default
_geglu = _ops.geglu.default
_cross_entropy = _ops.cross_entropy.default
_cross_entropy_with_z_loss = _ops.cross_entropy_with_z_loss.default
_cross_entropy_inplace_backward = _ops.cross_entropy_inplace_backward.default
_linear_cross_entropy = _ops.linear_cross_entropy.default
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
      dtype at the end; the output has the input's dtype. These are the
      roundings of torch.nn.functional.rms_norm (PyTorch 2.11, fused kernel
      and composite alike, any weight dtype), hence the default, and of
      Hugging Face's GemmaRMSNorm; the mean of squares sums in another
      order, so a 16-bit output differs from torch's in the last bit in a
      few elements of long rows (as accurate against float64).
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
                  reduction: str = "mean", label_smoothing: float = 0.0, *,
                  lse_square_scale: float = 0.0, softcap: float | None = None,
                  return_z_loss: bool = False, inplace_backward: bool = False):
    """torch.nn.functional.cross_entropy, fused (log-softmax, the loss, label
    smoothing and the gradient in one kernel each way).

    Takes torch's forms: logits [N, C] or [C], and [N, C, d1, ...] (the
    classes moved last by a copy), with int64 class indices or probability
    targets of the logits' shape; and [..., V] logits with [...] class
    indices, as language models produce ([B, T, V] with [B, T]: rows of the
    logits as they are, no copy; where both readings fit, torch's wins).
    `weight`, `ignore_index`, `label_smoothing` and every `reduction` as in
    torch, NaN and infinities included (a -inf logit masks its class; with
    label smoothing it makes the loss inf, as torch's). Class indices are
    checked against the number of classes, which on a GPU waits for them.

    Options of LLM training (Liger-Kernel's names):
      lse_square_scale: the z-loss of PaLM, lse_square_scale * logsumexp^2
        per row, added to the loss ('mean' divides it by the rows not
        ignored, whatever the class weights).
      softcap: the logits become softcap * tanh(logits / softcap) before the
        softmax (Gemma 2), differentiated through.
      return_z_loss: return (loss, z_loss); the z-loss is for logging (it is
        already in the loss and has no gradient of its own).
      inplace_backward: the forward writes the gradient over `input`'s
        storage and the backward only scales it, saving a [tokens, vocab]
        buffer. Legal only when nothing reads the logits afterwards: their
        values are gone, which autograd detects for what it saved of them
        (its backward raises) but not for reads by your own code. Refused for
        leaves that require grad, views of them and non-contiguous logits
        ([N, C, d1, ...] logits are copied first, so they gain nothing); the
        backward runs once (no retain_graph). Without a gradient to compute,
        `input` is left as it is.
    """
    if size_average is not None or reduce is not None:
        raise ValueError("tilefuse.cross_entropy: 'size_average' and 'reduce' are "
                         "deprecated; use 'reduction'")
    args = (input, target, weight, ignore_index, reduction, label_smoothing)
    options = {"lse_square_scale": lse_square_scale, "softcap": softcap}
    if inplace_backward:
        loss, z_loss = _cross_entropy_inplace_backward(*args, **options)
    elif return_z_loss:
        loss, z_loss = _cross_entropy_with_z_loss(*args, **options)
    else:
        return _cross_entropy(*args, **options)
    return (loss, z_loss) if return_z_loss else loss


def linear_cross_entropy(input: Tensor, weight: Tensor, target: Tensor,
                         bias: Tensor | None = None, *, ce_weight: Tensor | None = None,
                         ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
                         softcap: float | None = None, return_z_loss: bool = False,
                         chunk_bytes: int | None = None):
    """cross_entropy(input @ weight.T + bias, target, ...) without ever
    holding the [tokens, vocab] logits (a language model's head and loss).

    `input` is [..., hidden], `weight` [vocab, hidden], `bias` [vocab];
    `target` holds class indices of `input`'s leading shape or probabilities
    [..., vocab]; `ce_weight` are class weights. The other options are
    cross_entropy's. Tokens go in chunks whose logits take at most
    `chunk_bytes` (default 256 MiB, at least one row): each chunk's logits
    come from a matmul, the fused kernel turns them into the losses and, in
    place, their gradient, and matmuls turn that into the chunk's share of
    the gradients of `input`, `weight` and `bias` (accumulated in float32 for
    16-bit parameters). With reduction 'mean' or 'sum' this happens in the
    forward and the backward only scales the gradients (once: no
    retain_graph); with 'none' the backward recomputes the chunks.
    """
    loss, z_loss = _linear_cross_entropy(
        input, weight, target, bias, ce_weight, ignore_index, reduction, label_smoothing,
        lse_square_scale=lse_square_scale, softcap=softcap, chunk_bytes=chunk_bytes)
    return (loss, z_loss) if return_z_loss else loss


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
