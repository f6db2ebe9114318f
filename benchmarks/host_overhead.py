"""Host overhead of a cached call on a tiny input (1 x 8), CPU target.

Each op and its PyTorch eager equivalent run side by side in one process,
their calls interleaved so that both see the same machine; the table gives
the median over many calls and the difference, which is the overhead
tilefuse adds on top of PyTorch's own dispatch. Goal: within 5 us.

    .venv/bin/python benchmarks/host_overhead.py [--calls N] [--json FILE]
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import tilefuse
import tilefuse.functional as TF


@tilefuse.fusion
def softmax(x):
    e = tilefuse.exp(x - tilefuse.max(x))
    return e / tilefuse.sum(e)


def median_us(fused, reference, calls: int) -> tuple[float, float]:
    """Medians of `fused` and `reference`, called alternately."""
    for _ in range(100):
        fused()
        reference()
    samples = ([], [])
    clock = time.perf_counter_ns
    for _ in range(calls):
        for fn, times in ((fused, samples[0]), (reference, samples[1])):
            start = clock()
            fn()
            times.append(clock() - start)
    return statistics.median(samples[0]) / 1e3, statistics.median(samples[1]) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, w, b = torch.randn(1, 8), torch.randn(8), torch.randn(1, 8)
    logits, target = torch.randn(1, 8), torch.tensor([3])
    cases = [
        ("rms_norm", lambda: TF.rms_norm(x, (8,), w, 1e-6), lambda: F.rms_norm(x, (8,), w, 1e-6)),
        ("layer_norm", lambda: TF.layer_norm(x, (8,), w, w), lambda: F.layer_norm(x, (8,), w, w)),
        ("swiglu", lambda: TF.swiglu(x, b), lambda: F.silu(x) * b),
        ("cross_entropy", lambda: TF.cross_entropy(logits, target), lambda: F.cross_entropy(logits, target)),
        ("softmax (DSL)", lambda: softmax(x), lambda: torch.softmax(x, -1)),
    ]
    rows = []
    print(f"{'op (1x8, CPU)':<16} {'tilefuse us':>12} {'torch us':>9} {'overhead us':>12}")
    for name, fused, reference in cases:
        fused_us, torch_us = median_us(fused, reference, args.calls)
        rows.append({"op": name, "tilefuse_us": fused_us, "torch_us": torch_us,
                     "overhead_us": fused_us - torch_us})
        print(f"{name:<16} {fused_us:>12.1f} {torch_us:>9.1f} {fused_us - torch_us:>12.1f}")
    print(f"median of {args.calls} calls each, one thread")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
