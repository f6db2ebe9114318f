"""adamw_step_ against torch.optim.AdamW(foreach=False), step by step, for
every option; f32 state for 16-bit parameters; a tensor lr; bad input."""

import itertools

import pytest
import torch

import tilefuse.functional as TF
from conftest import assert_close

STEPS = 50
SHAPE = (3, 67)
OPTIONS = list(itertools.product([False, True], [False, True], [0.0, 0.1]))
OPTION_IDS = [f"amsgrad={a}-maximize={m}-wd={w}" for a, m, w in OPTIONS]
HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)


def assert_state_close(got, want, dtype, param=False):
    """f32: within 1e-6 relative (the state comes out bit for bit; the
    parameter takes PyTorch's CPU sqrt, which is not correctly rounded, in
    each of its 50 updates: an element that crosses zero keeps those ulps of
    an O(1) value, hence its atol of 1e-7, one f32 ulp at 1); f64: 1e-14;
    f16/bf16: the dtype's tolerance."""
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7 if param else 0.0)
    elif dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    else:
        assert_close(got, want, dtype)


def run_steps(step_fn, dtype, state_dtype, amsgrad):
    """Runs `step_fn(step, grad)` STEPS times; returns the parameter and
    state it updated."""
    gen = torch.Generator().manual_seed(0)
    param = torch.randn(SHAPE, generator=gen).to(dtype)
    state = [torch.zeros(SHAPE, dtype=state_dtype) for _ in range(3 if amsgrad else 2)]
    for step in range(1, STEPS + 1):
        step_fn(step, torch.randn(SHAPE, generator=gen).to(dtype), param, state)
    return param, state


def torch_optim_steps(dtype, amsgrad, maximize, weight_decay, lr=HYPER["lr"]):
    gen = torch.Generator().manual_seed(0)
    param = torch.randn(SHAPE, generator=gen).to(dtype).requires_grad_(True)
    optimizer = torch.optim.AdamW([param], lr=lr, betas=HYPER["betas"], eps=HYPER["eps"],
                                  weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                                  foreach=False)
    for _ in range(STEPS):
        param.grad = torch.randn(SHAPE, generator=gen).to(dtype)
        optimizer.step()
    state = optimizer.state[param]
    names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
    return param.detach(), [state[name] for name in names]


def fused_step(amsgrad, maximize, weight_decay, lr=HYPER["lr"]):
    def step_fn(step, grad, param, state):
        TF.adamw_step_(param, grad, *state, lr=lr, beta1=HYPER["betas"][0],
                       beta2=HYPER["betas"][1], eps=HYPER["eps"], weight_decay=weight_decay,
                       step=step, amsgrad=amsgrad, maximize=maximize)
    return step_fn


@pytest.mark.parametrize("amsgrad,maximize,weight_decay", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=["f32", "f64", "bf16", "f16"])
def test_matches_torch_optim_adamw(dtype, amsgrad, maximize, weight_decay):
    # Regression (f32): every scalar of the step was f32; exp_avg_sq drifted
    # 1.3e-5 (beta2 0.999) relative after 50 steps.
    want_param, want_state = torch_optim_steps(dtype, amsgrad, maximize, weight_decay)
    param, state = run_steps(fused_step(amsgrad, maximize, weight_decay), dtype, dtype, amsgrad)
    for got, want in zip(state, want_state):
        assert_state_close(got, want, dtype)
    assert_state_close(param, want_param, dtype, param=True)


def reference_step(amsgrad, maximize, weight_decay):
    """torch.optim.AdamW's single-tensor step, op for op, for a 16-bit param
    with float32 state (which torch.optim does not offer)."""
    beta1, beta2 = HYPER["betas"]
    lr, eps = HYPER["lr"], HYPER["eps"]

    def step_fn(step, grad, param, state):
        grad = (-grad if maximize else grad).float()
        exp_avg, exp_avg_sq = state[:2]
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        second = exp_avg_sq
        if amsgrad:
            torch.maximum(state[2], exp_avg_sq, out=state[2])
            second = state[2]
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (second.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
    return step_fn


@pytest.mark.parametrize("amsgrad,maximize,weight_decay", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_float32_state_for_16_bit_params(dtype, amsgrad, maximize, weight_decay):
    want_param, want_state = run_steps(reference_step(amsgrad, maximize, weight_decay), dtype,
                                       torch.float32, amsgrad)
    param, state = run_steps(fused_step(amsgrad, maximize, weight_decay), dtype, torch.float32,
                             amsgrad)
    assert param.dtype == dtype and all(s.dtype == torch.float32 for s in state)
    for got, want in zip(state, want_state):
        assert_state_close(got, want, torch.float32)
    assert_close(param, want_param, dtype)


def test_tensor_lr_matches_torch_optim_and_does_not_recompile():
    from torch._dynamo.utils import counters

    # A tensor lr: torch.optim computes lr * weight_decay and lr / (1 -
    # beta1^step) in lr's dtype; so does the step here.
    lr = torch.tensor(3e-3)
    want_param, want_state = torch_optim_steps(torch.float32, False, False, 0.1, lr=lr)
    param, state = run_steps(fused_step(False, False, 0.1, lr=lr), torch.float32, torch.float32,
                             False)
    for got, want in zip(state, want_state):
        assert_state_close(got, want, torch.float32)
    assert_state_close(param, want_param, torch.float32, param=True)

    def step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr):
        TF.adamw_step_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr=lr, step=3,
                       amsgrad=True, maximize=True)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    tensors = [torch.randn(4, 8), torch.randn(4, 8)] + [torch.rand(4, 8) for _ in range(3)]
    expected = [t.clone() for t in tensors]
    for value in (1e-3, 2e-3, 5e-4):  # a schedule: one graph
        compiled(*tensors, torch.tensor(value))
        step(*expected, torch.tensor(value))
    assert counters["stats"]["unique_graphs"] == 1
    for got, want in zip(tensors, expected):
        torch.testing.assert_close(got, want)


def test_amsgrad_bumps_the_version_of_its_state():
    tensors = [torch.randn(2, 8), torch.randn(2, 8)] + [torch.zeros(2, 8) for _ in range(3)]
    before = [t._version for t in tensors]
    TF.adamw_step_(*tensors, lr=1e-3, step=1, amsgrad=True)
    assert [t._version - b for t, b in zip(tensors, before)] == [1, 0, 1, 1, 1]


def test_overlapping_tensors_are_refused():
    param, grad, state = torch.randn(4, 8), torch.randn(4, 8), torch.zeros(4, 8)
    # Regression: the same tensor as both moments computed garbage.
    with pytest.raises(ValueError, match=r"tilefuse.adamw_step_: 'exp_avg' and 'exp_avg_sq' are the "
                                         r"same tensor"):
        TF.adamw_step_(param, grad, state, state, lr=1e-3, step=1)
    with pytest.raises(ValueError, match=r"'param' and 'grad' are the same tensor"):
        TF.adamw_step_(param, param, state, state.clone(), lr=1e-3, step=1)
    buffer = torch.zeros(48)
    overlapping = buffer[:32].view(4, 8), buffer[16:48].view(4, 8)
    with pytest.raises(ValueError, match=r"'param' and 'exp_avg' overlap in memory"):
        TF.adamw_step_(overlapping[0], grad, overlapping[1], state, lr=1e-3, step=1)
    with pytest.raises(ValueError, match=r"'exp_avg_sq' and 'max_exp_avg_sq' overlap in memory"):
        TF.adamw_step_(param, grad, state, *overlapping, lr=1e-3, step=1, amsgrad=True)
    assert torch.equal(buffer, torch.zeros(48))  # nothing ran


def test_bad_input_names_the_argument():
    param, grad = torch.randn(4, 8), torch.randn(4, 8)
    state = [torch.zeros(4, 8), torch.zeros(4, 8)]
    with pytest.raises(ValueError, match=r"tilefuse.adamw_step_: amsgrad=True needs "
                                         r"'max_exp_avg_sq'"):
        TF.adamw_step_(param, grad, *state, lr=1e-3, step=1, amsgrad=True)
    with pytest.raises(ValueError, match=r"'max_exp_avg_sq' is given but amsgrad=False"):
        TF.adamw_step_(param, grad, *state, torch.zeros(4, 8), lr=1e-3, step=1)
    with pytest.raises(TypeError, match=r"tilefuse.adamw_step_: 'exp_avg' is Float, 'param' is "
                                        r"Double: the state must have param's dtype, or float32 "
                                        r"for a bfloat16 or float16 param"):
        TF.adamw_step_(param.double(), grad.double(), *state, lr=1e-3, step=1)
    with pytest.raises(TypeError, match=r"'exp_avg_sq' is BFloat16 but 'exp_avg' is Float"):
        TF.adamw_step_(param.bfloat16(), grad.bfloat16(), state[0], state[1].bfloat16(), lr=1e-3,
                       step=1)
    # Regression: "value cannot be converted to type float without overflow".
    with pytest.raises(ValueError, match=r"tilefuse.adamw_step_: eps = 1e\+40 is out of range for "
                                         r"float32"):
        TF.adamw_step_(param, grad, *state, lr=1e-3, eps=1e40, step=1)
    with pytest.raises(ValueError, match=r"tilefuse.adamw_step_: scalar 'neg_step_size' = "
                                         r"-1e\+39 is out of range for float32"):
        TF.adamw_step_(param, grad, *state, lr=1e38, step=1)
    with pytest.raises(ValueError, match=r"tilefuse.adamw_step_: beta2 must be in \[0, 1\), got 1"):
        TF.adamw_step_(param, grad, *state, lr=1e-3, beta2=1.0, step=1)
    with pytest.raises(ValueError, match=r"tilefuse.adamw_step_: a tensor 'lr' must have one element"):
        TF.adamw_step_(param, grad, *state, lr=torch.ones(2), step=1)
    with pytest.raises(TypeError, match=r"a tensor 'lr' must be float32 or float64, got BFloat16"):
        TF.adamw_step_(param, grad, *state, lr=torch.ones((), dtype=torch.bfloat16), step=1)
