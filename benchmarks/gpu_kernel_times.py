"""Kernel times of the built-ins on a GPU, as bandwidth beside the traffic model.

On the GPU machine, after the GPU check (README, "The GPU check"), with the
same bundle and the traffic benchmark's JSON of the same tree:
    python3 benchmarks/gpu_kernel_times.py --bundle .gpu/tilefuse-gpu.tar.xz \
        --model .gpu/traffic.json --out "$OUT"
For each kernel of the traffic table (`tilefuse-bench-traffic`), bf16 and
f32, n in {1000, 4096, 8192, 32000, 128256, 262144} (the norms also at the
hidden sizes 5120, 12288 and 16384) and the model's 8192 rows, it times
the op's own kernels with torch.profiler (the main kernel and its
finalize, summed; helper ATen kernels and host time left out) and
divides the essential bytes (each tensor the op reads or writes, once) by
that time: the measured counterpart of the model's "est. HBM". It writes
kernel_times.md and kernel_times.json, and jit.log (TILEFUSE_LOG=jit: the
PTX JIT's registers and spills per kernel, and the modules the runtime
compiled again asking ptxas for more blocks per SM).
Then the VARIANTS, each in a process of its own with TILEFUSE_TILE set: tiles
the heuristic does not choose, where the traffic model and the one GPU run
so far disagree or a choice was left for a GPU to make.
The model file, here (the traffic benchmark for these kernels and for each
variant under its tile, one JSON):
    .venv/bin/python benchmarks/gpu_kernel_times.py --write-model .gpu/traffic.json
Without a GPU (TILEFUSE_TARGET=emulate: CPU tensors through the PTX
emulator) it runs the same code at tiny shapes, untimed: the dry run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [1000, 4096, 8192, 32000, 128256, 262144]
# Hidden sizes of real models between the table's, for the norms (the
# model puts some of them far below their neighbours: benchmarks/README.md).
NORM_SIZES = [5120, 12288, 16384]
NORMS = ["rms_norm_fwd", "rms_norm_bwd", "layer_norm_fwd", "layer_norm_bwd"]
ROWS = 8192  # the traffic model's rows per launch
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
# HBM peak the model assumes (benchmarks/README.md, "The H200 model"); an
# H100 SXM's for that card.
PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12}


def norm_inputs(rows, n, dtype, device):
    x = torch.randn(rows, n, device=device, dtype=dtype)
    w = torch.randn(n, device=device, dtype=dtype)
    b = torch.randn(n, device=device, dtype=dtype)
    dy = torch.randn(rows, n, device=device, dtype=dtype)
    return x, w, b, dy


# Each kernel: (the prefix of its GPU kernels' names, a function of (rows,
# n, dtype, device) that returns a call of the op and the tensors that call
# reads and writes: its essential bytes).
def rms_norm_fwd(rows, n, dtype, device):
    x, w, _, _ = norm_inputs(rows, n, dtype, device)
    call = lambda: torch.ops.tilefuse.rms_norm_fwd(x, w, 1e-6)
    return call, [x, w, *call()]


def rms_norm_bwd(rows, n, dtype, device):
    x, w, _, dy = norm_inputs(rows, n, dtype, device)
    _, rstd = torch.ops.tilefuse.rms_norm_fwd(x, w, 1e-6)
    call = lambda: torch.ops.tilefuse.rms_norm_bwd(dy, x, w, rstd)
    return call, [dy, x, w, rstd, *call()]


def layer_norm_fwd(rows, n, dtype, device):
    x, w, b, _ = norm_inputs(rows, n, dtype, device)
    call = lambda: torch.ops.tilefuse.layer_norm_fwd(x, w, b, 1e-5)
    return call, [x, w, b, *call()]


def layer_norm_bwd(rows, n, dtype, device):
    x, w, b, dy = norm_inputs(rows, n, dtype, device)
    _, mean, rstd = torch.ops.tilefuse.layer_norm_fwd(x, w, b, 1e-5)
    call = lambda: torch.ops.tilefuse.layer_norm_bwd(dy, x, w, mean, rstd)
    return call, [dy, x, w, mean, rstd, *call()]


def glu(op, *options):
    def make(rows, n, dtype, device):
        a, b, dc = (torch.randn(rows, n, device=device, dtype=dtype) for _ in range(3))
        fn = getattr(torch.ops.tilefuse, op)
        if op.endswith("_fwd"):
            call = lambda: fn(a, b, *options)
            return call, [a, b, call()]
        call = lambda: fn(dc, a, b, *options)
        return call, [dc, a, b, *call()]
    return make


CE_OPTIONS = (-100, 0.0, 0.0, None, 0)  # ignore_index, smoothing, z-loss, softcap, none


def ce_inputs(rows, n, dtype, device):
    logits = torch.randn(rows, n, device=device, dtype=dtype)
    target = torch.randint(0, n, (rows,), device=device)
    return logits, target


def cross_entropy_fwd(rows, n, dtype, device):
    logits, target = ce_inputs(rows, n, dtype, device)
    call = lambda: torch.ops.tilefuse.cross_entropy_fwd(logits, target, None, *CE_OPTIONS)
    loss, z_loss, row_max, log_sum, _ = call()
    return call, [logits, target, loss, z_loss, row_max, log_sum]


def cross_entropy_bwd(rows, n, dtype, device):
    logits, target = ce_inputs(rows, n, dtype, device)
    _, _, row_max, log_sum, mass = torch.ops.tilefuse.cross_entropy_fwd(logits, target, None,
                                                                        *CE_OPTIONS)
    dloss = torch.rand(rows, device=device)
    call = lambda: torch.ops.tilefuse.cross_entropy_bwd(dloss, logits, target, None, row_max,
                                                        log_sum, mass, *CE_OPTIONS)
    return call, [dloss, logits, target, row_max, log_sum, call()]


def cross_entropy_fwd_grad(rows, n, dtype, device):
    # In place: the logits are read and their gradient written over them
    # (the kernel reads what it wrote last time: the same bytes either way).
    logits, target = ce_inputs(rows, n, dtype, device)
    call = lambda: torch.ops.tilefuse.cross_entropy_fwd_grad_(logits, target, None, *CE_OPTIONS)
    loss, z_loss = call()
    return call, [logits, logits, target, loss, z_loss]


def adamw_step(rows, n, dtype, device):
    param, grad, exp_avg = (torch.randn(rows, n, device=device, dtype=dtype) for _ in range(3))
    exp_avg_sq = torch.rand(rows, n, device=device, dtype=dtype)
    call = lambda: torch.ops.tilefuse.adamw_step_(param, grad, exp_avg, exp_avg_sq, step=5,
                                                  lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                                                  weight_decay=0.01)
    call()
    # param and both moments read and written, grad read.
    return call, [param, param, exp_avg, exp_avg, exp_avg_sq, exp_avg_sq, grad]


KERNELS = {
    "rms_norm_fwd": ("rms_norm", rms_norm_fwd),
    "rms_norm_bwd": ("rms_norm", rms_norm_bwd),
    "layer_norm_fwd": ("layer_norm", layer_norm_fwd),
    "layer_norm_bwd": ("layer_norm", layer_norm_bwd),
    "cross_entropy_fwd": ("cross_entropy", cross_entropy_fwd),
    "cross_entropy_bwd": ("cross_entropy", cross_entropy_bwd),
    "cross_entropy_fwd_grad": ("cross_entropy", cross_entropy_fwd_grad),
    "swiglu_fwd": ("swiglu", glu("swiglu_fwd")),
    "swiglu_bwd": ("swiglu", glu("swiglu_bwd")),
    "geglu_fwd": ("geglu", glu("geglu_fwd", 0)),
    "geglu_bwd": ("geglu", glu("geglu_bwd", 0)),
    "adamw_step": ("adamw", adamw_step),
}


# (kernel, dtype, n, tile, why): the tiles a GPU run should time beside the
# heuristic's (TILEFUSE_TILE; the estimates come from the traffic model).
VARIANTS = [
    ("layer_norm_fwd", "bf16", 4096, "threads-per-row=256,rows-per-block=1",
     "rows of 256 threads: 48 registers, 5 blocks per SM (the heuristic's 128 "
     "threads keep 32 elements and the weight and bias: 128 registers)"),
    ("rms_norm_fwd", "bf16", 4096, "row-on-chip=false",
     "the row streamed through shared memory instead of kept in registers"),
    # The twenty-second round's tiles, against the ones they replaced.
    ("rms_norm_bwd", "bf16", 8192, "threads-per-row=512",
     "before 'at most 256 threads': 512 threads of 2 chunks, one block per SM"),
    ("layer_norm_fwd", "bf16", 12288, "threads-per-row=512",
     "before 'at most 256 threads': 512 threads of 3 chunks, 103 registers, "
     "one block per SM"),
    ("layer_norm_bwd", "bf16", 5120, "threads-per-row=512,rows-per-block=1",
     "before 'fewer idle vectors': 512 threads of 2 chunks, 3 of 8 slots of "
     "the second idle"),
    # Since the twenty-ninth round the heuristic streams the backward norms'
    # bf16 rows of 8192 through shared memory, two blocks per SM (TileConfig.h,
    # "a wide row in shared memory"), against the row in registers before.
    ("layer_norm_bwd", "bf16", 8192, "threads-per-row=256,rows-per-block=1,row-on-chip=true",
     "before 'a wide row in shared memory': the row in registers, one block "
     "of 256 threads per SM (191 registers; staged: two blocks, 100)"),
    ("rms_norm_bwd", "bf16", 8192, "threads-per-row=256,rows-per-block=1,row-on-chip=true",
     "before 'a wide row in shared memory': the row in registers, two rows "
     "of 256 threads in one folded block (128 registers; staged: two blocks, 72)"),
    # The twenty-third round's sweep: the model puts this row, kept in
    # registers in one block per SM, far behind one streamed in two (its 3
    # chunks a thread keep the rule from choosing it).
    ("rms_norm_bwd", "bf16", 12288, "threads-per-row=512,rows-per-block=1,row-on-chip=false",
     "streamed, two blocks of 512 threads per SM (54 registers) against the "
     "row in registers: one block of 512 (86)"),
    # The thirty-first round's sweep of rms_norm_bwd at n = 32000: the row in
    # registers of 1024 threads (the model: bf16 66% -> 98%, f32 70% -> 99%,
    # 1.02x and 1.01x the ideal bytes) needs more than the 64 registers such
    # a block allows, and ptxas spills (116 and 536 bytes): only a GPU can
    # say what the spills cost.
    ("rms_norm_bwd", "bf16", 32000, "threads-per-row=1024,rows-per-block=1,row-on-chip=true",
     "the row in registers of 1024 threads (64 registers, 116 bytes of spills) "
     "against streamed rows of 512 (128 registers, 1.19x the ideal bytes)"),
    ("rms_norm_bwd", "f32", 32000, "threads-per-row=1024,rows-per-block=1,row-on-chip=true",
     "the row in registers of 1024 threads (64 registers, 536 bytes of spills) "
     "against streamed rows of 512 (128 registers, 1.44x the ideal bytes)"),
    # The twenty-fifth round's rows of one warp, against the tile before.
    ("cross_entropy_fwd", "bf16", 4096, "threads-per-row=128,rows-per-block=2",
     "before 'one warp a row': 128 threads, 2 rows a block, the row in "
     "registers (64 registers, 4 blocks per SM; one warp: 40, 6)"),
]

# The kernel an op runs where it is not the table's: the layer norm
# backward of f32 rows recenters them (Builtins.cpp, layerNormBackward).
RUNS_AS = {("layer_norm_bwd", "f32"): "layer_norm_bwd_recentered"}


def kernel_microseconds(call, prefix, reps):
    """Mean GPU time of one call's kernels whose names start with `prefix`
    (torch.profiler), the names seen, and the mean time of a call between
    CUDA events around all `reps` (host time and helper kernels included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    total, names = 0.0, set()
    for event in prof.key_averages():
        if event.key.startswith(prefix):
            total += event.self_device_time_total
            names.add(event.key)
    if not names:
        raise RuntimeError(f"no kernel named {prefix}* in the profile: saw "
                           f"{sorted(e.key for e in prof.key_averages())[:8]}")
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(reps):
        call()
    end.record()
    torch.cuda.synchronize()
    return total / reps, sorted(names), begin.elapsed_time(end) * 1e3 / reps


def copy_bytes_per_second():
    """A device-to-device copy of 2 GiB, bytes read and written: what this
    card's memory moves in practice."""
    a = torch.empty(2**30, dtype=torch.int16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 10 * 2 * a.nbytes / (begin.elapsed_time(end) * 1e-3)


def write_model(path, traffic):
    """The traffic model's estimates for KERNELS and VARIANTS (one JSON; a
    variant's cells carry its tile), with the kernel an op runs in place of
    the table's where RUNS_AS says it differs."""
    cells = []
    runs = [(list(KERNELS), "bf16,f32", ",".join(map(str, SIZES)), None),
            (NORMS, "bf16,f32", ",".join(map(str, NORM_SIZES)), None)]
    runs += [([kernel], dtype, str(n), tile) for kernel, dtype, n, tile, _ in VARIANTS]
    runs += [([runs_as], dtype, ",".join(map(str, SIZES + NORM_SIZES)), None)
             for (_, dtype), runs_as in RUNS_AS.items()]
    if not os.access(traffic, os.X_OK):
        sys.exit(f"gpu_kernel_times: no traffic benchmark at {traffic} (--traffic)")
    with tempfile.TemporaryDirectory() as folder:
        for index, (kernels, dtypes, sizes, tile) in enumerate(runs):
            out = os.path.join(folder, f"{index}.json")
            env = dict(os.environ, TILEFUSE_TILE=f"{kernels[0]}:{tile}" if tile else "")
            done = subprocess.run([traffic, f"--kernels={','.join(kernels)}",
                                   f"--dtypes={dtypes}", f"--n={sizes}", f"--json={out}"],
                                  env=env, stdout=subprocess.DEVNULL)
            if done.returncode:  # its JSON holds the cells that ran
                print(f"gpu_kernel_times: {traffic} failed for {kernels} {tile or ''}",
                      file=sys.stderr)
            if os.path.exists(out):
                with open(out) as f:
                    cells += [dict(cell, tile=tile) for cell in json.load(f)]
    # What the op runs (RUNS_AS, run last) under the table's name, in place
    # of the table kernel's cell where it has one.
    table_name = {(runs_as, dtype): kernel for (kernel, dtype), runs_as in RUNS_AS.items()}
    by_cell = {}
    for cell in cells:
        if (cell["kernel"], cell["dtype"]) in table_name:
            cell = dict(cell, kernel=table_name[(cell["kernel"], cell["dtype"])],
                        runs_as=cell["kernel"])
        by_cell[(cell["kernel"], cell["dtype"], cell["n"], cell["tile"])] = cell
    cells = list(by_cell.values())
    with open(path, "w") as f:
        json.dump(cells, f, indent=1)
    print(f"{path}: {len(cells)} cells")


def run_variants(args, report, started, save):
    """Each variant in a child process with TILEFUSE_TILE set (the runtime
    reads it once), within the budget; the report is saved after each, and
    the child's jit.log appended to this one's (stderr on a GPU)."""
    for kernel, dtype, n, tile, why in VARIANTS:
        left = args.budget - (time.monotonic() - started)
        cells = [{"kernel": kernel, "dtype": dtype, "n": n,
                  "error": "not run: the time budget is spent"}]
        if left > 5:
            with tempfile.TemporaryDirectory() as folder:
                source = ["--bundle", args.bundle] if args.bundle else ["--library", args.library]
                try:
                    child = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), *source, "--out", folder,
                         "--kernels", kernel, "--dtypes", dtype, "--sizes", str(n),
                         "--reps", str(args.reps), "--no-variants"],
                        env=dict(os.environ, TILEFUSE_TILE=f"{kernel}:{tile}"),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        timeout=max(30, left))
                    path = os.path.join(folder, "kernel_times.json")
                    if os.path.exists(path):
                        with open(path) as f:
                            cells = json.load(f)["cells"]
                    else:
                        cells[0]["error"] = f"exit {child.returncode}: {child.stdout[-300:]}"
                except subprocess.TimeoutExpired:
                    cells[0]["error"] = f"killed after {max(30, left):.0f} s"
                log = os.path.join(folder, "jit.log")
                if os.path.exists(log):
                    with open(log) as f:
                        sys.stderr.write(f"== variant {kernel} {dtype} {n} {tile}\n{f.read()}")
                    sys.stderr.flush()
        for cell in cells:
            cell.update(tile=tile, why=why)
            report["variants"].append(cell)
            print(json.dumps(cell), flush=True)
        save()


TABLE_HEADER = ["| kernel | dtype | n | kernels us | GB/s | measured | model | call us | kernels |",
                "|---|---|---|---|---|---|---|---|---|"]


def markdown_rows(cells, model):
    lines = []
    for r in cells:
        tile = r.get("tile")
        label = f"{r['kernel']}{f' ({tile})' if tile else ''}"
        if "error" in r:
            error = " ".join(r["error"].split()).replace("|", "/")[:200]
            lines.append(f"| {label} | {r['dtype']} | {r['n']} | | | | | | {error} |")
            continue
        estimate = model.get((r["kernel"], r["dtype"], r["n"], tile))
        lines.append(
            f"| {label} | {r['dtype']} | {r['n']} | {r['kernel_us']:.1f} | "
            f"{r['gb_s']:.0f} | {r['fraction']:.0%} | "
            f"{'' if estimate is None else f'{estimate:.0%}'} | {r['call_us']:.1f} | "
            f"{', '.join(r['kernel_names'])} |")
    return lines


def markdown(report, model):
    lines = [f"# Kernel times: {report['gpu']}", "",
             f"{report['rows']} rows; essential bytes (each tensor the op reads or writes, "
             f"once) over the mean time of the op's own kernels (torch.profiler, "
             f"{report['reps']} calls); % of {report['peak_tb_s']} TB/s; a device-to-device "
             f"copy moved {report['copy_tb_s']} TB/s (read + written). 'model' is "
             f"`tilefuse-bench-traffic`'s estimate for an H200 at the same rows; 'call' the "
             f"mean time of a call between CUDA events (host time and helper kernels "
             f"included).", "", *TABLE_HEADER]
    lines += markdown_rows(report["cells"], model)
    if report["variants"]:
        lines += ["", "Variants (TILEFUSE_TILE, the tile after the kernel's name; the "
                  "heuristic's tile for the same cell is in the table above):", "",
                  *TABLE_HEADER]
        lines += markdown_rows(report["variants"], model)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bundle", help="a bundle made by scripts/gpu_check.py --pack")
    source.add_argument("--library", help="libtilefuse_torch.so")
    source.add_argument("--write-model", metavar="PATH",
                        help="write the traffic model's estimates (here) and exit")
    parser.add_argument("--traffic", default=os.path.join(ROOT, "build", "bin",
                                                          "tilefuse-bench-traffic"))
    parser.add_argument("--out", default=os.environ.get("OUT") or ".")
    parser.add_argument("--model", help="the --write-model file (same tree)")
    parser.add_argument("--kernels", nargs="*", default=list(KERNELS))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    parser.add_argument("--sizes", nargs="*", type=int, help="default: the table's n")
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--budget", type=float, default=240,
                        help="seconds; cells not started by then are left out")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if args.write_model:
        write_model(args.write_model, args.traffic)
        return 0
    started = time.monotonic()
    gpu = torch.cuda.is_available()
    os.makedirs(args.out, exist_ok=True)
    if gpu:
        os.environ.setdefault("TILEFUSE_LOG", "jit")
        jit_log = open(os.path.join(args.out, "jit.log"), "w")
        os.dup2(jit_log.fileno(), sys.stderr.fileno())
    library = args.library
    if args.bundle:
        folder = tempfile.mkdtemp()
        with tarfile.open(args.bundle) as bundle:
            bundle.extractall(folder, filter="data")
        library = os.path.join(folder, "libtilefuse_torch.so")
    torch.ops.load_library(library)
    model = {}
    if args.model:
        with open(args.model) as f:
            model = {(c["kernel"], c["dtype"], c["n"], c.get("tile")): c["hbm_fraction"]
                     for c in json.load(f)}

    device = "cuda" if gpu else "cpu"
    name = torch.cuda.get_device_name() if gpu else "none (dry run)"
    peak = next((v for k, v in PEAK_BYTES_PER_S.items() if k in name), 4.8e12)
    report = {"gpu": name, "rows": ROWS if gpu else 4, "reps": args.reps,
              "peak_tb_s": peak / 1e12,
              "copy_tb_s": round(copy_bytes_per_second() / 1e12, 2) if gpu else None,
              "cells": [], "variants": []}
    for kernel in args.kernels:
        prefix, make = KERNELS[kernel]
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            sizes = args.sizes or SIZES + (NORM_SIZES if kernel in NORMS else [])
            for n in sizes if gpu else [64]:
                cell = {"kernel": kernel, "dtype": dtype_name, "n": n}
                if time.monotonic() - started > args.budget:
                    cell["error"] = "not run: the time budget is spent"
                    report["cells"].append(cell)
                    continue
                call = tensors = None
                try:
                    torch.manual_seed(0)
                    call, tensors = make(report["rows"], n, dtype, device)
                    moved = sum(t.nbytes for t in tensors)
                    if gpu:
                        us, names, call_us = kernel_microseconds(call, prefix, args.reps)
                        cell.update(kernel_us=us, call_us=call_us, kernel_names=names,
                                    gb_s=moved / us / 1e3, fraction=moved / us / 1e-6 / peak)
                    else:
                        call()
                        cell.update(kernel_us=0.0, call_us=0.0, kernel_names=[], gb_s=0.0,
                                    fraction=0.0)
                except Exception as error:  # reported with its cell; the next one runs
                    cell["error"] = f"{type(error).__name__}: {error}"
                del call, tensors
                report["cells"].append(cell)
                print(json.dumps(cell), flush=True)
    def save():
        report["seconds"] = round(time.monotonic() - started, 1)
        with open(os.path.join(args.out, "kernel_times.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "kernel_times.md"), "w") as f:
            f.write(markdown(report, model))

    save()
    if not args.no_variants:
        if gpu:  # what this process cached, for the children
            torch.cuda.empty_cache()
        run_variants(args, report, started, save)
    cells = report["cells"] + report["variants"]
    errors = [c for c in cells if "error" in c]
    print(f"kernel times: {len(cells) - len(errors)}/{len(cells)} cells, "
          f"{report['seconds']} s", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
