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


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 100), (3, 4096)], ids=str)
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


def test_streamed_rows_in_one_pass():
    # n = 32000 f32 streams on both targets: cross-entropy's max and
    # sum(exp(x - max)) run as one online max/sum, layer_norm's mean and
    # variance as Welford/Chan moments (fuse-merge-reductions). Masked
    # vocabularies and rows with a large mean, against float64. (Masked with
    # -1e30: an -inf logit makes the label-smoothing term 0 * inf = NaN even
    # without smoothing; the online max/sum itself is tested with -inf in
    # test_dsl.py.)
    n = 32000
    logits = 4 * torch.randn(4, n, dtype=torch.float64)
    logits[0, n // 2 :] = -1e30
    logits[1, ::3] = -1e30
    logits[2] += 80  # exp(x) would overflow without the running max
    target = torch.tensor([3, 1, n - 1, 17])
    loss = TF.cross_entropy(logits.float(), target, reduction="none")
    torch.testing.assert_close(loss.double(), F.cross_entropy(logits, target, reduction="none"),
                               atol=1e-5, rtol=1e-5)
    # bf16 n = 32000 keeps the row on chip on a GPU (64 elements a thread)
    # and merges there too; the loss is rounded to bf16.
    logits16 = logits.bfloat16()
    loss16 = TF.cross_entropy(logits16, target, reduction="none")
    torch.testing.assert_close(loss16.double(),
                               F.cross_entropy(logits16.double(), target, reduction="none"),
                               atol=0, rtol=2**-8)

    x = torch.randn(3, n, dtype=torch.float64)
    x[1] += 1e4
    x[2] = 3e5 + 0.01 * x[2]
    w, b = 1 + 0.1 * torch.randn(n, dtype=torch.float64), 0.1 * torch.randn(n, dtype=torch.float64)
    x32 = x.float()
    want = F.layer_norm(x32.double(), (n,), w.float().double(), b.float().double())
    error = (TF.layer_norm(x32, (n,), w.float(), b.float()).double() - want).abs().amax(-1)
    torch_error = (F.layer_norm(x32, (n,), w.float(), b.float()).double() - want).abs().amax(-1)
    assert (error <= 4 * torch_error + 1e-5).all(), (error, torch_error)
