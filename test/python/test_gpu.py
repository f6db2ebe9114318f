"""The CUDA path, on a GPU: built-ins and a DSL fusion against PyTorch.

Skipped where torch sees no CUDA device (as on the CI machine)."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse
import tilefuse.functional as TF
from conftest import assert_close, run_python

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


@pytest.mark.parametrize("rows", [1, 5000])
def test_layer_norm_column_reductions(rows):
    x = torch.randn(rows, 1024, device="cuda", requires_grad=True)
    w = torch.randn(1024, device="cuda", requires_grad=True)
    b = torch.randn(1024, device="cuda", requires_grad=True)
    dy = torch.randn(rows, 1024, device="cuda")
    fused = torch.autograd.grad(TF.layer_norm(x, (1024,), w, b), (x, w, b), dy)
    reference = torch.autograd.grad(F.layer_norm(x, (1024,), w, b), (x, w, b), dy)
    for got, want in zip(fused, reference):
        torch.testing.assert_close(got, want, atol=1e-3 * max(1, rows ** 0.5), rtol=1e-3)


def test_adamw_step_on_gpu():
    param = torch.randn(64, 4096, device="cuda")
    reference = param.clone().requires_grad_(True)
    optimizer = torch.optim.AdamW([reference], lr=1e-3, weight_decay=0.1)
    exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
    for step in range(1, 3):
        grad = torch.randn_like(param)
        reference.grad = grad.clone()
        optimizer.step()
        TF.adamw_step_(param, grad, exp_avg, exp_avg_sq, lr=1e-3, weight_decay=0.1, step=step)
    torch.testing.assert_close(param, reference.detach(), atol=1e-6, rtol=1e-5)


def test_rms_norm_modes_geglu_and_mixed_adamw_on_gpu():
    x = torch.randn(8, 4096, device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda")  # an f32 weight with a bf16 input
    y = TF.rms_norm(x, 4096, w, 1e-6, casting_mode="llama")
    hidden = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6)
    assert y.dtype == torch.float32
    assert_close(y, w * hidden.bfloat16(), torch.bfloat16)
    b = torch.randn_like(x)
    assert_close(TF.geglu(x, b, "tanh"), F.gelu(x.float(), approximate="tanh") * b.float(),
                 torch.bfloat16)
    # bf16 parameters with f32 state, amsgrad and maximize, a tensor lr.
    param, grad = torch.randn(64, 4096, device="cuda").bfloat16(), torch.randn_like(x[:1])
    state = [torch.zeros(64, 4096, device="cuda") for _ in range(3)]
    TF.adamw_step_(param, grad.expand(64, 4096).contiguous(), *state,
                   lr=torch.tensor(1e-3, device="cuda"), step=1, amsgrad=True, maximize=True)
    torch.testing.assert_close(state[0], -0.1 * grad.float().expand(64, 4096))
    torch.testing.assert_close(state[2], state[1])


def test_launches_on_the_current_stream():
    x = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = TF.swiglu(x, x)
    side.synchronize()
    torch.testing.assert_close(y, F.silu(x) * x)


def test_a_fresh_thread_gets_a_context():
    import threading
    x = torch.randn(8, 256, device="cuda")
    results = []
    thread = threading.Thread(target=lambda: results.append(TF.swiglu(x, x)))
    thread.start()
    thread.join()
    torch.testing.assert_close(results[0], F.silu(x) * x)


def test_target_cpu_refuses_cuda_tensors(tmp_path):
    script = ("import torch, tilefuse\n"
              "x = torch.ones(2, 8, device='cuda')\n"
              "tilefuse.functional.swiglu(x, x)\n")
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET="cpu")
    assert done.returncode != 0
    assert "tilefuse.swiglu: TILEFUSE_TARGET=cpu needs CPU tensors" in done.stderr
