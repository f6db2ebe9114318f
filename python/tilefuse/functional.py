"""Fused ops with the signatures of torch.nn.functional.

Each runs a built-in fusion (kernels_dsl) through a `tilefuse::` custom op
registered with PyTorch's dispatcher, with a fake implementation (so
torch.compile keeps it in the graph) and autograd through the fused
backward kernels.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import _C
from ._launch import FLOAT_STORAGE, CompiledFusion, run

__all__ = ["rms_norm", "layer_norm", "swiglu", "cross_entropy", "adamw_step_"]


@functools.cache
def _builtin(name: str) -> CompiledFusion:
    return CompiledFusion(_C.builtin(name))


def _check_tensor(op: str, name: str, value, *, floating: bool = True) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"tilefuse.{op}: argument '{name}' must be a Tensor, got "
                        f"{type(value).__name__}")
    if floating and value.dtype not in FLOAT_STORAGE:
        raise TypeError(f"tilefuse.{op}: argument '{name}' must be a float32, float16, "
                        f"bfloat16 or float64 tensor, got {value.dtype}")
    return value


def _check_same_device(op: str, reference: str, tensors: dict[str, Tensor]) -> torch.device:
    device = tensors[reference].device
    for name, tensor in tensors.items():
        if tensor.device != device:
            raise ValueError(f"tilefuse.{op}: argument '{name}' is on {tensor.device}, "
                             f"but '{reference}' is on {device}")
    return device


def _check_last_dim(op: str, name: str, tensor: Tensor, n: int, what: str = "[n]") -> None:
    if tuple(tensor.shape) != (n,):
        raise ValueError(f"tilefuse.{op}: argument '{name}' must have shape [{n}] ({what}), "
                         f"got {list(tensor.shape)}")


def _normalized_n(op: str, input: Tensor, normalized_shape) -> int:
    """n, after checking that normalized_shape is the last dimension."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = input.shape[-1] if input.dim() else 0
    if shape != (n,) or n == 0:
        raise ValueError(f"tilefuse.{op}: normalized_shape must be the last dimension "
                         f"[{n}] of 'input', got {list(shape)}")
    return n


def _run_builtin(op: str, name: str, x: Tensor, args: list, out=None) -> list[Tensor]:
    return run(op, _builtin(name), args, n=x.shape[-1], lead=tuple(x.shape[:-1]),
               storage=x.dtype, device=x.device, out=out)


# --- RMSNorm ---------------------------------------------------------------

@torch.library.custom_op("tilefuse::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    y, rstd = _run_builtin("rms_norm", "rms_norm_fwd", x,
                           [x.contiguous(), weight.contiguous(), eps])
    return y, rstd


@_rms_norm_fwd.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("tilefuse::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    dx, dweight = _run_builtin("rms_norm", "rms_norm_bwd", x,
                               [dy.contiguous(), x.contiguous(), weight.contiguous(), rstd])
    return dx, dweight


@_rms_norm_bwd.register_fake
def _(dy, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = torch.ops.tilefuse.rms_norm_bwd(dy.to(x.dtype), x, weight, rstd)
    return dx, dweight, None


torch.library.register_autograd("tilefuse::rms_norm_fwd", _rms_norm_backward,
                                setup_context=_rms_norm_setup)


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """torch.nn.functional.rms_norm over the last dimension, fused."""
    op = "rms_norm"
    _check_tensor(op, "input", input)
    n = _normalized_n(op, input, normalized_shape)
    if weight is None:
        weight = torch.ones(n, dtype=input.dtype, device=input.device)
    _check_tensor(op, "weight", weight)
    _check_last_dim(op, "weight", weight, n)
    _check_same_device(op, "input", {"input": input, "weight": weight})
    if eps is None:
        eps = torch.finfo(input.dtype).eps
    y, _ = torch.ops.tilefuse.rms_norm_fwd(input, weight.to(input.dtype), float(eps))
    return y


# --- LayerNorm -------------------------------------------------------------

@torch.library.custom_op("tilefuse::layer_norm_fwd", mutates_args=())
def _layer_norm_fwd(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    y, mean, rstd = _run_builtin("layer_norm", "layer_norm_fwd", x,
                                 [x.contiguous(), weight.contiguous(), bias.contiguous(), eps])
    return y, mean, rstd


@_layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return torch.empty_like(x), stats, torch.empty_like(stats)


@torch.library.custom_op("tilefuse::layer_norm_bwd", mutates_args=())
def _layer_norm_bwd(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor,
                    rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx, dweight, dbias = _run_builtin(
        "layer_norm", "layer_norm_bwd", x,
        [dy.contiguous(), x.contiguous(), weight.contiguous(), mean, rstd])
    return dx, dweight, dbias


@_layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, _, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dweight, dbias = torch.ops.tilefuse.layer_norm_bwd(dy.to(x.dtype), x, weight, mean, rstd)
    return dx, dweight, dbias, None


torch.library.register_autograd("tilefuse::layer_norm_fwd", _layer_norm_backward,
                                setup_context=_layer_norm_setup)


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.layer_norm over the last dimension, fused."""
    op = "layer_norm"
    _check_tensor(op, "input", input)
    n = _normalized_n(op, input, normalized_shape)
    if weight is None:
        weight = torch.ones(n, dtype=input.dtype, device=input.device)
    if bias is None:
        bias = torch.zeros(n, dtype=input.dtype, device=input.device)
    for name, tensor in (("weight", weight), ("bias", bias)):
        _check_tensor(op, name, tensor)
        _check_last_dim(op, name, tensor, n)
    _check_same_device(op, "input", {"input": input, "weight": weight, "bias": bias})
    y, _, _ = torch.ops.tilefuse.layer_norm_fwd(input, weight.to(input.dtype),
                                                bias.to(input.dtype), float(eps))
    return y


# --- SwiGLU ----------------------------------------------------------------

@torch.library.custom_op("tilefuse::swiglu_fwd", mutates_args=())
def _swiglu_fwd(a: Tensor, b: Tensor) -> Tensor:
    (c,) = _run_builtin("swiglu", "swiglu_fwd", a, [a.contiguous(), b.contiguous()])
    return c


@_swiglu_fwd.register_fake
def _(a, b):
    return torch.empty_like(a)


@torch.library.custom_op("tilefuse::swiglu_bwd", mutates_args=())
def _swiglu_bwd(dc: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    da, db = _run_builtin("swiglu", "swiglu_bwd", a,
                          [dc.contiguous(), a.contiguous(), b.contiguous()])
    return da, db


@_swiglu_bwd.register_fake
def _(dc, a, b):
    return torch.empty_like(a), torch.empty_like(b)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, dc):
    a, b = ctx.saved_tensors
    return torch.ops.tilefuse.swiglu_bwd(dc.to(a.dtype), a, b)


torch.library.register_autograd("tilefuse::swiglu_fwd", _swiglu_backward,
                                setup_context=_swiglu_setup)


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """silu(a) * b (the LLaMA MLP gate), fused."""
    op = "swiglu"
    _check_tensor(op, "a", a)
    _check_tensor(op, "b", b)
    if a.shape != b.shape:
        raise ValueError(f"tilefuse.{op}: 'a' and 'b' must have the same shape, got "
                         f"{list(a.shape)} and {list(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"tilefuse.{op}: 'a' is {a.dtype} but 'b' is {b.dtype}")
    if a.dim() == 0:
        raise ValueError(f"tilefuse.{op}: 'a' must have at least one dimension")
    _check_same_device(op, "a", {"a": a, "b": b})
    return torch.ops.tilefuse.swiglu_fwd(a, b)


# --- Cross-entropy ---------------------------------------------------------

@torch.library.custom_op("tilefuse::cross_entropy_fwd", mutates_args=())
def _cross_entropy_fwd(logits: Tensor, target: Tensor, ignore_index: int,
                       label_smoothing: float) -> tuple[Tensor, Tensor]:
    loss, lse = _run_builtin("cross_entropy", "cross_entropy_fwd", logits,
                             [logits.contiguous(), target.contiguous(), ignore_index,
                              label_smoothing])
    return loss, lse


@_cross_entropy_fwd.register_fake
def _(logits, target, ignore_index, label_smoothing):
    stats = logits.new_empty(logits.shape[:-1], dtype=torch.float32)
    return stats, torch.empty_like(stats)


@torch.library.custom_op("tilefuse::cross_entropy_bwd", mutates_args=())
def _cross_entropy_bwd(logits: Tensor, target: Tensor, lse: Tensor, dloss: Tensor,
                       ignore_index: int, label_smoothing: float) -> Tensor:
    (dlogits,) = _run_builtin("cross_entropy", "cross_entropy_bwd", logits,
                              [logits.contiguous(), target.contiguous(), lse,
                               dloss.float().contiguous(), ignore_index, label_smoothing])
    return dlogits


@_cross_entropy_bwd.register_fake
def _(logits, target, lse, dloss, ignore_index, label_smoothing):
    return torch.empty_like(logits)


def _cross_entropy_setup(ctx, inputs, output):
    logits, target, ignore_index, label_smoothing = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.ignore_index, ctx.label_smoothing = ignore_index, label_smoothing


def _cross_entropy_backward(ctx, dloss, _dlse):
    logits, target, lse = ctx.saved_tensors
    dlogits = torch.ops.tilefuse.cross_entropy_bwd(logits, target, lse, dloss,
                                                   ctx.ignore_index, ctx.label_smoothing)
    return dlogits, None, None, None


torch.library.register_autograd("tilefuse::cross_entropy_fwd", _cross_entropy_backward,
                                setup_context=_cross_entropy_setup)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """torch.nn.functional.cross_entropy for [N, C] logits and class indices,
    fused (log-softmax, NLL, label smoothing and the gradient)."""
    op = "cross_entropy"
    _check_tensor(op, "input", input)
    _check_tensor(op, "target", target, floating=False)
    if weight is not None:
        raise ValueError(f"tilefuse.{op}: class weights ('weight') are not supported")
    if size_average is not None or reduce is not None:
        raise ValueError(f"tilefuse.{op}: 'size_average' and 'reduce' are deprecated; use 'reduction'")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"tilefuse.{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"tilefuse.{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if input.dim() != 2:
        raise ValueError(f"tilefuse.{op}: 'input' must be [N, C] logits, got shape {list(input.shape)}")
    if target.dtype != torch.int64:
        raise TypeError(f"tilefuse.{op}: 'target' must hold int64 class indices, got {target.dtype}")
    if tuple(target.shape) != (input.shape[0],):
        raise ValueError(f"tilefuse.{op}: 'target' must have shape [{input.shape[0]}], got "
                         f"{list(target.shape)}")
    _check_same_device(op, "input", {"input": input, "target": target})
    classes = input.shape[1]
    if not torch.compiler.is_compiling() and target.numel():
        bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
        if bool(bad.any()):
            index = int(target[bad][0])
            raise IndexError(f"tilefuse.{op}: target {index} is out of bounds for "
                             f"{classes} classes")
    loss, _ = torch.ops.tilefuse.cross_entropy_fwd(input, target, int(ignore_index),
                                                   float(label_smoothing))
    if reduction == "none":
        return loss.to(input.dtype)
    total = loss.sum()
    if reduction == "sum":
        return total.to(input.dtype)
    return (total / (target != ignore_index).sum()).to(input.dtype)


# --- AdamW -----------------------------------------------------------------

@torch.library.custom_op("tilefuse::adamw_step_",
                         mutates_args=("param", "exp_avg", "exp_avg_sq"))
def _adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float, step: float) -> None:
    flat = [t.view(-1, t.shape[-1]) if t.dim() else t.view(1, 1)
            for t in (param, grad, exp_avg, exp_avg_sq)]
    run("adamw_step", _builtin("adamw_step"),
        [flat[0], flat[1].contiguous(), flat[2], flat[3], lr, beta1, beta2, eps,
         weight_decay, step],
        n=flat[0].shape[-1], lead=(flat[0].shape[0],), storage=param.dtype,
        device=param.device,
        out={"param_out": flat[0], "exp_avg_out": flat[2], "exp_avg_sq_out": flat[3]})


@_adamw_step.register_fake
def _(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step):
    return None


def adamw_step_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *,
                lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 1e-2, step: int) -> None:
    """One torch.optim.AdamW step on `param`, in place (with its state)."""
    op = "adamw_step_"
    tensors = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    for name, tensor in tensors.items():
        _check_tensor(op, name, tensor)
        if tensor.shape != param.shape:
            raise ValueError(f"tilefuse.{op}: '{name}' has shape {list(tensor.shape)}, "
                             f"'param' has {list(param.shape)}")
        if tensor.dtype != param.dtype:
            raise TypeError(f"tilefuse.{op}: '{name}' is {tensor.dtype}, 'param' is {param.dtype}")
    for name in ("param", "exp_avg", "exp_avg_sq"):
        if not tensors[name].is_contiguous():
            raise ValueError(f"tilefuse.{op}: '{name}' is updated in place and must be "
                             "contiguous (a copy would not be updated)")
    if step < 1:
        raise ValueError(f"tilefuse.{op}: step must be >= 1, got {step}")
    _check_same_device(op, "param", tensors)
    if param.numel() == 0:
        return
    torch.ops.tilefuse.adamw_step_(param, grad, exp_avg, exp_avg_sq, float(lr), float(beta1),
                                   float(beta2), float(eps), float(weight_decay), float(step))
