"""The CUDA path, on a GPU: built-ins and a DSL fusion against PyTorch.

Skipped where torch sees no CUDA device (as on the CI machine)."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse
import tilefuse.functional as TF
from conftest import assert_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("shape", [(7, 4096), (3, 1000), (256, 8192), (1, 7)], ids=str)
def test_rms_norm_and_grads(shape, dtype):
    x = torch.randn(shape, device="cuda").to(dtype).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda")).to(dtype).requires_grad_(True)
    y = TF.rms_norm(x, (shape[-1],), w, 1e-6)
    ref = F.rms_norm(x.float(), (shape[-1],), w.float(), 1e-6).to(dtype)
    assert_close(y, ref, dtype)
    dx, dw = torch.autograd.grad(y.float().sum(), (x, w))
    rdx, rdw = torch.autograd.grad(ref.float().sum(), (x, w))
    assert_close(dx, rdx, dtype)
    torch.testing.assert_close(dw.float(), rdw.float(), atol=0.5, rtol=5e-2)


@pytest.mark.parametrize("vocab", [32000, 128256])
def test_cross_entropy_long_rows(vocab):
    logits = torch.randn(16, vocab, device="cuda")
    target = torch.randint(0, vocab, (16,), device="cuda")
    torch.testing.assert_close(TF.cross_entropy(logits, target, label_smoothing=0.1),
                               F.cross_entropy(logits, target, label_smoothing=0.1),
                               atol=1e-4, rtol=1e-4)


def test_dsl_softmax():
    @tilefuse.fusion
    def softmax(x):
        e = tilefuse.exp(x - tilefuse.max(x))
        return e / tilefuse.sum(e)

    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    assert_close(softmax(x), torch.softmax(x.float(), -1).bfloat16(), torch.bfloat16)
