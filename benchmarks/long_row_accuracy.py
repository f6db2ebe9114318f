"""Relative error against float64 of long-row reductions on the CPU target,
tilefuse f32 side by side with PyTorch's f32, for one row of n elements:
RMSNorm's normalization factor (rstd), a row sum and a cross-entropy loss;
and a column sum over n / 16 rows of 16. Inputs are U(0.5, 1.5) (logits
(x - 1) * 8), so no cancellation hides the accumulation error.

    .venv/bin/python benchmarks/long_row_accuracy.py [--max-log2 26]
"""

import argparse

import torch

import tilefuse
import tilefuse.functional as TF


@tilefuse.fusion
def row_sum(x):
    return tilefuse.sum(x)


@tilefuse.fusion
def column_sum(x):
    return tilefuse.sum(x, dim=0)


def relative_error(value, exact) -> float:
    return ((value.double() - exact).abs() / exact.abs()).max().item()


REDUCTIONS = ["rms_norm rstd", "row sum", "cross-entropy loss", "column sum (n/16 rows)"]


def measure(n: int) -> dict[str, tuple[float, float]]:
    """(tilefuse, PyTorch) relative error of each reduction at row length n."""
    x = torch.rand(1, n, generator=torch.Generator().manual_seed(0)) + 0.5
    x64 = x.double()
    exact_rstd = torch.rsqrt(x64.pow(2).mean(-1) + 1e-6)
    _, rstd = torch.ops.tilefuse.rms_norm_fwd(x, torch.ones(n), 1e-6)
    logits, target = (x - 1.0) * 8.0, torch.tensor([3])
    exact_loss = torch.nn.functional.cross_entropy(logits.double(), target)
    columns = x.view(-1, 16)
    return {
        "rms_norm rstd": (relative_error(rstd, exact_rstd),
                          relative_error(torch.rsqrt(x.pow(2).mean(-1) + 1e-6), exact_rstd)),
        "row sum": (relative_error(row_sum(x), x64.sum(-1)),
                    relative_error(x.sum(-1), x64.sum(-1))),
        "cross-entropy loss": (relative_error(TF.cross_entropy(logits, target), exact_loss),
                               relative_error(torch.nn.functional.cross_entropy(logits, target),
                                              exact_loss)),
        "column sum (n/16 rows)": (relative_error(column_sum(columns), columns.double().sum(0)),
                                   relative_error(columns.sum(0), columns.double().sum(0))),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-log2", type=int, default=26)
    args = parser.parse_args()
    sizes = [16, 20, 24, 26]
    sizes = [k for k in sizes if k <= args.max_log2]
    results = {k: measure(2**k) for k in sizes}
    print("| reduction | " + " | ".join(f"n = 2^{k}: tilefuse / PyTorch" for k in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name in REDUCTIONS:
        cells = [f"{results[k][name][0]:.1e} / {results[k][name][1]:.1e}" for k in sizes]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
