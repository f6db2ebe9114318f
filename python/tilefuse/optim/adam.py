"""Adam and AdamW, written in the DSL.

`adam_update` is torch.optim.Adam's update (its single-tensor path,
foreach=False) on traced values, op for op and in the same precision: the
step's factors in float64 from the step count as a number, as torch
computes them in Python, the tensor math in the parameter's dtype. Each
fusion below is that update over one kind of parameter list, compiled once
and launched over a whole param group in a few multi-tensor launches.
"""

from __future__ import annotations

import functools

import torch

import tilefuse
from tilefuse import add, addcdiv, addcmul, item, lerp, maximum, sqrt

from ._optimizer import Optimizer, fused, scalar


def adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2,
                eps, weight_decay, grad_scale, *, maximize, decoupled, decay):
    """The new (param, exp_avg, exp_avg_sq, max_exp_avg_sq) of one step."""
    grad = grad * (1 / grad_scale)  # GradScaler's unscaling (1 without one)
    if maximize:
        grad = -grad
    if decay and decoupled:
        param = param * (1 - lr * weight_decay)
    elif decay:
        grad = add(grad, param, alpha=weight_decay)
    exp_avg = lerp(exp_avg, grad, 1 - beta1)
    exp_avg_sq = addcmul(exp_avg_sq * beta2, grad, grad, value=1 - beta2)
    step = item(step)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    if max_exp_avg_sq is not None:
        max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq)
        denom = sqrt(max_exp_avg_sq) / bias_correction2_sqrt + eps
    else:
        denom = sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
    param = addcdiv(param, exp_avg, denom, value=-step_size)
    return param, exp_avg, exp_avg_sq, max_exp_avg_sq


@functools.cache
def adam_fusion(*, amsgrad: bool, maximize: bool, decoupled: bool, decay: bool,
                master: bool) -> tilefuse.Fusion:
    """The fusion of one step for these options, over lists of parameters,
    gradients and state (see fused() for `master`)."""
    options = dict(maximize=maximize, decoupled=decoupled, decay=decay)
    if amsgrad:
        def adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2,
                 eps, weight_decay, grad_scale):
            param, exp_avg, exp_avg_sq, max_exp_avg_sq = adam_update(
                param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps,
                weight_decay, grad_scale, **options)
            return {"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
                    "max_exp_avg_sq": max_exp_avg_sq}
    else:
        def adam(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps,
                 weight_decay, grad_scale):
            param, exp_avg, exp_avg_sq, _ = adam_update(
                param, grad, exp_avg, exp_avg_sq, None, step, lr, beta1, beta2, eps,
                weight_decay, grad_scale, **options)
            return {"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    written = ["param", "exp_avg", "exp_avg_sq"] + ["max_exp_avg_sq"] * amsgrad
    return fused(adam, written, master=master, name="adamw" if decoupled else "adam")


class Adam(Optimizer):
    """torch.optim.Adam (its arguments, param groups, state and state_dict)
    with each param group's step fused into a few multi-tensor launches.
    `lr` and the betas may be tensors (read on the device: a schedule under
    torch.compile or CUDA-graph capture changes them without recompiling);
    see tilefuse.optim.Optimizer for `state_dtype`, `master_weights` and
    GradScaler."""

    _state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False,
                 state_dtype: torch.dtype | None = torch.float32,
                 master_weights: bool = False):
        name = type(self).__name__
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError(f"{name}: a tensor lr must have one element")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        # torch.optim.Adam's group keys, so that state_dicts load both ways
        # (foreach, capturable, differentiable and fused are kept, unused).
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize, "foreach": None,
                    "capturable": False, "differentiable": False, "fused": None,
                    "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults, state_dtype=state_dtype,
                         master_weights=master_weights)

    def _init_state(self, param, state, group):
        super()._init_state(param, state, group)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(state["exp_avg_sq"])

    def _conform_state(self, param, state):
        super()._conform_state(param, state)
        if "max_exp_avg_sq" in state:
            state["max_exp_avg_sq"] = state["max_exp_avg_sq"].to(
                device=param.device, dtype=self._state_dtype_for(param))

    def _update_group(self, group, params, grad_scale, found_inf):
        device = params[0].device
        beta1, beta2 = group["betas"]
        hyper = [scalar(value, device) for value in (
            group["lr"], beta1, beta2, group["eps"], group["weight_decay"], grad_scale)]
        options = dict(amsgrad=group["amsgrad"], maximize=group["maximize"],
                       decoupled=group["decoupled_weight_decay"],
                       decay=group["weight_decay"] != 0)
        for selected, head, master in self._by_master(params):
            states = [self.state[p] for p in selected]
            lists = [[p.grad for p in selected]]
            lists += [[s[name] for s in states] for name in self._state_names]
            if group["amsgrad"]:
                lists.append([s["max_exp_avg_sq"] for s in states])
            adam_fusion(master=master, **options).multi_tensor(
                *head, *lists, tilefuse.per_tensor([s["step"] for s in states]), *hyper,
                skip_if=found_inf)


class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay, 1e-2 by default), fused as
    tilefuse.optim.Adam is."""

    def __init__(self, params, lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 state_dtype: torch.dtype | None = torch.float32,
                 master_weights: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, state_dtype=state_dtype,
                         master_weights=master_weights)
