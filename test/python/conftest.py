"""Every test process caches kernels in its own directory."""

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TILEFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="tilefuse-pytest-"))

import pytest  # noqa: E402
import torch  # noqa: E402

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


def assert_close(actual, expected, dtype):
    """Within `dtype`'s tolerance; NaN matches NaN and an infinity the same
    infinity."""
    atol, rtol = TOLERANCES[dtype]
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    torch.testing.assert_close(actual.to(wide), expected.to(wide), atol=atol, rtol=rtol,
                               equal_nan=True)


def run_python(script: str, **env: str) -> subprocess.CompletedProcess:
    """Runs `script` in a fresh interpreter, `env` added to the environment."""
    return subprocess.run([sys.executable, "-c", script], env=dict(os.environ, **env),
                          capture_output=True, text=True)
