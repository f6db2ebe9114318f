"""The `tilefuse` command (also `python -m tilefuse`): info, cache, demo, ops."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import stat
import statistics
import sys
import time

from . import _training_demo

# What the runtime writes (runtime/lib/KernelCache.cpp): a file named by the
# SHA-256 of the key that its header holds after the magic line.
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.tfk")
_MAGIC = b"TILEFUSE-KERNEL 1\n"


def _cache_dir() -> str:
    from . import _C
    return _C.cache_directory() or "(memory only)"


def _entry_header(path: str) -> dict[str, str] | None:
    """The header fields of the cache entry at `path`, or None when it is not
    one. Reads at most 4 KiB of a regular file, without following a symlink
    or blocking on a FIFO."""
    if not _ENTRY_NAME.fullmatch(os.path.basename(path)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        head = os.read(fd, 4096) if stat.S_ISREG(status.st_mode) else b""
    except OSError:
        head = b""
    finally:
        os.close(fd)
    if not head.startswith(_MAGIC) or b"\nsize=" not in head:
        return None
    key = head[len(_MAGIC):head.index(b"\nsize=") + 1]
    if hashlib.sha256(key).hexdigest() != os.path.basename(path)[:64]:
        return None
    fields = dict(line.split("=", 1) for line in key.decode(errors="replace").splitlines()
                  if "=" in line)
    fields["bytes"] = str(status.st_size)
    return fields


def _cache_entries(directory: str) -> tuple[list[tuple[str, dict[str, str]]], int]:
    """The kernels cached in `directory` (path, header fields), and how many
    other files it holds, which are left alone."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return [], 0
    entries, others = [], 0
    for name in names:
        if name.startswith("."):  # temporary files of writers at work
            continue
        path = os.path.join(directory, name)
        header = _entry_header(path)
        if header is None:
            others += 1
        else:
            entries.append((path, header))
    return entries, others


def info() -> int:
    import torch

    from . import _C, __version__
    directory = _cache_dir()
    entries, _ = _cache_entries(directory)
    size = sum(int(header["bytes"]) for _, header in entries)
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
    directory = _cache_dir()
    entries, others = _cache_entries(directory)
    for path, header in entries:
        name = os.path.basename(path)[:16]
        print(f"{name}  n={header.get('n', '?'):>7} dtype={header.get('dtype', '?'):<5} "
              f"target={header.get('target', '?')} {header['bytes']} bytes")
    print(f"{len(entries)} kernels in {directory}"
          + (f" ({others} other files left alone)" if others else ""))
    return 0


def cache_clear() -> int:
    directory = _cache_dir()
    entries, others = _cache_entries(directory)
    removed = 0
    for path, _ in entries:
        try:
            os.remove(path)
            removed += 1
        except FileNotFoundError:  # another process removed or replaced it
            pass
    print(f"removed {removed} kernels from {directory}"
          + (f" ({others} other files left alone)" if others else ""))
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


def _positive_int(text: str, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0 or (most is not None and value > most):
        expected = "a positive integer" if most is None else f"1 to {most}"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def _thread_count(text: str) -> int:
    """--threads: at most the CPUs this process may use (more only slow
    the demo)."""
    usable = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)
    return _positive_int(text, usable)


def _writable_folder(path: str) -> str:
    """The demo's --out, checked before minutes of training rather than
    when the results are written; created by the demo, not here (argparse
    may yet refuse another option)."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise argparse.ArgumentTypeError(f"{path!r} is not a directory")
        for name in (_training_demo.JSON_FILE, _training_demo.PLOT_FILE):
            if os.path.isdir(os.path.join(path, name)):
                raise argparse.ArgumentTypeError(
                    f"{os.path.join(path, name)!r}, where the demo writes, is a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"cannot write to {path!r}")
        return path
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot create {path!r} in {parent!r}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilefuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="version, targets, CUDA driver, cache")
    cache = commands.add_parser("cache", help="list or clear the kernel cache")
    cache.add_argument("action", choices=["list", "clear"])
    demo = commands.add_parser(
        "demo", help="train a small Llama-style model eager vs patched by tilefuse "
        "(needs tilefuse[demo]); writes tilefuse-demo.json and .png")
    demo.add_argument("--steps", type=_positive_int, default=30)
    demo.add_argument("--out", type=_writable_folder, default=".",
                      help="folder for the JSON and the PNG (created if missing)")
    demo.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                      help="also train under torch.compile (default: on a GPU only)")
    demo.add_argument("--threads", type=_thread_count, default=None,
                      help="torch threads on the CPU target (default 1)")
    commands.add_parser("ops", help="compile and run fused ops against PyTorch")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "cache":
        return cache_list() if args.action == "list" else cache_clear()
    if args.command == "demo":
        return _training_demo.run(args.steps, args.out, args.compile, args.threads)
    return ops()


if __name__ == "__main__":
    sys.exit(main())
