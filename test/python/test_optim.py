"""tilefuse.optim against torch.optim (foreach=False), step by step: params
and state after 50 steps, state_dicts loaded both ways, schedulers,
GradScaler, torch.compile with a tensor lr, and launches per step."""

import copy
import math
import os

import pytest
import torch

import tilefuse
import tilefuse.optim

# 1-D, 2-D, odd sizes, 0-dim and empty parameters.
SHAPES = [(7,), (3, 5), (), (0,), (129,), (2, 65), (1,)]


def make_params(dtype=torch.float32):
    return [torch.randn(shape, dtype=dtype).requires_grad_() for shape in SHAPES]


def clone_params(params):
    return [p.detach().clone().requires_grad_() for p in params]


def set_grads(step: int, *param_lists):
    generator = torch.Generator().manual_seed(step)
    grads = [torch.randn(p.shape, generator=generator) for p in param_lists[0]]
    for params in param_lists:
        for p, g in zip(params, grads):
            p.grad = g.to(p.dtype)


def assert_state_close(ours, theirs, params_ours, params_theirs):
    for p, q in zip(params_ours, params_theirs):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        mine, torch_state = ours.state[p], theirs.state[q]
        for key, value in torch_state.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(mine[key].float().reshape(value.shape),
                                           value.float(), rtol=1e-6, atol=1e-7,
                                           msg=lambda m: f"state '{key}': {m}")


CASES = [
    ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, amsgrad=True, weight_decay=0.1, maximize=True)),
    ("AdamW", dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)),
    ("AdamW", dict(lr=1e-2, amsgrad=True)),
    ("SGD", dict(lr=1e-2)),
    ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True, maximize=True)),
]


def steps_against_torch_optim(name, options, params, steps):
    """`steps` steps of tilefuse.optim's `name` on `params` and of
    torch.optim's on copies, the same gradients; their states compared."""
    reference = clone_params(params)
    ours = getattr(tilefuse.optim, name)(params, **options)
    theirs = getattr(torch.optim, name)(reference, foreach=False, **options)
    for step in range(steps):
        set_grads(step, params, reference)
        ours.step()
        theirs.step()
    assert_state_close(ours, theirs, params, reference)


@pytest.mark.parametrize("name, options", CASES,
                         ids=[f"{n}-{'-'.join(o)}" for n, o in CASES])
def test_fifty_steps_against_torch_optim(name, options):
    steps_against_torch_optim(name, options, make_params(), 50)


@pytest.mark.parametrize("name, options", CASES[1::2],
                         ids=[f"{n}-{'-'.join(o)}" for n, o in CASES[1::2]])
def test_a_group_mixing_float64_with_float32_as_torch_optim(name, options):
    """A launch computes in float64 or in float32, so a group holding both
    was refused ('param' mixes float64 with other float dtypes); torch.optim
    steps it (its foreach groups by dtype). Float64 parameters now take a
    launch of their own."""
    params = [p.to(torch.float64).detach().requires_grad_() if i % 2 else p
              for i, p in enumerate(make_params())]
    assert {p.dtype for p in params} == {torch.float32, torch.float64}
    steps_against_torch_optim(name, options, params, 5)


def lion_reference(params, grads, exp_avgs, lr, betas, weight_decay):
    """The authors' Lion update, in the parameters' dtype."""
    beta1, beta2 = betas
    for p, g, m in zip(params, grads, exp_avgs):
        p.mul_(1 - lr * weight_decay)
        p.add_(torch.sign(m * beta1 + g * (1 - beta1)), alpha=-lr)
        m.mul_(beta2).add_(g, alpha=1 - beta2)


def test_lion_against_a_float64_reference():
    # float32 rounding accumulates over the steps: ours may be off the
    # float64 reference by what the authors' update in float32 is off.
    params = make_params()
    exact = [p.detach().double() for p in params]
    single = [p.detach().clone() for p in params]
    exact_avgs = [torch.zeros_like(p) for p in exact]
    single_avgs = [torch.zeros_like(p) for p in single]
    ours = tilefuse.optim.Lion(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    for step in range(20):
        set_grads(step, params)
        ours.step()
        for reference, avgs in ((exact, exact_avgs), (single, single_avgs)):
            lion_reference(reference, [p.grad.to(reference[0].dtype) for p in params], avgs,
                           1e-3, (0.9, 0.99), 0.1)
    for mine, e, s in [(params, exact, single),
                       ([ours.state[p]["exp_avg"] for p in params], exact_avgs, single_avgs)]:
        for a, x, b in zip(mine, e, s):
            ours_error = (a.double() - x).abs().max() if x.numel() else 0
            single_error = (b.double() - x).abs().max() if x.numel() else 0
            assert ours_error <= 2 * single_error + 1e-7


@pytest.mark.parametrize("name, options", [
    ("AdamW", dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
    ("SGD", dict(lr=1e-2, momentum=0.9)),
])
def test_state_dicts_load_both_ways(name, options):
    params, reference = make_params(), None
    reference = clone_params(params)
    ours = getattr(tilefuse.optim, name)(params, **options)
    theirs = getattr(torch.optim, name)(reference, foreach=False, **options)
    for step in range(5):
        set_grads(step, params, reference)
        ours.step()
        theirs.step()
    # torch.optim's state into ours and ours into torch.optim, then both
    # pairs step on together.
    ours_from_torch = getattr(tilefuse.optim, name)(clone_params(reference), **options)
    ours_from_torch.load_state_dict(copy.deepcopy(theirs.state_dict()))
    torch_from_ours = getattr(torch.optim, name)(clone_params(params), foreach=False,
                                                 **options)
    torch_from_ours.load_state_dict(copy.deepcopy(ours.state_dict()))
    pairs = [(ours_from_torch, theirs), (ours, torch_from_ours)]
    for step in range(5, 10):
        for a, b in pairs:
            set_grads(step, a.param_groups[0]["params"], b.param_groups[0]["params"])
            a.step()
            b.step()
    for a, b in pairs:
        assert_state_close(a, b, a.param_groups[0]["params"], b.param_groups[0]["params"])


@pytest.mark.parametrize("name", ["Adam", "SGD", "Lion"])
def test_a_state_dict_keeps_the_float32_state_of_16_bit_parameters(name):
    # torch.optim's load_state_dict casts state to the parameter's dtype: it
    # rounded the float32 state and master copies to bfloat16.
    options = {"SGD": dict(lr=1e-2, momentum=0.9)}.get(name, dict(lr=1e-2))
    params = make_params(torch.bfloat16)
    ours = getattr(tilefuse.optim, name)(params, master_weights=True, **options)
    for step in range(3):
        set_grads(step, params)
        ours.step()
    loaded = getattr(tilefuse.optim, name)(clone_params(params), master_weights=True, **options)
    loaded.load_state_dict(ours.state_dict())
    for p, q in zip(params, loaded.param_groups[0]["params"]):
        assert ours.state[p].keys() == loaded.state[q].keys()
        for key, value in ours.state[p].items():
            assert value.dtype == torch.float32 and torch.equal(loaded.state[q][key], value), key
            # copied, as torch copies what it casts: the two do not share state
            assert value.numel() == 0 or loaded.state[q][key].data_ptr() != value.data_ptr()
    assert any(not torch.equal(value, value.bfloat16().float())
               for p in params for value in ours.state[p].values())


def test_sgd_without_momentum_keeps_no_state():
    params = make_params()
    ours = tilefuse.optim.SGD(params, lr=1e-2)
    set_grads(0, params)
    ours.step()
    assert ours.state_dict()["state"] == torch.optim.SGD(params, lr=1e-2).state_dict()["state"] == {}


def test_param_groups_and_a_scheduler():
    params = make_params()
    reference = clone_params(params)
    groups = lambda ps: [{"params": ps[:3], "lr": 1e-2},  # noqa: E731
                         {"params": ps[3:], "weight_decay": 0.5, "betas": (0.5, 0.9)}]
    ours = tilefuse.optim.AdamW(groups(params), lr=3e-2)
    theirs = torch.optim.AdamW(groups(reference), lr=3e-2, foreach=False)
    schedules = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)
                 for o in (ours, theirs)]
    for step in range(10):
        set_grads(step, params, reference)
        ours.step()
        theirs.step()
        for schedule in schedules:
            schedule.step()
    assert ours.param_groups[0]["lr"] == theirs.param_groups[0]["lr"]
    assert_state_close(ours, theirs, params, reference)
    ours.zero_grad()
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("name, options", [
    ("AdamW", dict(lr=1e-2)),
    ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.5)),
])
@pytest.mark.parametrize("skipped", [0, 1], ids=["first-step-skipped", "second-step-skipped"])
def test_grad_scaler_skips_a_step_with_an_inf_gradient(name, options, skipped):
    # A skipped first step leaves no state to start from (SGD's momentum
    # buffers were left unwritten and then read as if started).
    params = make_params()
    reference = clone_params(params)
    ours = getattr(tilefuse.optim, name)(params, **options)
    theirs = getattr(torch.optim, name)(reference, foreach=False, **options)
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    for scaler in scalers:
        scaler.scale(torch.ones(()))  # the scale is made on first use
    for step in range(4):
        set_grads(step, params, reference)
        for ps in (params, reference):
            for p in ps:
                p.grad.mul_(1024.0 if step <= skipped else 512.0)
        if step == skipped:  # an overflow: the step changes nothing
            params[0].grad[0] = float("inf")
            reference[0].grad[0] = float("inf")
            before = [p.detach().clone() for p in params]
        for scaler, optimizer in zip(scalers, (ours, theirs)):
            scaler.step(optimizer)
            scaler.update()
        if step == skipped:
            assert all(torch.equal(p, b) for p, b in zip(params, before))
            if "step" in ours.state.get(params[1], {}):
                assert ours.state[params[1]]["step"].item() == skipped
    assert scalers[0].get_scale() == scalers[1].get_scale() == 512.0
    assert_state_close(ours, theirs, params, reference)


def test_mixed_precision_state_and_master_weights():
    params = make_params(torch.bfloat16)
    reference = [p.detach().double().requires_grad_() for p in params]
    ours = tilefuse.optim.AdamW(params, lr=1e-2, master_weights=True)
    theirs = torch.optim.AdamW(reference, lr=1e-2, foreach=False)
    for step in range(10):
        set_grads(step, params, reference)
        for p in reference:  # the gradients the bf16 parameters get
            p.grad = p.grad.to(torch.bfloat16).double()
        ours.step()
        theirs.step()
    for p, r in zip(params, reference):
        state = ours.state[p]
        assert state["exp_avg"].dtype == state["master_param"].dtype == torch.float32
        assert p.dtype == torch.bfloat16
        torch.testing.assert_close(state["master_param"].double(), r, rtol=1e-5, atol=1e-6)
        assert torch.equal(p, state["master_param"].to(torch.bfloat16))


def test_launches_per_step_for_a_thousand_parameters():
    params = [torch.randn(n).requires_grad_() for n in torch.randint(0, 50, (1000,)).tolist()]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = tilefuse.optim.AdamW(params, lr=1e-3)
    optimizer.step()
    launches = tilefuse.kernel_launches()
    optimizer.step()
    # One parallel loop over every tensor on the CPU; a GPU launch per table
    # of 85 non-empty tensors (AdamW's five lists in the kernel-parameter space).
    emulated = os.environ.get("TILEFUSE_TARGET", "").startswith("emulate")
    tables = math.ceil(sum(p.numel() > 0 for p in params) / 85)
    assert tilefuse.kernel_launches() - launches == (tables if emulated else 1)


def test_a_compiled_training_step_with_a_tensor_lr_does_not_recompile():
    params = make_params()
    reference = clone_params(params)
    ours = tilefuse.optim.AdamW(params, lr=torch.tensor(1e-2))
    theirs = torch.optim.AdamW(reference, lr=1e-2, foreach=False)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1 / (step + 1))
                 for o in (ours, theirs)]
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    @torch.compile(backend=backend)
    def step():
        ours.step()

    for index in range(6):
        set_grads(index, params, reference)
        step()
        theirs.step()
        for schedule in schedules:
            schedule.step()
        if index == 1:
            compiled = len(graphs)
    assert len(graphs) == compiled  # new lr values, no new graph
    assert_state_close(ours, theirs, params, reference)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_parameters_with_float32_state(dtype):
    # torch.optim rounds every op to the parameters' dtype; ours keeps the
    # state in float32 and rounds the parameter once per step: both against
    # float64, ours no further off (torch's float16 AdamW divides by zero
    # here: eps 1e-8 is 0 in float16).
    params = make_params(dtype)
    exact = [p.detach().double().requires_grad_() for p in params]
    narrow = clone_params(params)
    ours = tilefuse.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    optimizers = [torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False)
                  for ps in (exact, narrow)]
    for step in range(10):
        set_grads(step, params, narrow)
        for p, q in zip(exact, params):
            p.grad = q.grad.double()
        ours.step()
        for optimizer in optimizers:
            optimizer.step()
    assert all(p.dtype == dtype and ours.state[p]["exp_avg"].dtype == torch.float32
               for p in params)
    error = lambda ps: torch.cat([(p.double() - e.detach()).abs().flatten()  # noqa: E731
                                  for p, e in zip(ps, exact)]).mean()
    assert error(params) <= error(narrow)
