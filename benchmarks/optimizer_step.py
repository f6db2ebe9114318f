"""Optimizer step time and launches per step: tilefuse.optim.AdamW against
torch.optim.AdamW (foreach, and fused on a GPU), side by side in one process
on one model-sized parameter set (a few hundred tensors; --params total
elements, 100M by default on the CPU, 1B on a GPU). The steps of each
optimizer alternate so that all see the same machine; the table gives the
median step time. Goal: faster than foreach on the CPU, as fast as fused on
a GPU.

    .venv/bin/python benchmarks/optimizer_step.py [--params N] [--steps N] [--device D]
"""

import argparse
import statistics
import time

import torch

import tilefuse
import tilefuse.optim


def parameter_shapes(total: int) -> list[tuple[int, ...]]:
    """A transformer's tensors: per layer four square projections, three
    MLP matrices (4x wide) and two norm weights, layers until `total`."""
    hidden = 512 if total <= 200_000_000 else 2048
    layer = [(hidden, hidden)] * 4 + [(4 * hidden, hidden)] * 2 + [(hidden, 4 * hidden)] + \
        [(hidden,)] * 2
    per_layer = sum(torch.Size(s).numel() for s in layer)
    return [(32000, hidden)] + layer * max(1, (total - 32000 * hidden) // per_layer)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--params", type=int, default=None)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    total = args.params or (1_000_000_000 if device.type == "cuda" else 100_000_000)
    shapes = parameter_shapes(total)
    base = [torch.randn(s, device=device) for s in shapes]
    grads = [torch.randn_like(p) for p in base]
    contenders = {"tilefuse.optim.AdamW": lambda ps: tilefuse.optim.AdamW(ps, lr=1e-3),
                  "torch.optim.AdamW foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3,
                                                                            foreach=True)}
    if device.type == "cuda":
        contenders["torch.optim.AdamW fused"] = lambda ps: torch.optim.AdamW(ps, lr=1e-3,
                                                                             fused=True)
    optimizers = {}
    for name, make in contenders.items():
        params = [p.clone().requires_grad_() for p in base]
        for p, g in zip(params, grads):
            p.grad = g
        optimizers[name] = make(params)
        optimizers[name].step()  # state allocated, kernels compiled
    times = {name: [] for name in optimizers}
    launches = 0
    for _ in range(args.steps):
        for name, optimizer in optimizers.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            before = tilefuse.kernel_launches()
            start = time.perf_counter()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
            if name.startswith("tilefuse"):
                launches = tilefuse.kernel_launches() - before
    elements = sum(p.numel() for p in base)
    print(f"{len(shapes)} tensors, {elements / 1e6:.0f}M parameters (float32), {device}, "
          f"median of {args.steps} steps")
    reference = statistics.median(times["torch.optim.AdamW foreach"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:28s} {median * 1e3:9.1f} ms   {reference / median:5.2f}x foreach")
    print(f"  tilefuse launches per step: {launches}")
    # Every optimizer took the same steps from the same parameters.
    ours = optimizers["tilefuse.optim.AdamW"].param_groups[0]["params"]
    for name, optimizer in optimizers.items():
        difference = max((a - b).abs().max().item() for a, b in
                         zip(ours, optimizer.param_groups[0]["params"]) if a.numel())
        print(f"  max |tilefuse - {name}| after {args.steps + 1} steps: {difference:.1e}")


if __name__ == "__main__":
    main()
