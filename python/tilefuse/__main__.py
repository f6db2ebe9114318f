"""The `tilefuse` command (also `python -m tilefuse`): info, cache, demo, ops."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _cache_dir() -> str:
    from . import _C
    return _C.cache_directory() or "(memory only)"


def _cache_entries(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".tfk"))


def info() -> int:
    import torch

    from . import _C, __version__
    directory = _cache_dir()
    entries = _cache_entries(directory)
    size = sum(os.path.getsize(e) for e in entries)
    error = _C.cuda_driver_error()
    print(f"tilefuse {__version__} ({_C.compiler_version()})")
    print("targets: cpu (ORC JIT); sm_80, sm_86, sm_89, sm_90 (PTX through the CUDA driver)")
    kind, chip = _C.target()
    if kind == "emulate":
        state = f"not usable: {error}" if error else "loaded"
        emulated, sms = _C.emulator_device()
        print(f"target: TILEFUSE_TARGET=emulate: CPU tensors run their GPU code "
              f"(PTX for {chip}) in the PTX emulator ({state}; {emulated}, {sms} SMs), "
              "with bounds, race, barrier and uninitialized-register checks")
        print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    else:
        if kind == "cpu":
            print("target: TILEFUSE_TARGET=cpu: CPU tensors only")
        driver = f"not usable: {error}" if error else "loaded"
        print(f"CUDA driver: {driver}; torch {torch.__version__}, "
              f"CUDA available: {torch.cuda.is_available()}")
    print(f"cache: {directory} ({len(entries)} kernels, {size / 1024:.1f} KiB)"
          + ("" if _C.cache_writes_to_disk() else " [read-only: memory only]"))
    return 0


def cache_list() -> int:
    entries = _cache_entries(_cache_dir())
    for entry in entries:
        with open(entry, "rb") as f:
            header = f.read(4096).split(b"\n\n", 1)[0].decode(errors="replace").splitlines()
        fields = dict(line.split("=", 1) for line in header[1:] if "=" in line)
        name = os.path.basename(entry)[:16]
        print(f"{name}  n={fields.get('n', '?'):>7} dtype={fields.get('dtype', '?'):<5} "
              f"target={fields.get('target', '?')} {os.path.getsize(entry)} bytes")
    print(f"{len(entries)} kernels in {_cache_dir()}")
    return 0


def cache_clear() -> int:
    directory = _cache_dir()
    entries = _cache_entries(directory)
    for entry in entries:
        os.remove(entry)
    print(f"removed {len(entries)} kernels from {directory}")
    return 0


def _median_us(fn, synchronize, repeat: int = 50) -> float:
    fn()
    times = []
    for _ in range(repeat):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def ops() -> int:
    """Compiles and runs the built-ins and two DSL fusions against PyTorch."""
    import torch
    import torch.nn.functional as F

    import tilefuse
    from tilefuse import functional as TF

    emulated = tilefuse.emulator.active()
    on_gpu = (torch.cuda.is_available() and not emulated
              and os.environ.get("TILEFUSE_TARGET") != "cpu")
    if on_gpu:
        device, dtype, rows, n, vocab = "cuda", torch.bfloat16, 8192, 4096, 32000
        note = f"GPU ({torch.cuda.get_device_name()})"
        synchronize = torch.cuda.synchronize
    elif emulated:
        device, dtype, rows, n, vocab = "cpu", torch.bfloat16, 32, 1024, 4096
        note = f"PTX emulator ({tilefuse.emulator.device()[0]}; times are the emulator's)"
        synchronize = lambda: None  # noqa: E731
    else:
        device, dtype, rows, n, vocab = "cpu", torch.float32, 256, 1024, 4096
        note = "CPU target" + (" (TILEFUSE_TARGET=cpu)" if torch.cuda.is_available() else "")
        synchronize = lambda: None  # noqa: E731
    torch.manual_seed(0)
    options = dict(device=device, dtype=dtype)
    x, a, g = (torch.randn(rows, n, **options) for _ in range(3))
    w, b = torch.randn(n, **options), torch.randn(n, **options)
    logits = torch.randn(rows, vocab, **options)
    target = torch.randint(0, vocab, (rows,), device=device)

    @tilefuse.fusion
    def softmax(x):
        e = tilefuse.exp(x - tilefuse.max(x))
        return e / tilefuse.sum(e)

    @tilefuse.fusion
    def geglu(a, b):
        return tilefuse.gelu(a, approximate="tanh") * b

    cases = [
        ("rms_norm", lambda: TF.rms_norm(x, (n,), w, 1e-6), lambda: F.rms_norm(x, (n,), w, 1e-6)),
        ("layer_norm", lambda: TF.layer_norm(x, (n,), w, b), lambda: F.layer_norm(x, (n,), w, b)),
        ("swiglu", lambda: TF.swiglu(a, g), lambda: F.silu(a) * g),
        ("cross_entropy", lambda: TF.cross_entropy(logits, target, label_smoothing=0.1),
         lambda: F.cross_entropy(logits, target, label_smoothing=0.1)),
        ("softmax (DSL)", lambda: softmax(x), lambda: torch.softmax(x, -1)),
        ("geglu (DSL)", lambda: geglu(a, g), lambda: F.gelu(a, approximate="tanh") * g),
    ]
    print(f"tilefuse ops on the {note}: {str(dtype).removeprefix('torch.')}, [{rows}, {n}] "
          f"(cross-entropy [{rows}, {vocab}])")
    print(f"{'op':<16} {'first call ms':>13} {'compiled':>9} {'max |err|':>10} "
          f"{'tilefuse us':>12} {'torch us':>9}")
    for name, fused, reference in cases:
        before = tilefuse.compile_count()
        start = time.perf_counter()
        out = fused()
        first = (time.perf_counter() - start) * 1e3
        compiled = tilefuse.compile_count() - before
        error = (out.float() - reference().float()).abs().max().item()
        print(f"{name:<16} {first:>13.1f} {('yes' if compiled else 'cache'):>9} {error:>10.2e} "
              f"{_median_us(fused, synchronize):>12.1f} "
              f"{_median_us(reference, synchronize):>9.1f}")
    print(f"kernel cache: {_cache_dir()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilefuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="version, targets, CUDA driver, cache")
    cache = commands.add_parser("cache", help="list or clear the kernel cache")
    cache.add_argument("action", choices=["list", "clear"])
    demo = commands.add_parser(
        "demo", help="train a small Llama-style model eager vs patched by tilefuse "
        "(needs tilefuse[demo]); writes tilefuse-demo.json and .png")
    demo.add_argument("--steps", type=int, default=30)
    demo.add_argument("--out", default=".", help="folder for the JSON and the PNG")
    demo.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                      help="also train under torch.compile (default: on a GPU only)")
    demo.add_argument("--threads", type=int, default=None,
                      help="torch threads on the CPU target (default 1)")
    commands.add_parser("ops", help="compile and run fused ops against PyTorch")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "cache":
        return cache_list() if args.action == "list" else cache_clear()
    if args.command == "demo":
        from . import _training_demo
        return _training_demo.run(args.steps, args.out, args.compile, args.threads)
    return ops()


if __name__ == "__main__":
    sys.exit(main())
