"""The built-in fused ops against torch.nn.functional, forward and backward
(the options and forms of the norms, GeGLU and AdamW: test_norms.py,
test_geglu.py, test_adamw.py)."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse.functional as TF
from conftest import assert_close


def grads(fn, *tensors):
    """fn's output and the gradients of its inputs for a fixed upstream
    gradient (the same for the fused op and the reference, so differences
    in the outputs do not feed the gradients)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(upstream.to(out.dtype))
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 100), (1, 4096)], ids=str)
def test_rms_norm(shape, dtype):
    x = torch.randn(shape).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1])).to(dtype)
    out, (dx, dw) = grads(lambda x, w: TF.rms_norm(x, (shape[-1],), w, 1e-6), x, w)
    ref, (rdx, rdw) = grads(lambda x, w: F.rms_norm(x.float(), (shape[-1],), w.float(), 1e-6).to(dtype), x, w)
    assert_close(out, ref, dtype)
    assert_close(dx, rdx, dtype)
    atol = {torch.float32: 1e-4, torch.float16: 5e-2, torch.bfloat16: 2e-1}[dtype]
    torch.testing.assert_close(dw.float(), rdw.float(), atol=atol, rtol=atol)


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 100)], ids=str)
def test_layer_norm(shape, dtype):
    n = shape[-1]
    x = torch.randn(shape).to(dtype)
    w, b = (1 + 0.1 * torch.randn(n)).to(dtype), (0.1 * torch.randn(n)).to(dtype)
    out, (dx, dw, db) = grads(lambda x, w, b: TF.layer_norm(x, (n,), w, b), x, w, b)
    ref, (rdx, rdw, rdb) = grads(
        lambda x, w, b: F.layer_norm(x.float(), (n,), w.float(), b.float()).to(dtype), x, w, b)
    assert_close(out, ref, dtype)
    assert_close(dx, rdx, dtype)
    atol = {torch.float32: 1e-4, torch.float16: 5e-2, torch.bfloat16: 2e-1}[dtype]
    torch.testing.assert_close(dw.float(), rdw.float(), atol=atol, rtol=atol)
    torch.testing.assert_close(db.float(), rdb.float(), atol=atol, rtol=atol)


@pytest.mark.parametrize("shape", [(4, 64), (3, 7)], ids=str)
def test_swiglu(shape, dtype):
    a, b = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    out, (da, db) = grads(TF.swiglu, a, b)
    ref, (rda, rdb) = grads(lambda a, b: (F.silu(a.float()) * b.float()).to(dtype), a, b)
    assert_close(out, ref, dtype)
    assert_close(da, rda, dtype)
    assert_close(db, rdb, dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy(reduction, label_smoothing):
    logits = torch.randn(8, 37)
    target = torch.randint(0, 37, (8,))
    target[3] = -100
    def fused(logits):
        return TF.cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing)
    def reference(logits):
        return F.cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing)
    out, (dlogits,) = grads(fused, logits)
    ref, (rdlogits,) = grads(reference, logits)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dlogits, rdlogits, atol=1e-5, rtol=1e-5)


def test_float64_computes_in_float64_and_passes_gradcheck():
    from torch.autograd import gradcheck
    d = torch.float64
    x = torch.randn(3, 17, dtype=d, requires_grad=True)
    w = torch.randn(17, dtype=d, requires_grad=True)
    b = torch.randn(17, dtype=d, requires_grad=True)
    torch.testing.assert_close(TF.rms_norm(x, (17,), w, 1e-6), F.rms_norm(x, (17,), w, 1e-6),
                               atol=1e-12, rtol=1e-12)
    assert gradcheck(lambda x, w: TF.rms_norm(x, (17,), w, 1e-6), (x, w))
    assert gradcheck(lambda x, w, b: TF.layer_norm(x, (17,), w, b), (x, w, b))
    assert gradcheck(TF.swiglu, (x, b.expand(3, 17).detach().clone().requires_grad_()))
    target = torch.tensor([1, -100, 16])
    for reduction in ("none", "mean", "sum"):
        assert gradcheck(lambda x: TF.cross_entropy(x, target, reduction=reduction,
                                                    label_smoothing=0.1), (x,))
