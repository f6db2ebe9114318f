"""Long rows: every reduction accumulates in blocks (cascade summation), so
its f32 error against float64 stays within 4x PyTorch's own f32 error up to
n = 2^24. The error floor is 2^-24, the rounding of an f32 result itself."""

import pytest
import torch

import tilefuse
import tilefuse.functional as TF

N = 2**24
FLOOR = 2.0**-24


def relative_error(value, exact) -> float:
    return ((value.double() - exact).abs() / exact.abs()).max().item()


def assert_within_4x_of_torch(ours, torchs, exact):
    ours, torchs = relative_error(ours, exact), relative_error(torchs, exact)
    assert ours <= 4 * max(torchs, FLOOR), f"tilefuse {ours:.2e}, PyTorch {torchs:.2e}"


@pytest.fixture(scope="module")
def row():
    generator = torch.Generator().manual_seed(0)
    return torch.rand(1, N, generator=generator) + 0.5  # no cancellation


@tilefuse.fusion
def row_sum(x):
    return tilefuse.sum(x)


@tilefuse.fusion
def column_sum(x):
    return tilefuse.sum(x, dim=0)


def test_rms_norm_factor(row):
    _, rstd = torch.ops.tilefuse.rms_norm_fwd(row, torch.ones(N), 1e-6)
    reference = torch.rsqrt(row.pow(2).mean(-1) + 1e-6)  # what F.rms_norm computes
    exact = torch.rsqrt(row.double().pow(2).mean(-1) + 1e-6)
    assert_within_4x_of_torch(rstd, reference, exact)


def test_row_sum(row):
    assert_within_4x_of_torch(row_sum(row), row.sum(-1), row.double().sum(-1))


def test_cross_entropy_loss(row):
    logits, target = (row - 1.0) * 8.0, torch.tensor([3])
    exact = torch.nn.functional.cross_entropy(logits.double(), target)
    assert_within_4x_of_torch(TF.cross_entropy(logits, target),
                              torch.nn.functional.cross_entropy(logits, target), exact)


def test_column_sum_over_many_rows(row):
    columns = row.view(-1, 16)  # 2^20 rows
    assert_within_4x_of_torch(column_sum(columns), columns.sum(0), columns.double().sum(0))
