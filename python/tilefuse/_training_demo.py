"""`tilefuse demo`: a small Llama-style model (random weights) trained on a
fixed batch eager, patched by tilefuse.transformers, and under
torch.compile; loss and time per step, peak memory and the kernels compiled,
printed and written as JSON and a PNG plot."""

from __future__ import annotations

import copy
import ctypes
import json
import os
import time


def _cpu_peak_tracker():
    """(reset, peak bytes since reset) from Linux's resident-set high-water
    mark, or None where /proc cannot reset it. Large allocations are made
    mmap'd so that freed memory leaves the resident set (glibc would keep it
    for the next run to reuse, hiding that run's growth)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None

    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(field))
        return int(line.split()[1]) * 1024

    base = [0]

    def reset() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base[0] = status("VmRSS:")

    return reset, lambda: status("VmHWM:") - base[0]


def _setting(on_gpu: bool):
    import torch
    from transformers import LlamaConfig

    if on_gpu:
        sizes = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                     num_attention_heads=16, num_key_value_heads=8, vocab_size=32000)
        batch, seq, dtype = 8, 512, torch.bfloat16
    else:
        sizes = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=4096)
        batch, seq, dtype = 4, 64, None
    return LlamaConfig(**sizes, max_position_embeddings=seq), batch, seq, dtype


# What run() writes into its folder.
JSON_FILE, PLOT_FILE = "tilefuse-demo.json", "tilefuse-demo.png"


def run(steps: int = 30, out_dir: str = ".", with_compile: bool | None = None,
        threads: int | None = None) -> int:
    import torch
    from transformers import LlamaForCausalLM

    import tilefuse
    from tilefuse.transformers import apply_tilefuse

    emulated = tilefuse.emulator.active()
    on_gpu = (torch.cuda.is_available() and not emulated
              and os.environ.get("TILEFUSE_TARGET") != "cpu")
    device = "cuda" if on_gpu else "cpu"
    if with_compile is None:
        with_compile = on_gpu  # inductor's CPU compile alone takes minutes here
    config, batch, seq, autocast = _setting(on_gpu)
    if not on_gpu:
        # A model this small steps fastest on one thread; on a loaded machine
        # OpenMP's spinning threads made each step 10-100x slower.
        torch.set_num_threads(threads or 1)
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).to(device)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    labels = ids.clone()
    labels[:, : seq // 8] = -100  # a prompt the loss ignores

    if on_gpu:
        synchronize = torch.cuda.synchronize

        def reset_peak():
            torch.cuda.reset_peak_memory_stats()
            reset_peak.base = torch.cuda.memory_allocated()

        def peak():
            return torch.cuda.max_memory_allocated() - reset_peak.base
        note = f"GPU ({torch.cuda.get_device_name()}), bf16 autocast"
    else:
        def synchronize():
            return None
        tracker = _cpu_peak_tracker()
        reset_peak, peak = tracker or ((lambda: None), (lambda: None))
        note = (f"CPU target, float32, {torch.get_num_threads()} thread(s)" + (" (TILEFUSE_TARGET=emulate: fused kernels run in the "
                                         "PTX emulator)" if emulated else ""))

    counts = {}

    def patched():
        model = copy.deepcopy(base)
        counts.update(apply_tilefuse(model))
        return model

    variants = [("eager", lambda: copy.deepcopy(base)), ("tilefuse", patched)]
    if with_compile:
        variants.append(("torch.compile", lambda: torch.compile(copy.deepcopy(base))))
    print(f"tilefuse demo on the {note}: LlamaForCausalLM, random weights, "
          f"{sum(p.numel() for p in base.parameters()) / 1e6:.1f}M parameters "
          f"(hidden {config.hidden_size}, {config.num_hidden_layers} layers, vocab "
          f"{config.vocab_size}), batch {batch} x {seq} tokens, AdamW, {steps} steps")
    results = {}
    for name, build in variants:
        model = build()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        compiled_before = tilefuse.compile_count()
        losses, times = [], []
        synchronize()
        reset_peak()
        for _ in range(steps):
            start = time.perf_counter()
            with torch.autocast(device, dtype=autocast or torch.float32,
                                enabled=autocast is not None):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize()
            times.append((time.perf_counter() - start) * 1e3)
            losses.append(loss.item())
        peak_bytes = peak()
        results[name] = {
            "loss": losses, "step_ms": times, "peak_memory_bytes": peak_bytes,
            "kernels_compiled": tilefuse.compile_count() - compiled_before,
        }
        del model, optimizer

    names = list(results)
    print(f"{'step':>4} " + " ".join(f"{n + ' loss':>19}" for n in names)
          + " " + " ".join(f"{n + ' ms':>17}" for n in names))
    for step in range(steps):
        print(f"{step:>4} " + " ".join(f"{results[n]['loss'][step]:>19.5f}" for n in names)
              + " " + " ".join(f"{results[n]['step_ms'][step]:>17.1f}" for n in names))
    print(f"replaced by tilefuse: {', '.join(f'{n} {kind}' for kind, n in counts.items())}")
    for name in names:
        r = results[name]
        steady = sorted(r["step_ms"][steps // 2:])[len(r["step_ms"][steps // 2:]) // 2]
        memory = ("n/a" if r["peak_memory_bytes"] is None
                  else f"{r['peak_memory_bytes'] / 2**20:.1f} MiB")
        r["median_step_ms_second_half"] = steady
        print(f"{name:<14} first step {r['step_ms'][0]:8.1f} ms, median step (second half) "
              f"{steady:7.1f} ms, peak memory {memory}, final loss {r['loss'][-1]:.5f}"
              + (f", tilefuse kernels compiled {r['kernels_compiled']}"
                 if name == "tilefuse" else ""))
    difference = max(abs(a - b) for a, b in zip(results["eager"]["loss"],
                                                 results["tilefuse"]["loss"]))
    print(f"max |loss difference| tilefuse vs eager over {steps} steps: {difference:.2e}")

    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, JSON_FILE)
    with open(json_path, "w") as f:
        json.dump({"setting": note, "device": device, "steps": steps, "batch": batch,
                   "seq": seq, "config": config.to_diff_dict(), "replaced": counts,
                   "results": results}, f, indent=1)
    print(f"wrote {json_path}" + _plot(results, os.path.join(out_dir, PLOT_FILE),
                                        note))
    return 0


def _plot(results: dict, path: str, title: str) -> str:
    try:
        import matplotlib
    except ImportError:
        return " (no PNG: pip install matplotlib)"
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (losses, times) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        losses.plot(r["loss"], label=name)
        times.plot(r["step_ms"], label=name)
    losses.set(xlabel="step", ylabel="loss", title="training loss")
    times.set(xlabel="step", ylabel="ms", title="time per step", yscale="log")
    losses.legend()
    times.legend()
    figure.suptitle(f"tilefuse demo: {title}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return f" and {path}"
