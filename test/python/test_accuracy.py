"""Long rows: every reduction accumulates in blocks (cascade summation), so
its f32 error against float64 stays within 4x PyTorch's own f32 error up to
n = 2^24 (benchmarks/long_row_accuracy.py measures it; the README's table is
its output). The error floor is 2^-24, the rounding of an f32 result."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from long_row_accuracy import REDUCTIONS, measure  # noqa: E402

FLOOR = 2.0**-24


@pytest.fixture(scope="module")
def errors():
    return measure(2**24)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_within_4x_of_pytorch_at_n_2_to_the_24(errors, reduction):
    ours, torchs = errors[reduction]
    assert ours <= 4 * max(torchs, FLOOR), f"tilefuse {ours:.2e}, PyTorch {torchs:.2e}"
