"""Multi-tensor launches of elementwise fusions, in-place outputs and scalars
read on the device, against the same math in PyTorch (float64 references).
Under TILEFUSE_TARGET=emulate the GPU code runs in the PTX emulator, on
fewer tensors (it interprets every instruction)."""

import contextlib
import os

import pytest
import torch

import tilefuse

EMULATED = os.environ.get("TILEFUSE_TARGET") == "emulate"


@tilefuse.fusion(inplace={"param": "param"})
def momentum_step(param, grad, lr, beta):
    return {"param": param - lr * grad * beta}


@tilefuse.fusion
def axpy(x, y, a):
    return x * a + y, tilefuse.cast(x > y, torch.int32)


def mixed_sizes(count: int, largest: int):
    """Sizes from 0 and 1 element up to a few chunks' worth (65,536
    elements per chunk), and odd ones between."""
    fixed = [0, 1, 2, 3, 7, 65_535, 65_536, 65_537, 200_003]
    return fixed + torch.randint(0, largest, (count - len(fixed),)).tolist()


def test_thousands_of_mixed_tensors_in_one_launch():
    # Emulated: a few hundred tiny tensors, several tables' worth.
    sizes = mixed_sizes(300, 4) if EMULATED else mixed_sizes(3000, 300)
    xs = [torch.randn(size) for size in sizes]
    ys = [torch.randn(size) for size in sizes]
    launches = tilefuse.kernel_launches()
    out, greater = axpy.multi_tensor(xs, ys, 0.3)
    # One dtype class: one parallel loop on the CPU; a GPU table holds
    # about a hundred tensors of axpy's four columns, so a launch per table.
    made = tilefuse.kernel_launches() - launches
    assert made == 1 if not EMULATED else made >= 3
    for x, y, o, g in zip(xs, ys, out, greater):
        assert o.shape == x.shape and o.dtype == torch.float32
        expected = (x.double() * 0.3 + y.double()).float()
        torch.testing.assert_close(o, expected, atol=1e-6, rtol=1e-6)
        assert torch.equal(g, (x > y).int())


def test_in_place_over_misaligned_views_and_dtypes():
    # Views that start one element into their storage (not 16-byte
    # aligned), beside aligned tensors, in f32, bf16 and f64 lists.
    base = torch.randn(4 * 1031 + 1)
    views = [base[1 + i * 1031:1 + (i + 1) * 1031] for i in range(4)]
    aligned = [torch.randn(17), torch.randn(3, 5), torch.randn(0), torch.randn(1)]
    params = views + aligned
    grads = [torch.randn_like(p) for p in params]
    expected = [(p.double() - 0.01 * g.double() * 0.9).float() for p, g in zip(params, grads)]
    snapshot = base.clone()
    result = momentum_step.multi_tensor(params, grads, 0.01, 0.9)
    assert all(r is p for r, p in zip(result["param"], params))
    for p, e in zip(params, expected):
        torch.testing.assert_close(p, e, atol=1e-6, rtol=1e-6)
    assert base[0] == snapshot[0]  # nothing outside the views is written

    bf16 = [torch.randn(n, dtype=torch.bfloat16) for n in (5, 64, 1)]
    grads = [torch.randn(n) for n in (5, 64, 1)]  # f32 gradients beside bf16
    expected = [(p.double() - 0.5 * g.double() * 2.0).to(torch.bfloat16)
                for p, g in zip(bf16, grads)]
    momentum_step.multi_tensor(bf16, grads, 0.5, 2.0)
    for p, e in zip(bf16, expected):
        assert p.dtype == torch.bfloat16
        torch.testing.assert_close(p, e, atol=0, rtol=0)

    wide = [torch.randn(9, dtype=torch.float64)]
    expected = wide[0] - 1e-3 * wide[0] * 0.5
    momentum_step.multi_tensor(wide, [wide[0].clone()], 1e-3, 0.5)
    torch.testing.assert_close(wide[0], expected, atol=0, rtol=1e-15)


def test_device_scalars_and_per_tensor_scalars():
    params = [torch.randn(n) for n in (3, 130, 1)]
    grads = [torch.randn_like(p) for p in params]
    lr = torch.tensor(0.1)
    compiled = tilefuse.compile_count()
    for value in (0.1, 0.2, 0.05):  # a schedule: new values, no recompile
        lr.fill_(value)
        before = [p.clone() for p in params]
        momentum_step.multi_tensor(params, grads, lr, 1.0)
        for p, b, g in zip(params, before, grads):
            torch.testing.assert_close(p, b - value * g, atol=1e-6, rtol=1e-6)
    assert tilefuse.compile_count() - compiled <= 1

    # One scalar per row set: each tensor scaled by its own factor.
    @tilefuse.fusion(inplace=["x"])
    def scale(x, factor):
        return {"x": x * factor}

    xs = [torch.ones(n) for n in (4, 0, 9)]
    factors = [torch.tensor(float(i + 2)) for i in range(3)]
    scale.multi_tensor(xs, tilefuse.per_tensor(factors))
    for x, f in zip(xs, factors):
        assert torch.equal(x, torch.full_like(x, f.item()))


def test_skip_if_writes_nothing():
    params = [torch.randn(n) for n in (5, 70)]
    before = [p.clone() for p in params]
    grads = [torch.full_like(p, float("inf")) for p in params]
    found_inf = torch.tensor(1.0)
    momentum_step.multi_tensor(params, grads, 0.1, 1.0, skip_if=found_inf)
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    found_inf.zero_()
    momentum_step.multi_tensor(params, [torch.ones_like(p) for p in params], 0.1, 1.0,
                               skip_if=found_inf)
    assert all(torch.allclose(p, b - 0.1) for p, b in zip(params, before))


def test_single_call_in_place_with_a_device_scalar():
    x = torch.randn(4, 33)
    grad = torch.randn(4, 33)
    expected = x - 0.25 * grad * 2.0
    result = momentum_step(x, grad, torch.tensor(0.25), 2.0)
    assert result["param"] is x
    torch.testing.assert_close(x, expected, atol=1e-6, rtol=1e-6)


@tilefuse.fusion(inplace={"param": "param"})
def momentum_with_update(param, grad, lr):
    update = lr * grad
    return {"update": update, "param": param - update}


def test_in_place_beside_a_new_output():
    """tilefuse::launch_fusion_ writes `param` (a new version, as torch's
    in-place ops) and `update` into a new tensor; launch_fusion of the same
    handle writes both to new tensors."""
    param, grad = torch.randn(4, 33), torch.randn(4, 33)
    before, version = param.clone(), param._version
    result = momentum_with_update(param, grad, 0.5)
    assert result["param"] is param and param._version > version
    torch.testing.assert_close(result["update"], 0.5 * grad, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(param, before - 0.5 * grad, atol=1e-6, rtol=1e-6)

    handle = momentum_with_update._traces[next(iter(momentum_with_update._traces))].handle
    kept = param.clone()
    update, new_param = torch.ops.tilefuse.launch_fusion(handle, [param, grad], [0.5])
    assert torch.equal(param, kept) and new_param.data_ptr() != param.data_ptr()
    torch.testing.assert_close(new_param, kept - 0.5 * grad, atol=1e-6, rtol=1e-6)

    launch = torch.ops.tilefuse.launch_fusion_
    with pytest.raises(ValueError, match=r"momentum_with_update: argument 'written' expected 1 "
                                         r"tensors \(the inputs written in place\), got 2"):
        launch(handle, [param, grad], [update], [], [0.5])
    with pytest.raises(ValueError, match=r"momentum_with_update: argument 'out' expected 1 "
                                         r"tensors \(the outputs not written in place\), got 0"):
        launch(handle, [param], [], [grad], [0.5])
    with pytest.raises(ValueError, match=r"momentum_with_update: argument 'tensors' has 2 "
                                         r"tensors; the inputs not written in place are 1"):
        launch(handle, [param], [update], [grad, grad], [0.5])
    leaf = torch.randn(4, 33, requires_grad=True)
    with pytest.raises(RuntimeError, match="momentum_with_update: writes in place and is not "
                                           "differentiable"):
        momentum_with_update(leaf, grad, 0.5)
    with pytest.raises(RuntimeError, match="momentum_with_update: writes in place"):
        launch(handle, [param], [torch.empty(4, 33, requires_grad=True)], [grad], [0.5])
    from torch._subclasses.fake_tensor import FakeTensorMode
    for mode in (contextlib.nullcontext(), FakeTensorMode()):  # the Meta kernel alike
        with mode, pytest.raises(ValueError, match=r"output 'update' must have shape \[4, 33\]"):
            launch(handle, [torch.randn(4, 33)], [torch.empty(4, 34)], [torch.randn(4, 33)], [0.5])
    with torch.no_grad():
        momentum_with_update(leaf, grad, 0.5)
    import torch.autograd.forward_ad as forward_ad
    with forward_ad.dual_level(), pytest.raises(NotImplementedError,
                                                match="launch_fusion_: forward-mode AD"):
        momentum_with_update(forward_ad.make_dual(param, torch.ones_like(param)), grad, 0.5)


def test_in_place_output_takes_its_inputs_dtype():
    """As torch's in-place ops: a bf16 parameter minus lr times an f32
    gradient is computed in f32 and stored as bf16 (single and
    multi-tensor calls); an int32 state minus an int64 one stays int32; a
    float result over an integer input is refused."""
    @tilefuse.fusion(inplace={"p": "p"})
    def step(p, g, lr):
        return {"p": p - lr * g}

    g = torch.randn(4, 33)
    for call in (lambda p: step(p, g, 0.1), lambda p: step.multi_tensor([p], [g], 0.1)):
        p = torch.randn(4, 33).bfloat16()
        expected = p.clone().sub_(0.1 * g)
        call(p)
        assert p.dtype == torch.bfloat16 and torch.equal(p, expected)
    counts = torch.randint(0, 9, (4, 33), dtype=torch.int32)
    expected = counts.clone().sub_(torch.ones(4, 33, dtype=torch.int64))
    step(counts, torch.ones(4, 33, dtype=torch.int64), 1)
    assert counts.dtype == torch.int32 and torch.equal(counts, expected)
    with pytest.raises(RuntimeError, match=r"step: result type torch.float32 of output 'p' "
                                           r"can't be cast to the dtype of 'p', torch.int32"):
        step(counts, g, 0.1)


def test_errors_name_the_fusion_and_argument():
    with pytest.raises(ValueError, match=r"axpy.multi_tensor: argument 'y' has 1 tensors"):
        axpy.multi_tensor([torch.ones(2), torch.ones(3)], [torch.ones(2)], 1.0)
    with pytest.raises(ValueError, match=r"'y'\[0\] has shape \[3\], the others \[2\]"):
        axpy.multi_tensor([torch.ones(2)], [torch.ones(3)], 1.0)
    with pytest.raises(TypeError, match=r"argument 'a' must be a list of tensors, a number"):
        axpy.multi_tensor([torch.ones(2)], [torch.ones(2)], "two")
    with pytest.raises(ValueError, match=r"'param'\[0\] is updated in place and overlaps"):
        base = torch.ones(5)
        momentum_step.multi_tensor([base[:4]], [base[1:]], 1.0, 1.0)
    with pytest.raises(ValueError, match="inplace names 'nope', which is not a parameter"):
        tilefuse.fusion(inplace=["nope"])(lambda x: x)
    with pytest.raises(ValueError, match="inplace writes output 'o' over 'a' and 'b'"):
        tilefuse.fusion(inplace={"a": "o", "b": "o"})(lambda a, b: {"o": a + b})

    @tilefuse.fusion
    def row_sum(x):
        return tilefuse.sum(x)

    with pytest.raises(ValueError, match=r"row_sum.multi_tensor: a multi-tensor kernel is elementwise; output .out0. is per row"):
        row_sum.multi_tensor([torch.ones(3)])


@pytest.mark.skipif(EMULATED, reason="torch.compile's graph is the same under the emulator")
def test_in_place_fusion_under_torch_compile():
    lr = torch.tensor(0.1)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def update(param, grad, lr):
        return momentum_step(param, grad, lr, 1.0)["param"] * 1

    param, grad = torch.randn(8, 16), torch.randn(8, 16)
    expected = param - 0.1 * grad
    torch.testing.assert_close(update(param, grad, lr), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(param, expected, atol=1e-6, rtol=1e-6)


def test_in_place_after_a_trace_time_constant():
    @tilefuse.fusion(inplace=["x"])
    def negate_if(flip, x, scale):
        return {"x": -x * scale if flip else x * scale}

    x = torch.randn(3, 10)
    expected = -x * 2.0
    assert negate_if(True, x, 2.0)["x"] is x
    torch.testing.assert_close(x, expected, atol=0, rtol=0)
    y = torch.randn(4, 6)
    expected = y * 0.5
    negate_if(False, y, 0.5)
    torch.testing.assert_close(y, expected, atol=0, rtol=0)


@tilefuse.fusion(inplace=["p", "m"])
def signed_momentum_step(p, g, m, lr, beta):
    m2 = beta * m + (1 - beta) * g
    return {"p": p - lr * tilefuse.sign(m2), "m": m2}


def test_in_place_arguments_that_share_memory_are_refused():
    """As PyTorch's in-place ops (and adamw_step_): written tensors that are
    one another, overlap, or overlap themselves gave order-dependent results
    without a word (p passed as p and m kept m's value), and a parameter
    listed twice in a multi-tensor launch was updated twice."""
    p = torch.ones(8)
    for m, message in [(p, "'p' is updated in place and overlaps 'm'"),
                       (p[2:6], "'p' is updated in place and overlaps 'm'")]:
        with pytest.raises(ValueError, match=f"tilefuse.signed_momentum_step: argument {message}"):
            signed_momentum_step(p[:4] if m is not p else p, torch.ones(m.shape), m, 0.1, 0.5)
    with pytest.raises(ValueError, match="'p' is updated in place and must not overlap itself"):
        signed_momentum_step(torch.ones(1).expand(4), torch.ones(4), torch.zeros(4), 0.1, 0.5)
    assert torch.equal(p, torch.ones(8))  # nothing written
    with pytest.raises(ValueError, match=r"signed_momentum_step.multi_tensor: argument 'p'\[0\] "
                                         r"and 'p'\[1\] share memory, and one of them is updated"):
        signed_momentum_step.multi_tensor([p, p], [torch.ones(8)] * 2,
                                          [torch.zeros(8), torch.zeros(8)], 0.1, 0.5)
    assert torch.equal(p, torch.ones(8))
    # A whole written tensor also read through another argument is fine:
    # each element is read before it is written.
    signed_momentum_step(p, p, torch.zeros(8), 0.1, 0.5)
    assert torch.equal(p, torch.full((8,), 0.9))


def test_multi_tensor_binds_arguments_as_a_single_call():
    """Keywords and the fusion's defaults, as the single call binds them
    (`.multi_tensor` took positional arguments only, every one of them)."""
    params, momenta = [torch.ones(4), torch.ones(3)], [torch.zeros(4), torch.zeros(3)]
    signed_momentum_step_default.multi_tensor(params, [torch.ones(4), torch.ones(3)], momenta,
                                              0.1)
    assert all(torch.allclose(m, torch.full_like(m, 0.1)) for m in momenta)  # beta = 0.9
    single = torch.ones(4), torch.zeros(4)
    signed_momentum_step_default(single[0], torch.ones(4), single[1], lr=0.1)
    assert torch.equal(params[0], single[0]) and torch.equal(momenta[0], single[1])
    signed_momentum_step_default.multi_tensor(params, [torch.ones(4), torch.ones(3)], momenta,
                                              beta=0.5, lr=0.1)
    assert all(torch.allclose(m, torch.full_like(m, 0.55)) for m in momenta)
    with pytest.raises(TypeError, match=r"tilefuse.signed_momentum_step_default.multi_tensor: "
                                        r"missing a required argument: 'm'"):
        signed_momentum_step_default.multi_tensor(params, momenta)


@tilefuse.fusion(inplace=["p", "m"])
def signed_momentum_step_default(p, g, m, lr, beta=0.9):
    m2 = beta * m + (1 - beta) * g
    return {"p": p - lr * tilefuse.sign(m2), "m": m2}
