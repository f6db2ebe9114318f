"""Every test process caches kernels in its own directory."""

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TILEFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="tilefuse-pytest-"))

import pytest  # noqa: E402
import torch  # noqa: E402
import torch._functorch.config  # noqa: E402

# A custom op whose output aliases an input fails tracing, as on CI:
# PyTorch 2.11 raises there (where $CI is set) and warns elsewhere; 2.12
# raises everywhere.
torch._functorch.config.error_on_custom_op_aliasing = True

# Per-dtype tolerances (atol, rtol) against PyTorch, as Liger states them
# (float64: against a float64 reference).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float64: (1e-12, 1e-12),
}


@pytest.fixture(autouse=True)
def seeded():
    """Every test draws the same inputs on every run (TILEFUSE_TEST_SEED
    changes them, to look for flakiness)."""
    torch.manual_seed(int(os.environ.get("TILEFUSE_TEST_SEED", "0")))


@pytest.fixture(params=[torch.float32, torch.float16, torch.bfloat16],
                ids=["f32", "f16", "bf16"])
def dtype(request):
    return request.param


def assert_close(actual, expected, dtype, equal_nan=False):
    """Within `dtype`'s tolerance (compared in float64 for float64, else in
    float32); with `equal_nan`, NaN matches NaN."""
    atol, rtol = TOLERANCES[dtype]
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    torch.testing.assert_close(actual.to(wide), expected.to(wide), atol=atol, rtol=rtol,
                               equal_nan=equal_nan)


def float64_grads(fn, *tensors, upstream=None):
    """fn's output and input gradients computed in float64 from `tensors`
    (as stored: a bf16 input is its exact value), for an `upstream`
    gradient of fn's output. The reference when PyTorch's own low-precision
    result is the less accurate side."""
    leaves = [t.detach().double().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    if upstream is None:
        return out.detach(), []
    out.backward(upstream.double())
    return out.detach(), [leaf.grad for leaf in leaves]


def assert_compiled_matches_eager(model, make_inputs, rows=(2, 5)):
    """torch.compile(model, fullgraph=True) (no graph break, dynamic row
    count) gives eager's value and gradient of its first input, for inputs
    make_inputs(rows)."""
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for count in rows:
        inputs = make_inputs(count)
        got, want = compiled(*inputs), model(*inputs)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got, inputs[0]),
                                   torch.autograd.grad(want, inputs[0]))


def run_python(script: str, **env: str) -> subprocess.CompletedProcess:
    """Runs `script` in a fresh interpreter, `env` added to the environment."""
    return subprocess.run([sys.executable, "-c", script], env=dict(os.environ, **env),
                          capture_output=True, text=True)
