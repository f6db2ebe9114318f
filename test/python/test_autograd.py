"""Derived backward kernels of DSL fusions against PyTorch autograd: four
everyday fusions in f32 and bf16 and gradcheck in f64, per-row and
per-column inputs, max routing, torch.compile of forward and backward."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse
from conftest import run_python


@tilefuse.fusion
def add_rms_norm(x, residual, weight, eps=1e-6):
    """Residual add + RMSNorm: the sum (the next residual) and the norm."""
    h = x + residual
    hf = tilefuse.cast(h, torch.float32)
    normed = hf * tilefuse.rsqrt(tilefuse.mean(hf * hf) + eps)
    return tilefuse.cast(normed, h.dtype) * weight, h


def add_rms_norm_reference(x, residual, weight, eps=1e-6):
    h = x + residual
    return F.rms_norm(h.float(), (h.shape[-1],), None, eps).to(h.dtype) * weight, h


@tilefuse.fusion
def lion(param, grad, exp_avg, lr, beta1=0.9, beta2=0.99, weight_decay=0.01):
    """One Lion step: the new parameter and momentum."""
    update = tilefuse.sign(beta1 * exp_avg + (1 - beta1) * grad)
    return param * (1 - lr * weight_decay) - lr * update, beta2 * exp_avg + (1 - beta2) * grad


def lion_reference(param, grad, exp_avg, lr, beta1=0.9, beta2=0.99, weight_decay=0.01):
    update = torch.sign(beta1 * exp_avg + (1 - beta1) * grad)
    return param * (1 - lr * weight_decay) - lr * update, beta2 * exp_avg + (1 - beta2) * grad


@tilefuse.fusion
def geglu(a, b):
    return tilefuse.gelu(a, approximate="tanh") * b


def geglu_reference(a, b):
    return F.gelu(a, approximate="tanh") * b


@tilefuse.fusion
def capped_log_softmax(logits, cap=30.0):
    """Logit soft-capping (Gemma 2) then log-softmax."""
    return tilefuse.log_softmax(cap * tilefuse.tanh(logits / cap))


def capped_log_softmax_reference(logits, cap=30.0):
    return torch.log_softmax(cap * torch.tanh(logits / cap), -1)


def rms_inputs(dtype, shape=(6, 40)):
    return (torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype),
            torch.randn(shape[-1], dtype=dtype))


CASES = {
    "add_rms_norm": (add_rms_norm, add_rms_norm_reference, rms_inputs, ()),
    "lion": (lion, lion_reference,
             lambda dtype: tuple(torch.randn(5, 24, dtype=dtype) for _ in range(3)), (1e-2,)),
    "geglu": (geglu, geglu_reference,
              lambda dtype: (torch.randn(4, 3, 33, dtype=dtype), torch.randn(4, 3, 33, dtype=dtype)),
              ()),
    "capped_log_softmax": (capped_log_softmax, capped_log_softmax_reference,
                           lambda dtype: (40 * torch.randn(7, 50, dtype=dtype),), ()),
}


def outputs(value):
    return value if isinstance(value, tuple) else (value,)


def gradients(function, tensors, scalars, seed):
    """Outputs and the gradients of every input for random output gradients."""
    tensors = [t.detach().requires_grad_() for t in tensors]
    results = outputs(function(*tensors, *scalars))
    generator = torch.Generator().manual_seed(seed)
    weights = [torch.randn(r.shape, generator=generator, dtype=torch.float64).to(r.dtype)
               for r in results]
    grads = torch.autograd.grad(results, tensors, weights)
    return results, grads


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_derived_gradients_match_torch_autograd(name, dtype):
    fused, reference, make, scalars = CASES[name]
    inputs = make(dtype)
    got, got_grads = gradients(fused, inputs, scalars, seed=1)
    # torch in float64 from the same inputs is the judge for both.
    want, want_grads = gradients(reference, [t.double() for t in inputs], scalars, seed=1)
    torch_low, torch_low_grads = gradients(reference, inputs, scalars, seed=1)
    for ours, truth, theirs in zip((*got, *got_grads), (*want, *want_grads),
                                   (*torch_low, *torch_low_grads)):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        error = (ours.double() - truth).abs().max().item()
        their_error = (theirs.double() - truth).abs().max().item()
        scale = truth.abs().max().item() + 1
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        assert error <= tolerance * scale or error <= 2 * their_error, (error, their_error)


@pytest.mark.parametrize("name", CASES)
def test_gradcheck_float64(name):
    fused, _, make, scalars = CASES[name]
    inputs = [t.double().requires_grad_() for t in make(torch.float64)]
    if name == "lion":  # sign's kinks: keep its argument away from 0
        inputs[2] = (inputs[2].detach() + 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda *t: fused(*t, *scalars), inputs)


@tilefuse.fusion
def affine_rows_and_columns(x, row_scale, col_bias, index):
    """Per-row and per-column inputs, a row max and a gather."""
    y = x * row_scale + col_bias
    return y, tilefuse.max(y), tilefuse.gather(x, index) * row_scale


def test_per_row_per_column_inputs_max_and_gather():
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    row_scale = torch.randn(6, dtype=torch.float64, requires_grad=True)
    col_bias = torch.randn(9, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 9, (6,))
    assert torch.autograd.gradcheck(
        lambda *t: affine_rows_and_columns(*t, index), (x, row_scale, col_bias))


@tilefuse.fusion
def weighted_column_and_row_sums(x, w):
    return tilefuse.sum(x * w, dim=0), tilefuse.sum(x, dim=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_16_bit_column_sums_are_differentiable(dtype):
    """A 16-bit column sum is the cast of its float32 sum, which
    fuse-differentiate refused as 'not a column reduction' (float32 sums
    worked). Against float64 within the 16-bit gradients' rounding."""
    x = torch.randn(5, 7, dtype=dtype, requires_grad=True)
    w = torch.randn(7, dtype=dtype, requires_grad=True)
    dcolumns, drows = torch.randn(7, dtype=dtype), torch.randn(5, dtype=dtype)
    columns, rows = weighted_column_and_row_sums(x, w)
    assert columns.dtype == rows.dtype == dtype
    dx, dw = torch.autograd.grad((columns, rows), (x, w), (dcolumns, drows))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = torch.autograd.grad(((x64 * w64).sum(0), x64.sum(-1)), (x64, w64),
                               (dcolumns.double(), drows.double()))
    ulp = torch.finfo(dtype).eps
    for got, expected in zip((dx, dw), want):
        torch.testing.assert_close(got.double(), expected, rtol=ulp, atol=ulp)


def test_row_max_sends_its_gradient_to_the_first_maximum():
    @tilefuse.fusion
    def row_max(x):
        return tilefuse.max(x)

    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, -1.0, 5.0, 5.0]], requires_grad=True)
    (dx,) = torch.autograd.grad(row_max(x).sum(), x)
    (want,) = torch.autograd.grad(x.max(-1).values.sum(), x)  # torch.max(dim): one index
    assert torch.equal(dx, want)


def test_only_the_inputs_that_need_gradients():
    x, residual, weight = rms_inputs(torch.float32)
    weight.requires_grad_()
    y, _ = add_rms_norm(x, residual, weight)
    assert y.requires_grad
    (dweight,) = torch.autograd.grad(y.sum(), weight)
    (want,) = torch.autograd.grad(add_rms_norm_reference(x, residual, weight)[0].sum(), weight)
    torch.testing.assert_close(dweight, want, atol=1e-5, rtol=1e-5)
    # An unused output's gradient is zeros; an integer output has none.
    with torch.no_grad():
        assert not add_rms_norm(x, residual, weight)[0].requires_grad


def test_integer_outputs_are_not_differentiable():
    @tilefuse.fusion
    def best(x):
        return tilefuse.argmax(x), tilefuse.max(x)

    x = torch.randn(3, 8, requires_grad=True)
    index, value = best(x)
    assert not index.requires_grad and value.requires_grad
    value.sum().backward()
    assert torch.equal(x.grad, F.one_hot(x.argmax(-1), 8).float())


def test_zero_dim_scalar_that_requires_grad_is_refused():
    with pytest.raises(TypeError, match=r"tilefuse.capped_log_softmax: argument 'cap' is a 0-d "
                                        r"tensor that requires grad"):
        capped_log_softmax(torch.randn(2, 5), torch.tensor(30.0, requires_grad=True))


def test_torch_compile_traces_forward_and_backward():
    # aot_eager: AOTAutograd traces run_fusion's autograd formula (inductor
    # runs the same graph; test_cache_and_compile covers it for DSL calls).
    def loss(x, residual, weight):
        y, h = add_rms_norm(x, residual, weight)
        return (y * y).sum() + h.sum()

    inputs = [t.requires_grad_() for t in rms_inputs(torch.float32)]
    loss(*inputs).backward()
    want = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    torch._dynamo.reset()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(*inputs).backward()
    for t, w in zip(inputs, want):
        torch.testing.assert_close(t.grad, w, atol=1e-5, rtol=1e-5)


@tilefuse.fusion
def gated(a, b):
    return tilefuse.silu(a) * b


def test_torch_compile_gives_gradients_through_views():
    # Regression: the compiled backward took a view's contiguous copy, made
    # while tracing, for the input, and gave its input no gradient.
    linear = torch.nn.Linear(8, 16)
    x = torch.randn(5, 8)

    def loss(x):
        a, b = linear(x).chunk(2, -1)  # views with the row stride of 16
        return (gated(a, b.t().contiguous().t()) ** 2).sum() + gated(x.t(), x.t()).sum()

    want = torch.autograd.grad(loss(x.requires_grad_()), [x, linear.weight])
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend="aot_eager")(x),
                              [x, linear.weight])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_compiled_backward_graphs_name_the_fusion_not_a_kernel_handle():
    # A handle numbers kernels in the order a process compiles them: a
    # backward graph cached on disk (AOTAutogradCache, inductor's) ran
    # whichever kernel another process had under that number.
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _):
        graphs.append(gm.code)
        return gm

    x = torch.randn(3, 8, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: gated(x, x).sum(), fullgraph=True,
                             backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    compiled(x).backward()
    torch.testing.assert_close(x.grad, torch.autograd.grad(
        (F.silu(x) * x).sum(), x)[0], atol=1e-5, rtol=1e-5)
    backward = graphs[-1]
    assert "run_fusion_backward" in backward and gated._key in backward
    assert "launch_fusion_backward" not in backward


def test_an_exported_call_without_gradients_refuses_a_backward():
    # torch.export traced it with no input requiring grad: its gradient
    # was dropped without a word.
    class Gate(torch.nn.Module):
        def forward(self, x):
            return gated(x, x)

    program = torch.export.export(Gate(), (torch.randn(2, 4),))
    y = program.module()(torch.randn(2, 4, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"tilefuse.gated: this call was traced \(torch.export, "
                                           r"torch.compile\) with no input requiring grad"):
        y.sum().backward()


def test_emulated_derived_backward_with_a_column_gradient():
    # The GPU code of the derived kernels, run by the PTX emulator (bounds,
    # races, barriers checked): dweight through per-block partials and the
    # finalize kernel.
    script = """
import torch, tilefuse
from tilefuse import emulator

@tilefuse.fusion
def scale_norm(x, weight, eps=1e-6):
    return x * tilefuse.rsqrt(tilefuse.mean(x * x) + eps) * weight

x = torch.randn(37, 256, requires_grad=True)
w = torch.randn(256, requires_grad=True)
g = torch.randn(37, 256)
dx, dw = torch.autograd.grad(scale_norm(x, w), (x, w), g)
want = torch.autograd.grad(torch.nn.functional.rms_norm(x, (256,), w, 1e-6), (x, w), g)
torch.testing.assert_close(dx, want[0], atol=1e-5, rtol=1e-5)
torch.testing.assert_close(dw, want[1], atol=1e-4, rtol=1e-4)
print(" ".join(launch["kernel"] for launch in emulator.last_launches()))
"""
    done = run_python(script, TILEFUSE_TARGET="emulate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["scale_norm", "scale_norm_bwd", "scale_norm_bwd_finalize"]
