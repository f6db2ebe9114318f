"""SGD with momentum and Nesterov, written in the DSL: `sgd_update` is
torch.optim.SGD's update (its single-tensor path, foreach=False) on traced
values, op for op."""

from __future__ import annotations

import functools

import torch

import tilefuse
from tilefuse import add

from ._optimizer import Optimizer, fused, scalar


def sgd_update(param, grad, momentum_buffer, lr, momentum, dampening, weight_decay,
               grad_scale, *, maximize, decay, first, nesterov):
    """The new (param, momentum_buffer) of one step; `first`: the buffer is
    new (it starts as the gradient); without momentum_buffer, plain SGD."""
    grad = grad * (1 / grad_scale)  # GradScaler's unscaling (1 without one)
    if maximize:
        grad = -grad
    if decay:
        grad = add(grad, param, alpha=weight_decay)
    if momentum_buffer is not None:
        momentum_buffer = grad if first else \
            add(momentum_buffer * momentum, grad, alpha=1 - dampening)
        grad = add(grad, momentum_buffer, alpha=momentum) if nesterov else momentum_buffer
    return add(param, grad, alpha=-lr), momentum_buffer


@functools.cache
def sgd_fusion(*, momentum: bool, maximize: bool, decay: bool, first: bool,
               nesterov: bool, master: bool) -> tilefuse.Fusion:
    """The fusion of one step for these options (see fused() for
    `master`)."""
    options = dict(maximize=maximize, decay=decay, first=first, nesterov=nesterov)
    if momentum:
        def sgd(param, grad, momentum_buffer, lr, momentum, dampening, weight_decay,
                grad_scale):
            param, momentum_buffer = sgd_update(param, grad, momentum_buffer, lr, momentum,
                                                dampening, weight_decay, grad_scale, **options)
            return {"param": param, "momentum_buffer": momentum_buffer}
        return fused(sgd, ["param", "momentum_buffer"], master=master)

    def sgd(param, grad, lr, weight_decay, grad_scale):
        param, _ = sgd_update(param, grad, None, lr, 0.0, 0.0, weight_decay, grad_scale,
                              **options)
        return {"param": param}
    return fused(sgd, ["param"], master=master)


class SGD(Optimizer):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay,
    maximize; its param groups, state and state_dict) with each param
    group's step fused into a few multi-tensor launches. `lr` may be a
    tensor, read on the device; see tilefuse.optim.Optimizer for
    `state_dtype`, `master_weights` and GradScaler. With GradScaler, a param
    group that starts momentum buffers reads the inf/NaN flag on the host (a
    synchronization; not while a CUDA graph is captured): a buffer starts at
    the first step not skipped."""

    _counts_steps = False

    def __init__(self, params, lr: float | torch.Tensor = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: float = 0, nesterov: bool = False, *,
                 maximize: bool = False, state_dtype: torch.dtype | None = torch.float32,
                 master_weights: bool = False):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("SGD: a tensor lr must have one element")
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
                    "foreach": None, "differentiable": False, "fused": None}
        super().__init__(params, defaults, state_dtype=state_dtype,
                         master_weights=master_weights)

    def _conform_state(self, param, state):
        super()._conform_state(param, state)
        if state.get("momentum_buffer") is not None:
            state["momentum_buffer"] = state["momentum_buffer"].to(
                device=param.device, dtype=self._state_dtype_for(param))

    def _update_group(self, group, params, grad_scale, found_inf):
        device = params[0].device
        lr = scalar(group["lr"], device)
        weight_decay = scalar(group["weight_decay"], device)
        scale = scalar(grad_scale, device)
        options = dict(maximize=group["maximize"], decay=group["weight_decay"] != 0,
                       nesterov=group["nesterov"])
        momentum, dampening = (scalar(group[key], device) for key in ("momentum", "dampening"))
        starts = group["momentum"] != 0 and any(
            self.state.get(p, {}).get("momentum_buffer") is None for p in params)
        if starts and found_inf is not None and found_inf.item():
            # A buffer starts as the gradient of the first step that is not
            # skipped: a skipped step must leave none. Every launch would skip
            # anyway; a synchronization, only in a group that starts buffers.
            return
        for selected, head, master in self._by_master(params):
            grads = [p.grad for p in selected]
            if group["momentum"] == 0:
                sgd_fusion(momentum=False, first=False, master=master, **options).multi_tensor(
                    *head, grads, lr, weight_decay, scale, skip_if=found_inf)
                continue
            # Parameters without a buffer yet start one (from their gradient).
            first = [self.state[p].get("momentum_buffer") is None for p in selected]
            for p, new in zip(selected, first):
                if new:
                    self.state[p]["momentum_buffer"] = torch.empty_like(
                        p, dtype=self._state_dtype_for(p), memory_format=torch.preserve_format)
            for kind in (True, False):
                pick = [i for i, new in enumerate(first) if new == kind]
                if not pick:
                    continue
                sgd_fusion(momentum=True, first=kind, master=master, **options).multi_tensor(
                    *([items[i] for i in pick] for items in head), [grads[i] for i in pick],
                    [self.state[selected[i]]["momentum_buffer"] for i in pick], lr, momentum,
                    dampening, weight_decay, scale, skip_if=found_inf)
