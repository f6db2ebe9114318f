"""The GPU check: numerics and bandwidth of the built-ins on a CUDA device.

The device machine has PyTorch but no LLVM/MLIR, so tilefuse._C cannot be
imported there. `prepare` (here) compiles the kernels to PTX with their
interfaces into a folder; `run` (on the device, with only torch) loads them
with scripts/cuda_launcher.py, launches them on CUDA tensors, compares them with
PyTorch and times them side by side:

    .venv/bin/python scripts/gpu_check.py prepare --out .gpu-check
    python3 scripts/gpu_check.py run --kernels .gpu-check        # on the device
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (built-in, n values) checked; dtypes bf16 and f32 for each.
CASES = [("rms_norm_fwd", [4096, 8192]), ("rms_norm_bwd", [4096, 8192]),
         ("layer_norm_fwd", [4096, 8192]), ("layer_norm_bwd", [4096]),
         ("swiglu_fwd", [4096, 14336]), ("geglu_tanh_fwd", [14336]),
         ("cross_entropy_fwd", [32000, 128256]),
         ("adamw_step", [4096])]


def prepare(out: str, chip: str) -> None:
    from tilefuse import _C

    os.makedirs(out, exist_ok=True)
    for name, sizes in CASES:
        for dtype in ("bf16", "f32"):
            for n in sizes:
                kernel = _C.builtin(name).compile_gpu(dtype, n, True, chip)
                stem = f"{name}.{dtype}.{n}"
                with open(os.path.join(out, stem + ".ptx"), "wb") as f:
                    f.write(kernel.ptx)
                with open(os.path.join(out, stem + ".json"), "w") as f:
                    json.dump({"name": kernel.name, "n": kernel.n, "dtype": dtype,
                               "inputs": kernel.inputs, "outputs": kernel.outputs,
                               "threads_per_row": kernel.threads_per_row,
                               "rows_per_block": kernel.rows_per_block,
                               "blocks_per_sm": kernel.blocks_per_sm,
                               "finalize_name": kernel.finalize_name,
                               "finalize_threads": kernel.finalize_threads}, f)
                print("prepared", stem)


def _load_cuda_module():
    spec = importlib.util.spec_from_file_location(
        "tilefuse_cuda", os.path.join(ROOT, "scripts", "cuda_launcher.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kernel(folder: str, stem: str):
    with open(os.path.join(folder, stem + ".json")) as f:
        info = json.load(f)
    with open(os.path.join(folder, stem + ".ptx"), "rb") as f:
        info["ptx"] = f.read()
    info["inputs"] = [tuple(p) for p in info["inputs"]]
    info["outputs"] = [tuple(p) for p in info["outputs"]]
    return SimpleNamespace(**info)


def run(folder: str, rows: int) -> int:
    import torch
    import torch.nn.functional as F

    cuda = _load_cuda_module()
    torch.manual_seed(0)
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    failures = 0
    print(f"{'kernel':<36} {'max |err|':>10} {'tilefuse us':>12} {'torch us':>9} {'GB/s':>7}")

    def timed(fn, repeat=50):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / repeat

    for name, sizes in CASES:
        for dtype_name, dtype in dtypes.items():
            for n in sizes:
                stem = f"{name}.{dtype_name}.{n}"
                kernel = _kernel(folder, stem)
                r = rows if n <= 16384 else 64
                x = torch.randn(r, n, device="cuda", dtype=dtype)
                w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
                dy = torch.randn(r, n, device="cuda", dtype=dtype)
                args, outputs, reference, moved = _case(name, x, w, dy, torch, F)
                ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
                out_ptrs = [o.data_ptr() for o in outputs]
                row_groups = cuda.row_blocks(kernel, r) * kernel.rows_per_block
                spaces = {i: torch.empty((max(row_groups, 1), n), device="cuda")
                          for i, (_, kind, _) in enumerate(kernel.outputs) if kind == "col"}
                stream = torch.cuda.current_stream().cuda_stream

                def launch():
                    cuda.launch(kernel, ptrs, out_ptrs, r, stream,
                                {i: s.data_ptr() for i, s in spaces.items()})

                launch()
                torch.cuda.synchronize()
                expected = reference()
                error = max((o.float() - e.float()).abs().max().item()
                            for o, e in zip(outputs, expected))
                limit = 1e-3 if dtype == torch.float32 else 6e-2
                failures += error > limit * max(1.0, max(e.float().abs().max().item() for e in expected))
                ours, theirs = timed(launch), timed(reference)
                print(f"{stem:<36} {error:>10.2e} {ours:>12.1f} {theirs:>9.1f} "
                      f"{moved(x.element_size()) / ours / 1e3:>7.0f}")
    print("FAILED" if failures else "all kernels match PyTorch")
    return 1 if failures else 0


def _case(name, x, w, dy, torch, F):
    """(arguments, outputs, reference, bytes moved) for one built-in."""
    r, n = x.shape
    f32 = dict(device="cuda", dtype=torch.float32)
    if name == "rms_norm_fwd":
        y, rstd = torch.empty_like(x), torch.empty(r, **f32)
        return ([x, w, 1e-6, 0.0], [y, rstd],
                lambda: [F.rms_norm(x.float(), (n,), w.float(), 1e-6).to(x.dtype)],
                lambda b: 2 * r * n * b)
    if name == "rms_norm_bwd":
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        dx, dw = torch.empty_like(x), torch.empty_like(w)

        def reference():
            xh = x.float() * rstd[:, None]
            g = dy.float() * w.float()
            return [(rstd[:, None] * (g - xh * (g * xh).mean(-1, keepdim=True))).to(x.dtype)]
        return [dy, x, w, rstd, 0.0], [dx, dw], reference, lambda b: 3 * r * n * b
    if name == "layer_norm_fwd":
        y, mean, rstd = torch.empty_like(x), torch.empty(r, **f32), torch.empty(r, **f32)
        return ([x, w, w, 1e-5], [y, mean, rstd],
                lambda: [F.layer_norm(x.float(), (n,), w.float(), w.float()).to(x.dtype)],
                lambda b: 2 * r * n * b)
    if name == "layer_norm_bwd":
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)

        def reference():
            xh = (x.float() - mean[:, None]) * rstd[:, None]
            g = dy.float() * w.float()
            return [(rstd[:, None] * (g - g.mean(-1, keepdim=True)
                                      - xh * (g * xh).mean(-1, keepdim=True))).to(x.dtype)]
        return [dy, x, w, mean, rstd], [dx, dw, db], reference, lambda b: 3 * r * n * b
    if name == "swiglu_fwd":
        c = torch.empty_like(x)
        return [x, dy], [c], lambda: [(F.silu(x.float()) * dy.float()).to(x.dtype)], \
            lambda b: 3 * r * n * b
    if name == "geglu_tanh_fwd":
        c = torch.empty_like(x)
        return [x, dy], [c], \
            lambda: [(F.gelu(x.float(), approximate="tanh") * dy.float()).to(x.dtype)], \
            lambda b: 3 * r * n * b
    if name == "cross_entropy_fwd":
        target = torch.randint(0, n, (r,), device="cuda")
        loss, lse = torch.empty(r, **f32), torch.empty(r, **f32)
        return ([x, target, -100, 0.1], [loss, lse],
                lambda: [F.cross_entropy(x.float(), target, reduction="none", label_smoothing=0.1)],
                lambda b: r * n * b)
    if name == "adamw_step":
        grad, m, v = dy, torch.zeros_like(x), torch.zeros_like(x)
        p1, m1, v1 = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)

        def reference():
            mm = 0.1 * grad.float()
            vv = 0.001 * grad.float().square()
            return [(x.float() * (1 - 1e-3 * 0.01)
                     - 1e-3 / 0.1 * mm / (vv.sqrt() / (0.001 ** 0.5) + 1e-8)).to(x.dtype)]
        # Step 1 of lr 1e-3, betas (0.9, 0.999), weight decay 0.01: the
        # scalars the host computes (grad_sign, decay, lerp_weight, beta2,
        # one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size).
        scalars = [1.0, 1 - 1e-3 * 0.01, 0.1, 0.999, 0.001, 0.001 ** 0.5, 1e-8, -1e-3 / 0.1]
        return ([x, grad, m, v, *scalars], [p1, m1, v1], reference,
                lambda b: 7 * r * n * b)
    raise ValueError(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare")
    p.add_argument("--out", default=os.path.join(ROOT, ".gpu-check"))
    p.add_argument("--chip", default="sm_90")
    r = commands.add_parser("run")
    r.add_argument("--kernels", default=os.path.join(ROOT, ".gpu-check"))
    r.add_argument("--rows", type=int, default=4096)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.out, args.chip)
        return 0
    return run(args.kernels, args.rows)


if __name__ == "__main__":
    sys.exit(main())
