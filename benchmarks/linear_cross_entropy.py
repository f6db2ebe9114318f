"""Peak memory and time of tilefuse.functional.linear_cross_entropy against
the unfused F.cross_entropy(hidden @ weight.T, target), forward and backward
(gradients of hidden and weight), on the CPU.

Each (case, method) runs alone in a fresh process. Peak memory is what the
step adds to the process's resident memory: the high-water mark of the
resident set (getrusage ru_maxrss, which sees every allocation, ATen's
included) minus the resident set just before the step, with the inputs
allocated and the kernels compiled by a warm-up on 8 tokens. Both methods
allocate the weight's gradient (vocab x hidden) in it. Time is one step's
wall clock, measured side by side in the same run.

    .venv/bin/python benchmarks/linear_cross_entropy.py                # every case
    .venv/bin/python benchmarks/linear_cross_entropy.py --tokens 4096 --vocab 32000
    .venv/bin/python benchmarks/linear_cross_entropy.py --unfused-dtype bfloat16 ...

A case whose unfused step would not fit in the memory available now is
skipped with its estimate (the [tokens, vocab] logits, their log-softmax and
their gradient: three copies, as measured at smaller sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

GIB = 1 << 30


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def child(method: str, tokens: int, hidden_size: int, vocab: int, dtype_name: str) -> None:
    """One step of `method`; prints its time and memory as JSON."""
    import gc

    import torch
    import torch.nn.functional as F

    import tilefuse.functional as TF

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, dtype=dtype, requires_grad=True)
    weight = (torch.randn(vocab, hidden_size) * hidden_size ** -0.5).to(dtype)
    weight.requires_grad_(True)
    target = torch.randint(0, vocab, (tokens,))

    def step(h, t):
        if method == "fused":
            loss = TF.linear_cross_entropy(h, weight, t)
        else:
            loss = F.cross_entropy(h @ weight.t(), t)
        loss.backward()
        return loss.item()

    step(hidden[:8].detach().requires_grad_(), target[:8])  # compiles, warms up
    weight.grad = None
    gc.collect()
    before = resident_bytes()
    start = time.perf_counter()
    loss = step(hidden, target)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_added": peak - before, "peak_rss": peak,
                      "loss": loss}))


def estimate_unfused(tokens: int, hidden_size: int, vocab: int, itemsize: int) -> int:
    return (3 * tokens * vocab + 2 * vocab * hidden_size + 2 * tokens * hidden_size) * itemsize


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--dtype", default="float32", help="of the fused op")
    parser.add_argument("--unfused-dtype", default=None,
                        help="of the unfused reference (default: --dtype)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", nargs=5, metavar=("METHOD", "T", "H", "V", "DTYPE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        method, tokens, hidden_size, vocab, dtype = args.child
        child(method, int(tokens), int(hidden_size), int(vocab), dtype)
        return 0

    unfused_dtype = args.unfused_dtype or args.dtype
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
    cases = sorted(((t, v) for t in args.tokens for v in args.vocab), key=lambda c: c[0] * c[1])
    results = []
    print(f"hidden {args.hidden}; fused {args.dtype}, unfused {unfused_dtype}; "
          f"torch threads: default; one step (forward + backward) per process\n")
    print("| tokens | vocab | fused: time (s) | unfused: time (s) | time ratio "
          "| fused: peak added (GiB) | unfused: peak added (GiB) | memory ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for tokens, vocab in cases:
        row = {"tokens": tokens, "vocab": vocab, "hidden": args.hidden}
        for method, dtype in (("fused", args.dtype), ("unfused", unfused_dtype)):
            need = estimate_unfused(tokens, args.hidden, vocab, itemsize[dtype])
            if method == "unfused" and need > available_bytes():
                row[method] = {"skipped": f"needs ~{need / GIB:.1f} GiB, "
                                          f"{available_bytes() / GIB:.1f} available"}
                continue
            command = [sys.executable, __file__, "--child", method, str(tokens),
                       str(args.hidden), str(vocab), dtype]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                row[method] = {"failed": done.stderr.strip().splitlines()[-1:]}
                continue
            row[method] = json.loads(done.stdout.strip().splitlines()[-1])
            row[method]["dtype"] = dtype
        results.append(row)
        fused, unfused = row["fused"], row["unfused"]

        def cell(result, key, scale=1.0):
            return f"{result[key] / scale:.2f}" if key in result else \
                next(iter(result.values()), "?")
        ratio_time = ratio_memory = "-"
        if "seconds" in fused and "seconds" in unfused:
            ratio_time = f"{fused['seconds'] / unfused['seconds']:.2f}"
            ratio_memory = f"{fused['peak_added'] / unfused['peak_added']:.3f}"
        print(f"| {tokens} | {vocab} | {cell(fused, 'seconds')} | {cell(unfused, 'seconds')} "
              f"| {ratio_time} | {cell(fused, 'peak_added', GIB)} "
              f"| {cell(unfused, 'peak_added', GIB)} | {ratio_memory} |", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
