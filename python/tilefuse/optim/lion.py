"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization
Algorithms"), written in the DSL: the update of the authors' reference code
(and lucidrains' lion-pytorch), op for op."""

from __future__ import annotations

import functools

import torch

import tilefuse
from tilefuse import add, sign

from ._optimizer import Optimizer, fused, scalar


def lion_update(param, grad, exp_avg, lr, beta1, beta2, weight_decay, grad_scale, *,
                maximize, decay):
    """The new (param, exp_avg) of one step."""
    grad = grad * (1 / grad_scale)  # GradScaler's unscaling (1 without one)
    if maximize:
        grad = -grad
    if decay:
        param = param * (1 - lr * weight_decay)
    update = sign(add(exp_avg * beta1, grad, alpha=1 - beta1))
    param = add(param, update, alpha=-lr)
    exp_avg = add(exp_avg * beta2, grad, alpha=1 - beta2)
    return param, exp_avg


@functools.cache
def lion_fusion(*, maximize: bool, decay: bool, master: bool) -> tilefuse.Fusion:
    """The fusion of one step for these options (see fused() for
    `master`)."""
    def lion(param, grad, exp_avg, lr, beta1, beta2, weight_decay, grad_scale):
        param, exp_avg = lion_update(param, grad, exp_avg, lr, beta1, beta2, weight_decay,
                                     grad_scale, maximize=maximize, decay=decay)
        return {"param": param, "exp_avg": exp_avg}
    return fused(lion, ["param", "exp_avg"], master=master)


class Lion(Optimizer):
    """Lion: the sign of an interpolation of momentum and gradient, with
    decoupled weight decay; one state tensor (exp_avg) per parameter.
    Defaults as the authors recommend (lr 3-10x smaller than AdamW's,
    weight decay 3-10x larger). `lr` may be a tensor, read on the device."""

    _state_names = ("exp_avg",)
    _counts_steps = False

    def __init__(self, params, lr: float | torch.Tensor = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0, *,
                 maximize: bool = False, state_dtype: torch.dtype | None = torch.float32,
                 master_weights: bool = False):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Lion: a tensor lr must have one element")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        for index, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay,
                    "maximize": maximize}
        super().__init__(params, defaults, state_dtype=state_dtype,
                         master_weights=master_weights)

    def _update_group(self, group, params, grad_scale, found_inf):
        device = params[0].device
        beta1, beta2 = group["betas"]
        hyper = [scalar(value, device) for value in (
            group["lr"], beta1, beta2, group["weight_decay"], grad_scale)]
        for selected, head, master in self._by_master(params):
            lion_fusion(maximize=group["maximize"], decay=group["weight_decay"] != 0,
                        master=master).multi_tensor(
                *head, [p.grad for p in selected],
                [self.state[p]["exp_avg"] for p in selected], *hyper, skip_if=found_inf)
