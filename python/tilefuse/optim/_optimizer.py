"""What tilefuse's optimizers share: torch.optim.Optimizer's interface (param
groups, state, state_dict, zero_grad, hooks, LR schedulers), the state
torch's counterpart keeps, GradScaler support, and a step made of
multi-tensor launches of a fusion written in the DSL."""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

import tilefuse

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class Optimizer(torch.optim.Optimizer):
    """Base of tilefuse's optimizers. A subclass names the state tensors each
    parameter gets (`_state_names`, zeros like the parameter) and runs a
    group's update in `_update_group`, one `multi_tensor` call per kind of
    update.

    `state_dtype`: the dtype of the state of bfloat16 and float16 parameters
    (float32 by default; None keeps the parameter's dtype, as torch.optim
    does); other parameters keep their state in their own dtype.
    `master_weights`: keep a float32 copy of each 16-bit parameter
    (state['master_param']) that the update runs on, the parameter getting
    its rounding (as Apex's master_weights).

    With `torch.amp.GradScaler`, the scaler hands the step its scale and its
    inf/NaN flag (`grad_scale`, `found_inf`): gradients are unscaled inside
    the fused update, and a step whose gradients hold an inf or a NaN
    changes nothing (not the step count either), without a synchronization.
    """

    _step_supports_amp_scaling = True
    _state_names: tuple[str, ...] = ()
    _counts_steps = True

    def __init__(self, params, defaults: dict, *, state_dtype: torch.dtype | None = torch.float32,
                 master_weights: bool = False):
        super().__init__(params, defaults)
        if state_dtype is not None and not state_dtype.is_floating_point:
            raise TypeError(f"{type(self).__name__}: state_dtype must be a float dtype, got "
                            f"{state_dtype}")
        self.state_dtype = state_dtype
        self.master_weights = master_weights

    def _state_dtype_for(self, param: Tensor) -> torch.dtype:
        if param.dtype in _LOW_PRECISION and (self.master_weights or self.state_dtype is not None):
            return self.state_dtype or torch.float32
        return param.dtype

    def _init_state(self, param: Tensor, state: dict, group: dict) -> None:
        if self._counts_steps:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        dtype = self._state_dtype_for(param)
        for name in self._state_names:
            state[name] = torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)
        if self.master_weights and param.dtype in _LOW_PRECISION:
            state["master_param"] = param.detach().to(torch.float32)

    def _conform_state(self, param: Tensor, state: dict) -> None:
        """State loaded from elsewhere (torch.optim's casts it to the
        parameter's dtype and keeps `step` on the CPU) in this optimizer's
        dtypes and on the parameter's device."""
        if not state:
            return
        if self._counts_steps:
            state["step"] = torch.as_tensor(state.get("step", 0.0), dtype=torch.float32) \
                .to(param.device).reshape(()).clone()
        dtype = self._state_dtype_for(param)
        for name in self._state_names:
            if name in state:
                state[name] = state[name].to(device=param.device, dtype=dtype)
        if self.master_weights and param.dtype in _LOW_PRECISION:
            master = state.get("master_param")
            state["master_param"] = (param.detach() if master is None else master).to(
                device=param.device, dtype=torch.float32)

    def load_state_dict(self, state_dict: dict) -> None:
        # torch.optim casts floating state to its parameter's dtype, which
        # would round the float32 state and master copies of 16-bit
        # parameters: they are taken as given (after any other pre-hook) and
        # conformed (before any other post-hook). A tensor torch would have
        # cast is copied, as torch's cast copies it.
        given = []

        def keep(optimizer, state_dict):
            given.extend(state_dict["state"].get(index, {})
                         for group in state_dict["param_groups"] for index in group["params"])

        def conform(optimizer):
            params = [param for group in self.param_groups for param in group["params"]]
            for param, saved in zip(params, given):
                if param not in self.state:
                    continue
                state = self.state[param]
                for key, value in saved.items():
                    if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                        state[key] = value.to(device=param.device,
                                              copy=value.dtype != param.dtype)
                self._conform_state(param, state)

        hooks = [self.register_load_state_dict_pre_hook(keep),
                 self.register_load_state_dict_post_hook(conform, prepend=True)]
        try:
            super().load_state_dict(state_dict)
        finally:
            for hook in hooks:
                hook.remove()

    def _params_with_grad(self, group: dict) -> list[Tensor]:
        params = []
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if torch.is_complex(param):
                raise RuntimeError(f"{type(self).__name__} does not support complex parameters")
            if not self.state.get(param):
                state = {}
                self._init_state(param, state, group)
                if state:  # as torch.optim, no entry for a parameter without state
                    self.state[param] = state
            params.append(param)
        return params

    @torch.no_grad()
    def step(self, closure=None):
        """Performs a single optimization step.

        Args:
            closure (Callable, optional): A closure that reevaluates the model
                and returns the loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = self._params_with_grad(group)
            if not params:
                continue
            steps = [self.state[p]["step"] for p in params] if self._counts_steps else []
            if steps:
                torch._foreach_add_(steps, 1)
            self._update_group(group, params, 1.0 if grad_scale is None else grad_scale,
                               found_inf)
            if steps and found_inf is not None:
                # The skipped step does not count.
                torch._foreach_sub_(steps, [found_inf.to(steps[0].device)] * len(steps))
        return loss

    def _update_group(self, group: dict, params: list[Tensor], grad_scale, found_inf) -> None:
        raise NotImplementedError

    def _by_master(self, params: list[Tensor]):
        """(params, the lists a fusion's leading arguments take, whether
        they have master copies): those updated directly, then those with
        float32 master copies; float64 parameters in a launch of their own
        (a launch computes in float64 or in float32, as torch.optim's
        foreach groups by dtype)."""
        wide = [p for p in params if p.dtype == torch.float64]
        direct = [p for p in params
                  if p.dtype != torch.float64 and "master_param" not in self.state.get(p, {})]
        low = [p for p in params if "master_param" in self.state.get(p, {})]
        for plain in (direct, wide):
            if plain:
                yield plain, [plain], False
        if low:
            yield low, [low, [self.state[p]["master_param"] for p in low]], True


def fused(update, written: list[str], *, master: bool, name: str | None = None):
    """The fusion of `update` (a function of traced values returning its
    new values by the names of the parameters they overwrite), written in
    place. `master`: the update runs on `master_param`, a float32 copy of
    `param` given after it; both get the new value (param its rounding)."""
    if master:
        plain = update
        parameters = list(inspect.signature(plain).parameters.values())

        def update(param, master_param, *rest):
            result = plain(master_param, *rest)
            return {**result, "master_param": result["param"]}

        update.__name__ = plain.__name__
        update.__signature__ = inspect.Signature(
            parameters[:1] + [inspect.Parameter("master_param",
                                                inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            + parameters[1:])
        written = list(written) + ["master_param"]
    return tilefuse.fusion(update, name=name, inplace=written)


def scalar(value, device: torch.device):
    """A hyper-parameter as a fusion argument: a number, or a one-element
    tensor read on the device (a CPU tensor beside device parameters: its
    value)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"a tensor hyper-parameter must have one element, got shape "
                             f"{list(value.shape)}")
        if value.device != device:
            return value.item()
        return value.reshape(())
    return value

