"""The GPU check: tilefuse on a GPU machine that has only PyTorch.

It loads the self-contained libtilefuse_torch.so (`scripts/build.sh --static`:
LLVM and MLIR linked in) with `torch.ops.load_library` -- no tilefuse
package, no LLVM on the machine -- so what runs is the product's own path:
the tilefuse:: ops, compile on first use, the kernel cache, the CUDA driver.
Groups of checks, each in its own process (a device fault is reported with
the case that caused it, and the group goes on from the next case):

  numerics:OP  every built-in, forward and backward, every output (finalize
               results, rstd/mean/lse, the AdamW moments), f32/f16/bf16, each
               n, aligned and misaligned; tilefuse and PyTorch (same device,
               same dtype) both measured against float64
  autograd     the public ops' forward and backward through autograd
  dsl          fusions from fuse IR text (register_fusion): results, first-
               call compile time, memory-cache hits; dsl-disk: a fresh process
               loading them from the disk cache without compiling
  bandwidth    effective GB/s at realistic sizes beside PyTorch eager,
               torch.compile (inductor) and Liger-Kernel (when importable)
  overhead     host time per cached call against PyTorch eager
  ablation     a small Llama-style training step: torch.amp bf16 alone,
               + fused optimizer, + fused norms, + everything

It writes gpu_check.json and gpu_check.md under --out ($OUT on the device)
and ends with one line: `VERDICT: PASS|FAIL ...`.

On the GPU machine (README, "The GPU check"):
    python3 scripts/gpu_check.py --bundle .gpu/tilefuse-gpu.tar.xz --out "$OUT"
Here, packing that bundle from build-static/lib:
    .venv/bin/python scripts/gpu_check.py --pack
and the dry run (CPU tensors through the PTX emulator, small shapes, no
timings; a CTest of the static build):
    TILEFUSE_TARGET=emulate .venv/bin/python scripts/gpu_check.py --dry-run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = "libtilefuse_torch.so"
# What the bundle holds: the library, libdevice for machines without a CUDA
# toolkit, and the PTX emulator (the dry run's driver) where it was built.
BUNDLE_FILES = (LIBRARY, "libdevice.10.bc", "libtilefuse_emulator.so")
DEFAULT_BUNDLE = os.path.join(ROOT, ".gpu", "tilefuse-gpu.tar.xz")
# The GPU machine gives a call 10 minutes; the check must leave time to
# copy its results back.
GPU_BUDGET_S = 8 * 60 - 30

# ---------------------------------------------------------------------------
# The plan: what runs where
# ---------------------------------------------------------------------------

GPU_SIZES = [1, 7, 1000, 4096, 8192, 12288, 32000, 128256, 262144]
DRY_SIZES = [1, 7, 1000]


def rows_for(n: int, dry: bool) -> int:
    """Rows of a numerics case: enough to spread column reductions over many
    row groups, few enough that a case stays small."""
    if dry:
        return 5
    return min(997, max(7, (1 << 23) // n))


TIMED_GROUPS = ("bandwidth", "overhead", "ablation")


def group_names(ops: list[str]) -> list[str]:
    # The longest, bandwidth, last: if the time budget runs out, it is cut.
    return [f"numerics:{op}" for op in ops] + ["autograd", "dsl", "dsl-disk",
                                               "overhead", "ablation", "bandwidth"]


# ---------------------------------------------------------------------------
# Child side: the library, tensors, comparisons
# ---------------------------------------------------------------------------


def load_library(path: str) -> float:
    """Loads the library; the seconds it took. The process must not map a
    shared LLVM or MLIR: the library is self-contained."""
    import torch

    start = time.perf_counter()
    torch.ops.load_library(path)
    seconds = time.perf_counter() - start
    with open("/proc/self/maps") as maps:
        shared = {line.split()[-1] for line in maps
                  if "libLLVM" in line or "libMLIR" in line}
    if shared:
        sys.exit(f"gpu_check: loading {path} mapped {sorted(shared)}")
    return seconds


def vector_elements(dtype) -> int:
    import torch

    return 16 // torch.empty((), dtype=dtype).element_size()


def tensor(shape, dtype, device, aligned: bool, fill):
    """A contiguous tensor whose data starts 16-byte aligned or one element
    past it (so that tilefuse picks its misaligned specialization)."""
    import torch

    numel = math.prod(shape)
    base = torch.empty(numel + 16, dtype=dtype, device=device)
    offset = 0 if aligned else 1
    view = base[offset:offset + numel].view(shape)
    view.copy_(fill(shape).to(dtype))
    return view


ULP_LIMIT = 4  # ulps of the output dtype, relative to max(|ref|, rms(ref))


def error_ulps(value, reference, dtype, floor=0.0) -> float:
    """Largest error of `value` against the float64 `reference`, in ulps of
    `dtype`, each element scaled by max(|reference|, rms(reference), floor):
    an element near zero after cancellation is judged at the scale of its
    terms (`floor`, broadcast against the reference, where the rms does not
    say it). Mismatched non-finite values count as infinite error."""
    import torch

    value, reference = value.detach().double(), reference.detach().double()
    floor = torch.as_tensor(floor, dtype=torch.float64, device=reference.device)
    floor = floor.expand_as(reference)
    finite = torch.isfinite(reference)
    if not torch.equal(finite, torch.isfinite(value)):
        return math.inf
    if not finite.any():
        return 0.0
    ref, val = reference[finite], value[finite]
    scale = torch.maximum(ref.abs(), ref.square().mean().sqrt())
    scale = torch.maximum(scale, floor[finite]).clamp_min(torch.finfo(dtype).tiny)
    return float(((val - ref).abs() / scale).max()) / torch.finfo(dtype).eps


def judge(output: str, ours, theirs, reference, floor=0.0) -> dict:
    """One output's verdict: tilefuse within ULP_LIMIT ulps of float64, or no
    worse than twice PyTorch's own error (where PyTorch's low-precision
    result is itself that far off)."""
    dtype = ours.dtype
    ours_ulps = error_ulps(ours, reference, dtype, floor)
    torch_ulps = error_ulps(theirs.to(dtype), reference, dtype, floor)
    limit = max(ULP_LIMIT, 2 * torch_ulps)
    return {"output": output, "dtype": str(dtype).removeprefix("torch."),
            "tilefuse_ulps": round(ours_ulps, 2), "torch_ulps": round(torch_ulps, 2),
            "ok": ours_ulps <= limit}


def f64(*tensors):
    return [t.detach().double().requires_grad_(t.requires_grad) for t in tensors]


def grads(outputs, inputs, upstream):
    import torch

    return torch.autograd.grad(outputs, inputs, upstream)


# Each numerics case: the built-in's fwd and bwd ops on tensors of `dtype`,
# PyTorch's own ops on the same tensors, and float64 references. Returns
# [(output name, tilefuse, pytorch, float64)].


def case_rms_norm(rows, n, dtype, device, aligned, torch, F):
    ops = torch.ops.tilefuse
    make = lambda fill, shape=(rows, n): tensor(shape, dtype, device, aligned, fill)
    x = make(lambda s: torch.randn(s))
    w = make(lambda s: 1 + 0.1 * torch.randn(s), (n,))
    dy = make(lambda s: torch.randn(s))
    eps = 1e-6
    y, rstd = ops.rms_norm_fwd(x, w, eps)
    dx, dw = ops.rms_norm_bwd(dy, x, w, rstd)

    xt, wt = (t.detach().clone().requires_grad_() for t in (x, w))
    yt = F.rms_norm(xt, (n,), wt, eps)
    dxt, dwt = grads(yt, (xt, wt), dy)
    rstdt = torch.rsqrt(x.float().square().mean(-1) + eps)

    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    rstd64 = torch.rsqrt(x64.square().mean(-1) + eps)
    y64 = x64 * rstd64[:, None] * w64
    dx64, dw64 = grads(y64, (x64, w64), dy.double())
    dx_terms, dw_terms = norm_gradient_scales(dy, w, rstd64)
    return [("y", y, yt, y64), ("rstd", rstd, rstdt, rstd64),
            ("dx", dx, dxt, dx64, dx_terms), ("dweight", dw, dwt, dw64, dw_terms)]


def norm_gradient_scales(dy, w, rstd):
    """The size of the terms a norm's dx and dweight sum (xhat is of size 1
    by construction): what their error is judged against where the terms
    cancel (n = 1 above all)."""
    dy64 = dy.double()
    return rstd.detach()[:, None] * (dy64 * w.double()).abs(), dy64.abs().sum(0)


def case_layer_norm(rows, n, dtype, device, aligned, torch, F):
    ops = torch.ops.tilefuse
    make = lambda fill, shape=(rows, n): tensor(shape, dtype, device, aligned, fill)
    x = make(lambda s: 0.5 + torch.randn(s))
    w = make(lambda s: 1 + 0.1 * torch.randn(s), (n,))
    b = make(lambda s: 0.1 * torch.randn(s), (n,))
    dy = make(lambda s: torch.randn(s))
    eps = 1e-5
    y, mean, rstd = ops.layer_norm_fwd(x, w, b, eps)
    dx, dw, db = ops.layer_norm_bwd(dy, x, w, mean, rstd)

    xt, wt, bt = (t.detach().clone().requires_grad_() for t in (x, w, b))
    yt, meant, rstdt = torch.ops.aten.native_layer_norm(xt, (n,), wt, bt, eps)
    dxt, dwt, dbt = grads(yt, (xt, wt, bt), dy)

    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64, mean64, rstd64 = torch.ops.aten.native_layer_norm(x64, (n,), w64, b64, eps)
    dx64, dw64, db64 = grads(y64, (x64, w64, b64), dy.double())
    dx_terms, dw_terms = norm_gradient_scales(dy, w, rstd64.view(-1))
    return [("y", y, yt, y64), ("mean", mean, meant.view(-1), mean64.view(-1)),
            ("rstd", rstd, rstdt.view(-1), rstd64.view(-1)),
            ("dx", dx, dxt, dx64, dx_terms), ("dweight", dw, dwt, dw64, dw_terms),
            ("dbias", db, dbt, db64)]


def glu_case(op: str, activation: str, *options):
    """silu(a) * b (op "swiglu") or gelu(a) * b (op "geglu", `options`:
    its approximate=0 exact, 1 tanh)."""
    def case(rows, n, dtype, device, aligned, torch, F):
        ops = torch.ops.tilefuse
        act = {"silu": F.silu, "gelu": lambda t: F.gelu(t, approximate="none"),
               "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
        make = lambda: tensor((rows, n), dtype, device, aligned, lambda s: 2 * torch.randn(s))
        a, b, dc = make(), make(), make()
        c = getattr(ops, f"{op}_fwd")(a, b, *options)
        da, db = getattr(ops, f"{op}_bwd")(dc, a, b, *options)

        at, bt = (t.detach().clone().requires_grad_() for t in (a, b))
        ct = act(at) * bt
        dat, dbt = grads(ct, (at, bt), dc)

        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        c64 = act(a64) * b64
        da64, db64 = grads(c64, (a64, b64), dc.double())
        return [("c", c, ct, c64), ("da", da, dat, da64), ("db", db, dbt, db64)]
    return case


def case_cross_entropy(rows, n, dtype, device, aligned, torch, F):
    ops = torch.ops.tilefuse
    logits = tensor((rows, n), dtype, device, aligned, lambda s: 3 * torch.randn(s))
    target = torch.randint(0, n, (rows,), device=device)
    target[::7] = -100  # ignored rows
    dloss = torch.rand(rows, device=device)
    smoothing = 0.1
    # reduction 0 (none): per-row losses; the backward takes per-row dloss.
    loss, _, row_max, log_sum, mass = ops.cross_entropy_fwd(logits, target, None, -100,
                                                            smoothing, 0.0, None, 0)
    dlogits = ops.cross_entropy_bwd(dloss, logits, target, None, row_max, log_sum, mass,
                                    -100, smoothing, 0.0, None, 0)
    lse = row_max + log_sum

    lt = logits.detach().clone().requires_grad_()
    losst = F.cross_entropy(lt, target, reduction="none", label_smoothing=smoothing)
    (dlt,) = grads(losst, (lt,), dloss.to(losst.dtype))
    lset = torch.logsumexp(logits.float(), -1)

    l64 = logits.detach().double().requires_grad_()
    loss64 = F.cross_entropy(l64, target, reduction="none", label_smoothing=smoothing)
    (dl64,) = grads(loss64, (l64,), dloss.double())
    # A row's gradient is dloss * (softmax - smoothed target): its terms
    # are of the size of dloss, however much of it cancels.
    return [("loss", loss, losst, loss64),
            ("lse", lse, lset, torch.logsumexp(l64.detach(), -1)),
            ("dlogits", dlogits, dlt, dl64, dloss.double()[:, None])]


def case_adamw(rows, n, dtype, device, aligned, torch, F):
    make = lambda fill: tensor((rows, n), dtype, device, aligned, fill)
    param = make(lambda s: torch.randn(s))
    grad = make(lambda s: 0.01 * torch.randn(s))
    exp_avg = make(lambda s: 0.01 * torch.randn(s))
    exp_avg_sq = make(lambda s: 1e-4 * torch.rand(s))
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    step = 5

    state64 = [t.double() for t in (param, exp_avg, exp_avg_sq)]
    theirs = [t.detach().clone() for t in (param, exp_avg, exp_avg_sq)]
    torch.ops.tilefuse.adamw_step_(param, grad, exp_avg, exp_avg_sq, step=step, **hyper)

    p, m, v = theirs
    p.grad = grad.clone()
    optimizer = torch.optim.AdamW([p], lr=hyper["lr"], betas=(hyper["beta1"], hyper["beta2"]),
                                  eps=hyper["eps"], weight_decay=hyper["weight_decay"],
                                  foreach=False)
    optimizer.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": m, "exp_avg_sq": v}
    optimizer.step()

    p64, m64, v64 = state64
    g64 = grad.double()
    p64 = p64 * (1 - hyper["lr"] * hyper["weight_decay"])
    m64 = hyper["beta1"] * m64 + (1 - hyper["beta1"]) * g64
    v64 = hyper["beta2"] * v64 + (1 - hyper["beta2"]) * g64 * g64
    bias1, bias2 = 1 - hyper["beta1"] ** step, 1 - hyper["beta2"] ** step
    p64 = p64 - hyper["lr"] / bias1 * m64 / ((v64 / bias2).sqrt() + hyper["eps"])
    return [("param", param, p, p64), ("exp_avg", exp_avg, m, m64),
            ("exp_avg_sq", exp_avg_sq, v, v64)]


# Each built-in's numerics group: its case and the op it needs (a library
# without that op, older or newer, leaves the group out and says so).
CASES = {"rms_norm": (case_rms_norm, "rms_norm_fwd"),
         "layer_norm": (case_layer_norm, "layer_norm_fwd"),
         "swiglu": (glu_case("swiglu", "silu"), "swiglu_fwd"),
         "geglu": (glu_case("geglu", "gelu", 0), "geglu_fwd"),
         "geglu_tanh": (glu_case("geglu", "gelu_tanh", 1), "geglu_fwd"),
         "cross_entropy": (case_cross_entropy, "cross_entropy_fwd"),
         "adamw": (case_adamw, "adamw_step_")}


def numerics_cases(op: str, dry: bool, device: str):
    import torch

    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    for dtype in dtypes:
        for n in DRY_SIZES if dry else GPU_SIZES:
            alignments = [True, False] if n % vector_elements(dtype) == 0 else [False]
            for aligned in alignments:
                name = f"{op} {str(dtype).removeprefix('torch.')} n={n} " \
                       f"{'aligned' if aligned else 'misaligned'}"

                def run(dtype=dtype, n=n, aligned=aligned):
                    import torch.nn.functional as F

                    torch.manual_seed(n)
                    rows = rows_for(n, dry)
                    compiles = torch.ops.tilefuse.compile_count()
                    outputs = CASES[op][0](rows, n, dtype, device, aligned, torch, F)
                    checks = [judge(*output) for output in outputs]
                    return {"rows": rows, "checks": checks,
                            "compiles": torch.ops.tilefuse.compile_count() - compiles,
                            "ok": all(check["ok"] for check in checks)}
                yield name, run


def autograd_cases(dry: bool, device: str):
    """The public ops with autograd: gradients reach the inputs through the
    fused backward kernels."""
    import torch
    import torch.nn.functional as F

    ops = torch.ops.tilefuse
    rows, n = (4, 64) if dry else (512, 4096)

    def check(name, ours_fn, theirs_fn, make_inputs):
        def run():
            torch.manual_seed(0)
            inputs = make_inputs()
            results = []
            for fn in (ours_fn, theirs_fn, theirs_fn):
                leaves = [t.detach().clone().requires_grad_(t.is_floating_point())
                          for t in inputs]
                if fn is theirs_fn and len(results) == 2:
                    leaves = [t.double() if t.is_floating_point() else t for t in leaves]
                    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in leaves]
                out = fn(*leaves)
                out.sum().backward()
                results.append([out] + [t.grad for t in leaves if t.is_floating_point()])
            ours, theirs, reference = results
            checks = [judge(f"{name}[{i}]", o, t, r)
                      for i, (o, t, r) in enumerate(zip(ours, theirs, reference))]
            return {"checks": checks, "ok": all(c["ok"] for c in checks)}
        return name, run

    bf16 = torch.bfloat16
    randn = lambda *s: torch.randn(*s, device=device, dtype=bf16)
    yield check("rms_norm", lambda x, w: ops.rms_norm(x, [n], w, 1e-6),
                lambda x, w: F.rms_norm(x, (n,), w, 1e-6), lambda: [randn(rows, n), randn(n)])
    yield check("layer_norm", lambda x, w, b: ops.layer_norm(x, [n], w, b, 1e-5),
                lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5),
                lambda: [randn(rows, n), randn(n), randn(n)])
    yield check("swiglu", lambda a, b: ops.swiglu(a, b), lambda a, b: F.silu(a) * b,
                lambda: [randn(rows, n), randn(rows, n)])
    target = torch.randint(0, n, (rows,), device=device)
    yield check("cross_entropy", lambda x, t: ops.cross_entropy(x, t),
                lambda x, t: F.cross_entropy(x, t), lambda: [randn(rows, n), target])


# DSL fusions as fuse IR text: what `@tilefuse.fusion` traces for softmax, a
# column reduction and a fusion with several outputs (test/python/test_dsl.py).
DSL_FUSIONS = {
    "softmax": """
fuse.kernel @softmax(%x: !fuse.full<f32>) -> (out: !fuse.full<f32>) {
  %0 = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
  %1 = fuse.broadcast %0 : !fuse.row<f32> to !fuse.full<f32>
  %2 = fuse.sub %x, %1 : !fuse.full<f32>
  %3 = fuse.exp %2 : !fuse.full<f32>
  %4 = fuse.reduce sum %3 : !fuse.full<f32> to !fuse.row<f32>
  %5 = fuse.broadcast %4 : !fuse.row<f32> to !fuse.full<f32>
  %6 = fuse.div %3, %5 : !fuse.full<f32>
  fuse.yield %6 : !fuse.full<f32>
}""",
    "scaled_column_sum": """
fuse.kernel @scaled_column_sum(%x: !fuse.full<f32>, %w: !fuse.col<f32>) -> (out: !fuse.col<f32>) {
  %0 = fuse.broadcast %w : !fuse.col<f32> to !fuse.full<f32>
  %1 = fuse.mul %x, %0 : !fuse.full<f32>
  %2 = fuse.reduce sum %1 : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %2 : !fuse.col<f32>
}""",
    "moments": """
fuse.kernel @moments(%x: !fuse.full<f32>, %eps: !fuse.scalar<f32>) -> (normalized: !fuse.full<f32>, mean: !fuse.row<f32>, var: !fuse.row<f32>) {
  %0 = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
  %1 = fuse.broadcast %0 : !fuse.row<f32> to !fuse.full<f32>
  %2 = fuse.sub %x, %1 : !fuse.full<f32>
  %3 = fuse.mul %2, %2 : !fuse.full<f32>
  %4 = fuse.reduce mean %3 : !fuse.full<f32> to !fuse.row<f32>
  %5 = fuse.broadcast %eps : !fuse.scalar<f32> to !fuse.row<f32>
  %6 = fuse.add %4, %5 : !fuse.row<f32>
  %7 = fuse.rsqrt %6 : !fuse.row<f32>
  %8 = fuse.broadcast %7 : !fuse.row<f32> to !fuse.full<f32>
  %9 = fuse.mul %2, %8 : !fuse.full<f32>
  fuse.yield %9, %0, %4 : !fuse.full<f32>, !fuse.row<f32>, !fuse.row<f32>
}""",
}


def dsl_references(name, x, w, torch):
    """PyTorch's result in x's dtype and the float64 reference."""
    if name == "softmax":
        return [(torch.softmax(x, -1), torch.softmax(x.double(), -1))]
    if name == "scaled_column_sum":
        return [((x * w).sum(0), (x.double() * w.double()).sum(0))]
    outputs = []
    for t in (x, x.double()):
        mean = t.float().mean(-1) if t.dtype != torch.float64 else t.mean(-1)
        var = (t - mean[:, None]).square().mean(-1) if t.dtype == torch.float64 \
            else t.float().var(-1, unbiased=False)
        normalized = (t - mean[:, None]) * torch.rsqrt(var[:, None] + 1e-5)
        outputs.append([normalized, mean, var])
    return list(zip(*outputs))


def dsl_cases(dry: bool, device: str, disk: bool):
    """Every DSL fusion in every dtype: the first call compiles (or, for
    dsl-disk, loads from the disk cache the dsl group filled), later calls
    hit the memory cache."""
    import torch

    ops = torch.ops.tilefuse
    rows, n = (6, 40) if dry else (4096, 4096)
    names = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    for fusion, ir in DSL_FUSIONS.items():
        for storage, dtype in names.items():
            def run(fusion=fusion, ir=ir, storage=storage, dtype=dtype):
                torch.manual_seed(1)
                handle = ops.register_fusion(ir, storage)
                x = torch.randn(rows, n, device=device, dtype=dtype)
                w = torch.randn(n, device=device, dtype=dtype)
                tensors = [x, w] if fusion == "scaled_column_sum" else [x]
                scalars = [1e-5] if fusion == "moments" else []
                compiles = ops.compile_count()
                timings = []
                for _ in range(3):
                    start = time.perf_counter()
                    outputs = ops.launch_fusion(handle, tensors, scalars)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    timings.append(time.perf_counter() - start)
                compiled = ops.compile_count() - compiles
                checks = [judge(f"{fusion}[{i}]", ours, theirs, reference)
                          for i, (ours, (theirs, reference))
                          in enumerate(zip(outputs, dsl_references(fusion, x, w, torch)))]
                # The first call compiles once (several kernels for a column
                # reduction are one compilation); from disk, nothing.
                cache_ok = compiled == (0 if disk else 1)
                return {"checks": checks, "compiles": compiled,
                        "first_call_ms": round(timings[0] * 1e3, 2),
                        "cached_call_ms": round(min(timings[1:]) * 1e3, 3),
                        "ok": cache_ok and all(c["ok"] for c in checks)}
            yield f"{fusion} {storage}{' (disk cache)' if disk else ''}", run


# ---------------------------------------------------------------------------
# Timings (on the GPU; the dry run calls the same code once, untimed)
# ---------------------------------------------------------------------------


def cuda_time_us(fn, repeat=None):
    """Median time of `fn` in microseconds, by CUDA events, after warm-up;
    on the CPU (the dry run) one untimed call and None."""
    import torch

    fn()
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    if repeat is None:  # about 50 ms of work
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        repeat = max(5, min(200, int(0.05 / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(repeat):
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        times.append((begin, end))
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(e) for b, e in times) * 1e3


def rate(moved_bytes, us):
    return None if us is None else round(moved_bytes / us / 1e3, 1)


def liger():
    """Liger-Kernel's functional ops with the signatures used here (0.8.5),
    or why they are not there."""
    try:
        from liger_kernel.transformers.functional import (liger_cross_entropy,
                                                          liger_layer_norm,
                                                          liger_rms_norm,
                                                          liger_swiglu)
    except Exception as error:  # not installed, or no GPU Triton
        return f"{type(error).__name__}: {error}"
    return {"rms_norm": lambda x, w: liger_rms_norm(x, w, 1e-6),
            "layer_norm": lambda x, w, b: liger_layer_norm(x, w, b, 1e-5),
            "swiglu": liger_swiglu,
            "cross_entropy": lambda x, t: liger_cross_entropy(x, t)}


# Sizes of the bandwidth group: working sets far above the H200's 60 MB L2.
BANDWIDTH_SHAPES = {"rms_norm": [(16384, 4096), (16384, 8192)],
                    "layer_norm": [(16384, 4096), (16384, 8192)],
                    "swiglu": [(16384, 14336)],
                    "cross_entropy": [(8192, 32000), (4096, 128256), (4096, 262144)],
                    "adamw": [(8192, 8192)]}


def bandwidth_cases(dry: bool, device: str):
    """Forward, and forward + backward, of each built-in in bf16 beside
    PyTorch eager, torch.compile (inductor; aot_eager in the dry run) and
    Liger-Kernel. Bytes are ideal bytes (each tensor read or written once):
    "effective" GB/s."""
    import torch
    import torch.nn.functional as F

    ops = torch.ops.tilefuse
    liger_ops = liger()
    bf16 = torch.bfloat16
    for op, sizes in BANDWIDTH_SHAPES.items():
        for rows, n in ([(8, 64)] if dry else sizes):
            def run(op=op, rows=rows, n=n):
                if op == "adamw":
                    return adamw_bandwidth(rows, n, device)
                torch.manual_seed(0)
                x = torch.randn(rows, n, device=device, dtype=bf16)
                w = torch.randn(n, device=device, dtype=bf16)
                full = rows * n * 2  # bytes of one [rows, n] bf16 tensor
                if op == "rms_norm":
                    variants = {"tilefuse": lambda x, w: ops.rms_norm(x, [n], w, 1e-6),
                                "eager": lambda x, w: F.rms_norm(x, (n,), w, 1e-6)}
                    args, fwd_bytes, bwd_bytes = [x, w], 2 * full, 3 * full
                elif op == "layer_norm":
                    b = torch.randn(n, device=device, dtype=bf16)
                    variants = {"tilefuse": lambda x, w, b: ops.layer_norm(x, [n], w, b, 1e-5),
                                "eager": lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5)}
                    args, fwd_bytes, bwd_bytes = [x, w, b], 2 * full, 3 * full
                elif op == "swiglu":
                    b = torch.randn(rows, n, device=device, dtype=bf16)
                    variants = {"tilefuse": ops.swiglu, "eager": lambda a, b: F.silu(a) * b}
                    args, fwd_bytes, bwd_bytes = [x, b], 3 * full, 5 * full
                else:
                    target = torch.randint(0, n, (rows,), device=device)
                    variants = {"tilefuse": lambda x, t: ops.cross_entropy(x, t),
                                "eager": lambda x, t: F.cross_entropy(x, t)}
                    args, fwd_bytes, bwd_bytes = [x, target], full, 2 * full
                variants["inductor"] = torch.compile(
                    variants["eager"], backend="aot_eager" if dry else "inductor")
                if isinstance(liger_ops, dict):
                    variants["liger"] = liger_ops[op]
                results = {}
                for name, fn in variants.items():
                    leaves = [a.detach().clone().requires_grad_(a.is_floating_point())
                              for a in args]
                    differentiable = [leaf for leaf in leaves if leaf.requires_grad]
                    try:
                        fwd = cuda_time_us(lambda: fn(*leaves))
                        upstream = torch.ones_like(fn(*leaves))
                        both = cuda_time_us(lambda: torch.autograd.grad(
                            fn(*leaves), differentiable, upstream))
                    except Exception as error:
                        results[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
                        continue
                    results[name] = {
                        "fwd_us": fwd and round(fwd, 1),
                        "fwd_effective_GBps": rate(fwd_bytes, fwd),
                        "fwd_bwd_us": both and round(both, 1),
                        "fwd_bwd_effective_GBps": rate(fwd_bytes + bwd_bytes, both)}
                    del leaves, differentiable
                    if device == "cuda":
                        torch.cuda.empty_cache()
                return {"shape": [rows, n], "dtype": "bf16", "results": results,
                        "liger": "used" if isinstance(liger_ops, dict) else liger_ops,
                        "ok": all("error" not in r for r in results.values())}
            yield f"{op} {rows}x{n}", run


def adamw_bandwidth(rows, n, device):
    """tilefuse.adamw_step_ on one f32 parameter of rows x n against
    torch.optim.AdamW (foreach, fused): 4 tensors read, 3 written."""
    import torch

    def state():
        torch.manual_seed(0)
        p = torch.randn(rows, n, device=device)
        p.grad = torch.randn_like(p)
        return p, torch.zeros_like(p), torch.zeros_like(p)

    p, m, v = state()
    ours = cuda_time_us(lambda: torch.ops.tilefuse.adamw_step_(
        p, p.grad, m, v, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
        weight_decay=0.01, step=1))
    results = {"tilefuse": ours}
    for name, options in {"eager (foreach)": {"foreach": True},
                          "eager (fused)": {"fused": True}}.items():
        p, _, _ = state()
        optimizer = torch.optim.AdamW([p], lr=1e-3, **options)
        results[name] = cuda_time_us(optimizer.step)
    moved = 7 * rows * n * 4
    return {"shape": [rows, n], "dtype": "f32",
            "results": {name: {"step_us": us and round(us, 1),
                               "effective_GBps": rate(moved, us)}
                        for name, us in results.items()},
            "ok": True}


def overhead_cases(dry: bool, device: str):
    """Host time per cached call on a tiny input, tilefuse and PyTorch eager
    interleaved, median of many calls (the GPU queue never fills)."""
    import torch
    import torch.nn.functional as F

    ops = torch.ops.tilefuse
    x = torch.randn(1, 8, device=device)
    w = torch.randn(8, device=device)
    target = torch.zeros(1, dtype=torch.long, device=device)
    softmax = ops.register_fusion(DSL_FUSIONS["softmax"], "f32")
    pairs = {
        "rms_norm": (lambda: ops.rms_norm(x, [8], w, 1e-6),
                     lambda: F.rms_norm(x, (8,), w, 1e-6)),
        "layer_norm": (lambda: ops.layer_norm(x, [8], w, w, 1e-5),
                       lambda: F.layer_norm(x, (8,), w, w, 1e-5)),
        "swiglu": (lambda: ops.swiglu(x, x), lambda: F.silu(x) * x),
        "cross_entropy": (lambda: ops.cross_entropy(x, target),
                          lambda: F.cross_entropy(x, target)),
        "softmax (DSL, launch_fusion)": (lambda: ops.launch_fusion(softmax, [x], []),
                                         lambda: torch.softmax(x, -1)),
    }
    for name, (ours, theirs) in pairs.items():
        def run(ours=ours, theirs=theirs):
            ours(), theirs()
            samples = {"tilefuse": [], "eager": []}
            for _ in range(10 if dry else 2000):
                for key, fn in (("tilefuse", ours), ("eager", theirs)):
                    start = time.perf_counter()
                    fn()
                    samples[key].append(time.perf_counter() - start)
            if dry:
                return {"ok": True}
            torch.cuda.synchronize()
            us = {key: statistics.median(v) * 1e6 for key, v in samples.items()}
            return {"tilefuse_us": round(us["tilefuse"], 2), "eager_us": round(us["eager"], 2),
                    "overhead_us": round(us["tilefuse"] - us["eager"], 2), "ok": True}
        yield name, run


# ---------------------------------------------------------------------------
# The ablation: a small Llama-style model, one training step
# ---------------------------------------------------------------------------


def llama(torch, config, fused_norms, fused_mlp_loss):
    """A Llama-style decoder in plain PyTorch (RMSNorm, rotary-free causal
    attention, SwiGLU MLP, tied-free LM head), random weights."""
    import torch.nn as nn
    import torch.nn.functional as F

    ops = torch.ops.tilefuse
    d, heads, hidden, vocab = config["d"], config["heads"], config["hidden"], config["vocab"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            if fused_norms:
                return ops.rms_norm(x, [d], self.weight, 1e-6)
            return F.rms_norm(x, (d,), self.weight, 1e-6)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.out = nn.Linear(d, d, bias=False)
            self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
            self.down = nn.Linear(hidden, d, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, heads, d // heads).unbind(2)
            attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), is_causal=True)
            x = x + self.out(attn.transpose(1, 2).reshape(b, s, d))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, -1)
            act = ops.swiglu(gate.contiguous(), up.contiguous()) if fused_mlp_loss \
                else F.silu(gate) * up
            return x + self.down(act)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(config["layers"]))
            self.norm = RMSNorm()
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.norm(x)).flatten(0, 1)
            if fused_mlp_loss:
                return ops.cross_entropy(logits, targets.flatten())
            return F.cross_entropy(logits.float(), targets.flatten())

    return Model()


def ablation_cases(dry: bool, device: str):
    import torch

    config = (dict(d=64, heads=4, hidden=128, vocab=128, layers=2, batch=2, seq=16, steps=2)
              if dry else
              dict(d=1024, heads=16, hidden=2816, vocab=32000, layers=8, batch=8, seq=1024,
                   steps=10))
    variants = {"amp bf16": (False, False, False),
                "+ fused optimizer": (True, False, False),
                "+ fused norms": (True, True, False),
                "+ everything (swiglu, cross_entropy)": (True, True, True)}
    losses = {}
    for name, (fused_optimizer, fused_norms, fused_rest) in variants.items():
        def run(name=name, fused_optimizer=fused_optimizer, fused_norms=fused_norms,
                fused_rest=fused_rest):
            torch.manual_seed(0)
            model = llama(torch, config, fused_norms, fused_rest).to(device)
            params = list(model.parameters())
            tokens = torch.randint(0, config["vocab"], (config["batch"], config["seq"]),
                                   device=device)
            targets = tokens.roll(-1, 1)
            if fused_optimizer:
                state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
            else:
                optimizer = torch.optim.AdamW(params, lr=1e-4)
            step_count = [0]

            def step():
                with torch.autocast(device_type=device, dtype=torch.bfloat16):
                    loss = model(tokens, targets)
                loss.backward()
                step_count[0] += 1
                if fused_optimizer:
                    with torch.no_grad():
                        for p, (m, v) in zip(params, state):
                            torch.ops.tilefuse.adamw_step_(
                                p, p.grad, m, v, lr=1e-4, beta1=0.9, beta2=0.999,
                                eps=1e-8, weight_decay=0.01, step=step_count[0])
                else:
                    optimizer.step()
                for p in params:
                    p.grad = None
                return loss.detach()

            first = float(step())
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            for _ in range(config["steps"]):
                last = step()
            float(last)
            elapsed = (time.perf_counter() - start) / config["steps"]
            result = {"first_loss": round(first, 5), "ok": math.isfinite(first)}
            losses[name] = first
            if device == "cuda":
                result["ms_per_step"] = round(elapsed * 1e3, 2)
                result["peak_memory_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            return result
        yield name, run


# ---------------------------------------------------------------------------
# Child process: one group, one line per case
# ---------------------------------------------------------------------------


def group_cases(group: str, dry: bool, device: str):
    if group.startswith("numerics:"):
        return numerics_cases(group.split(":", 1)[1], dry, device)
    return {"autograd": lambda: autograd_cases(dry, device),
            "dsl": lambda: dsl_cases(dry, device, disk=False),
            "dsl-disk": lambda: dsl_cases(dry, device, disk=True),
            "bandwidth": lambda: bandwidth_cases(dry, device),
            "overhead": lambda: overhead_cases(dry, device),
            "ablation": lambda: ablation_cases(dry, device)}[group]()


def child(args) -> int:
    """Runs one group's cases after `--skip` of them, printing each case's
    name before it runs and its result (JSON) after it: the parent knows
    which case a crash interrupted."""
    import torch

    load_library(args.library)
    device = "cpu" if args.dry_run else "cuda"
    for index, (name, run) in enumerate(group_cases(args.group, args.dry_run, device)):
        if index < args.skip:
            continue
        print(f"CASE {index} {name}", flush=True)
        start = time.perf_counter()
        try:
            result = run()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as error:  # a mismatch is reported, not raised
            result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        result["seconds"] = round(time.perf_counter() - start, 3)
        print("RESULT " + json.dumps({"case": name, **result}), flush=True)
        if "error" in result and device == "cuda":
            # A CUDA error can poison the context: the rest in a new process.
            os._exit(RESTART_EXIT)
    return 0


# ---------------------------------------------------------------------------
# Parent process
# ---------------------------------------------------------------------------


# A case that prints nothing for this long is killed (inductor's first
# compile of a bandwidth case is the slowest); the emulator is slower.
CASE_TIMEOUT_S = {False: 150, True: 600}
_log_lock = threading.Lock()
# A child's exit status asking for the rest of its group in a new process.
RESTART_EXIT = 75


def run_group(group: str, args, deadline: float, env: dict) -> list[dict]:
    """Runs `group` in child processes until every case has a result; a case
    whose process died or hung is recorded as a fault (with the process's
    stderr: the driver's PTX JIT log) and the group resumes after it. Every
    child's stderr is kept in gpu_check.log."""
    results: list[dict] = []
    skip = 0
    while True:
        command = [sys.executable, os.path.abspath(__file__), "--child", group,
                   "--library", args.library, "--skip", str(skip)]
        if args.dry_run:
            command.append("--dry-run")
        if deadline - time.monotonic() <= 5:
            results.append({"case": f"{group} (rest)", "ok": False,
                            "error": "not run: the time budget is spent"})
            return results
        started, hung = None, None
        with tempfile.TemporaryFile("w+") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                       text=True, env=env)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=lambda: [lines.put(l) for l in process.stdout] +
                             [lines.put(None)], daemon=True).start()
            try:
                while True:
                    wait = min(deadline - time.monotonic(), CASE_TIMEOUT_S[args.dry_run])
                    try:
                        line = lines.get(timeout=max(wait, 0))
                    except queue.Empty:
                        hung = ("killed: the time budget is spent"
                                if time.monotonic() >= deadline else
                                f"killed: no result in {CASE_TIMEOUT_S[args.dry_run]} s")
                        break
                    if line is None:
                        break
                    if line.startswith("CASE "):
                        _, index, started = line.rstrip("\n").split(" ", 2)
                        skip = int(index)
                    elif line.startswith("RESULT "):
                        results.append(json.loads(line[7:]))
                        print(format_result(group, results[-1]), flush=True)
                        started, skip = None, skip + 1
            finally:
                if process.poll() is None:
                    process.kill()
                process.wait()
            stderr.seek(0)
            log = stderr.read()
        if log:
            with _log_lock, open(os.path.join(args.out, "gpu_check.log"), "a") as f:
                f.write(f"=== {group}, from case {skip} ===\n{log}\n")
        if started is None and hung is None:
            if process.returncode == RESTART_EXIT:
                continue
            if process.returncode == 0:
                return results
        results.append({
            "case": started or f"{group} (loading)", "ok": False,
            "error": hung or f"the process died (exit status {process.returncode})",
            "log": log[-20000:]})
        print(format_result(group, results[-1]), flush=True)
        if log:
            print(log[-20000:], file=sys.stderr, flush=True)
        if started is None or time.monotonic() >= deadline:
            return results
        skip += 1


def format_result(group: str, result: dict) -> str:
    status = "ok  " if result.get("ok") else "FAIL"
    details = []
    for check in result.get("checks", []):
        flag = "" if check["ok"] else " !"
        details.append(f"{check['output']} {check['tilefuse_ulps']}/{check['torch_ulps']}{flag}")
    for key in ("compiles", "first_call_ms", "cached_call_ms", "tilefuse_us", "eager_us",
                "overhead_us", "first_loss", "ms_per_step", "peak_memory_GiB", "error"):
        if key in result:
            details.append(f"{key}={result[key]}")
    return f"{status} [{group}] {result['case']}: " + ", ".join(details)


def environment(library: str) -> dict:
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "library": library, "library_bytes": os.path.getsize(library),
            "target": os.environ.get("TILEFUSE_TARGET", "")}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, sms=properties.multi_processor_count,
                    capability=f"sm_{properties.major}{properties.minor}",
                    cuda=torch.version.cuda)
    return info


def markdown(report: dict) -> str:
    lines = [f"# tilefuse GPU check\n", f"{report['verdict']}\n",
             "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in report["environment"].items()]
    for group, results in report["groups"].items():
        lines += ["", f"## {group}", ""]
        if group.startswith("numerics") or group in ("autograd", "dsl", "dsl-disk"):
            lines += ["| case | ok | output: tilefuse / PyTorch error (ulps vs float64) | notes |",
                      "|---|---|---|---|"]
            for r in results:
                checks = ", ".join(f"{c['output']} {c['tilefuse_ulps']} / {c['torch_ulps']}"
                                   for c in r.get("checks", []))
                notes = ", ".join(f"{k}={r[k]}" for k in
                                  ("compiles", "first_call_ms", "cached_call_ms", "error")
                                  if k in r)
                lines.append(f"| {r['case']} | {'yes' if r['ok'] else '**NO**'} | "
                             f"{checks} | {notes} |")
        elif group == "bandwidth":
            lines += ["| case | variant | fwd us | fwd eff. GB/s | fwd+bwd us "
                      "| fwd+bwd eff. GB/s |", "|---|---|---|---|---|---|"]
            for r in results:
                for name, v in r.get("results", {}).items():
                    cells = [v.get(k, v.get("error", "")) for k in
                             ("fwd_us", "fwd_effective_GBps", "fwd_bwd_us",
                              "fwd_bwd_effective_GBps")]
                    if "step_us" in v:
                        cells = [v["step_us"], v["effective_GBps"], "", ""]
                    lines.append(f"| {r['case']} | {name} | " +
                                 " | ".join("-" if c is None else str(c) for c in cells) + " |")
                if "error" in r:
                    lines.append(f"| {r['case']} | | {r['error']} | | | |")
            liger_status = next((r["liger"] for r in results if "liger" in r), "")
            lines += ["", f"Liger-Kernel: {liger_status}. Bytes are ideal bytes (each tensor "
                      "read or written once), hence \"effective\" GB/s."]
        else:
            keys = [k for k in ("tilefuse_us", "eager_us", "overhead_us", "first_loss",
                                "ms_per_step", "peak_memory_GiB", "error")
                    if any(k in r for r in results)]
            lines += ["| case | ok | " + " | ".join(keys) + " |",
                      "|---|---|" + "---|" * len(keys)]
            for r in results:
                lines.append(f"| {r['case']} | {'yes' if r['ok'] else '**NO**'} | " +
                             " | ".join(str(r.get(k, "")) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def find_library(args) -> str:
    if args.bundle:
        folder = tempfile.mkdtemp(prefix="tilefuse-gpu-")
        with tarfile.open(args.bundle) as bundle:
            bundle.extractall(folder, filter="data")
        return os.path.join(folder, LIBRARY)
    for candidate in (args.library, os.environ.get("TILEFUSE_LIBRARY"),
                      os.path.join(ROOT, "build-static", "lib", LIBRARY)):
        if candidate:
            path = os.path.join(candidate, LIBRARY) if os.path.isdir(candidate) else candidate
            if os.path.isfile(path):
                return os.path.abspath(path)
    sys.exit("gpu_check: no libtilefuse_torch.so: build it (scripts/build.sh --static) "
             "or pass --library / --bundle")


def pack(args) -> int:
    """The bundle the GPU machine gets: the library and what ships beside it,
    xz-compressed (the tree copied there is limited to 64 MiB)."""
    folder = os.path.dirname(find_library(args))
    os.makedirs(os.path.dirname(args.pack_to), exist_ok=True)
    with tarfile.open(args.pack_to, "w:xz", preset=9) as bundle:
        for name in BUNDLE_FILES:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                bundle.add(path, arcname=name)
                print(f"packed {name} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    print(f"{args.pack_to}: {os.path.getsize(args.pack_to) / 2**20:.1f} MiB")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", help="libtilefuse_torch.so or its folder "
                        "(default: $TILEFUSE_LIBRARY, build-static/lib)")
    parser.add_argument("--bundle", help="a bundle made by --pack, unpacked to a temporary folder")
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "gpu-check-out"))
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU tensors (TILEFUSE_TARGET=emulate: through the PTX emulator), "
                             "small shapes, no timings")
    parser.add_argument("--only", nargs="*", help="run only these groups")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="groups that check results run this many at a time")
    parser.add_argument("--pack", action="store_true", help="make the bundle and exit")
    parser.add_argument("--pack-to", default=DEFAULT_BUNDLE)
    parser.add_argument("--child", dest="group", help=argparse.SUPPRESS)
    parser.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.group:
        return child(args)
    args.library = find_library(args)
    if args.pack:
        return pack(args)

    started = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device; use --dry-run here")
    try:
        load_seconds = load_library(args.library)
    except (OSError, RuntimeError) as error:  # e.g. a glibc older than 2.36
        print(f"VERDICT: FAIL: {args.library} does not load: {error}", flush=True)
        return 1
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not args.dry_run:  # the PTX JIT's report of every kernel, in gpu_check.log
        env["TILEFUSE_LOG"] = "compile,jit"
    if os.path.exists(os.path.join(args.out, "gpu_check.log")):
        os.remove(os.path.join(args.out, "gpu_check.log"))
    # A fresh kernel cache: first calls compile, dsl-disk loads from it.
    env["TILEFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tilefuse-cache-")
    info = environment(args.library)
    info["load_library_ms"] = round(load_seconds * 1e3, 1)
    print(json.dumps(info), flush=True)

    present = [op for op, (_, needs) in CASES.items() if hasattr(torch.ops.tilefuse, needs)]
    info["not_in_library"] = [op for op in CASES if op not in present]
    groups = group_names(present)
    if args.only:
        groups = [g for g in groups if g in args.only or g.split(":")[0] in args.only]
    deadline = started + (GPU_BUDGET_S if not args.dry_run else 30 * 60)
    report = {"environment": info, "groups": {}}
    # Checks of results run side by side (they are bound by compilation, on
    # the host); dsl-disk needs the cache dsl filled; timings run alone.
    parallel = [g for g in groups if g not in TIMED_GROUPS and g != "dsl-disk"]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {g: pool.submit(run_group, g, args, deadline, env) for g in parallel}
        for group in parallel:
            report["groups"][group] = futures[group].result()
    for group in groups:
        if group not in report["groups"]:
            report["groups"][group] = run_group(group, args, deadline, env)

    results = [r for group in report["groups"].values() for r in group]
    failed = [r["case"] for r in results if not r.get("ok")]
    faults = sum("log" in r for r in results)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["verdict"] = (
        f"VERDICT: {'FAIL' if failed else 'PASS'}: "
        f"{len(results) - len(failed)}/{len(results)} cases ok, {faults} device faults, "
        f"{'' if not failed else 'failed: ' + '; '.join(failed[:8]) + ('...' if len(failed) > 8 else '') + ', '}"
        f"{'dry run, ' if args.dry_run else ''}{report['seconds']} s")
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(markdown(report))
    print(report["verdict"], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
