"""GeGLU, gelu(a, approximate) * b, fused forward and backward: against
PyTorch and the float64 composition; bad input."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse.functional as TF
from conftest import assert_close, assert_compiled_matches_eager, float64_grads

APPROXIMATE = ["none", "tanh"]


def composition(approximate):
    return lambda a, b: F.gelu(a, approximate=approximate) * b


def fused(approximate):
    return lambda a, b: TF.geglu(a, b, approximate)


@pytest.mark.parametrize("approximate", APPROXIMATE)
@pytest.mark.parametrize("shape", [(4, 64), (3, 67), (1, 1), (2, 3, 40)], ids=str)
def test_forward_and_gradients(dtype, shape, approximate):
    a, b = (2 * torch.randn(shape)).to(dtype), torch.randn(shape).to(dtype)
    upstream = torch.randn(shape).to(dtype)
    leaves = [t.clone().requires_grad_(True) for t in (a, b)]
    out = TF.geglu(*leaves, approximate=approximate)
    out.backward(upstream)
    ref, ref_grads = float64_grads(composition(approximate), a, b, upstream=upstream)
    assert out.dtype == dtype
    assert_close(out, ref, dtype)
    for leaf, want in zip(leaves, ref_grads):
        assert_close(leaf.grad, want, dtype)
    if dtype == torch.float32:
        assert_close(out, composition(approximate)(a, b), dtype)


@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_gradcheck_float64(approximate):
    a = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fused(approximate), (a, b))


@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_zero_rows_and_non_finite_inputs(approximate):
    a = torch.randn(0, 8, requires_grad=True)
    out = TF.geglu(a, torch.randn(0, 8), approximate)
    out.sum().backward()
    assert out.shape == (0, 8) and a.grad.shape == (0, 8)
    # As float64 computes it (PyTorch's vectorized f32 gelu gives NaN at +inf).
    a = torch.tensor([[float("inf"), float("-inf"), float("nan"), 30.0, -30.0, 0.0, 1.0, -1.0]])
    b = torch.full_like(a, 2.0)
    expected = composition(approximate)(a.double(), b.double())
    assert_close(TF.geglu(a, b, approximate), expected, torch.float32, equal_nan=True)


def test_torch_compile_fullgraph():
    assert_compiled_matches_eager(
        lambda a, b: TF.geglu(a, b, approximate="tanh").square().sum(),
        lambda rows: (torch.randn(rows, 24, requires_grad=True), torch.randn(rows, 24)))


def test_bad_input_names_the_argument():
    a = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"tilefuse.geglu: approximate must be 'none' or 'tanh', "
                                         r"got 'erf'"):
        TF.geglu(a, a, "erf")
    with pytest.raises(ValueError, match=r"tilefuse.geglu: 'a' and 'b' must have the same shape"):
        TF.geglu(a, torch.randn(2, 5))
    with pytest.raises(TypeError, match=r"tilefuse.geglu: 'a' is Float but 'b' is BFloat16"):
        TF.geglu(a, a.bfloat16())
    with pytest.raises(ValueError, match=r"tilefuse.geglu: approximate must be 0 \(none\) or 1"):
        torch.ops.tilefuse.geglu_fwd(a, a, 2)
