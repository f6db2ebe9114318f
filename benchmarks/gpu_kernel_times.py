"""Per-kernel GPU times of the norms and cross-entropy (torch.profiler).

On the GPU machine, beside the GPU check (README, "The GPU check"), with the
same bundle:
    python3 benchmarks/gpu_kernel_times.py .gpu/tilefuse-gpu.tar.xz "$OUT"
writes $OUT/profile.md: each case's 20 calls, kernel by kernel (the main
kernel and its finalize apart), beside PyTorch eager's RMSNorm backward;
the forward norms too (the traffic model's calibration: benchmarks/README.md).
On a GPU, $OUT/jit.log keeps its stderr with TILEFUSE_LOG=jit: the PTX
JIT's registers and spills per kernel, and which kernels the runtime
compiled again asking ptxas for more blocks per SM (CudaDriver).
On a machine without a GPU (TILEFUSE_TARGET=emulate) it runs tiny shapes
on the CPU as a smoke test. Results: benchmarks/results/.
"""
import os, sys, tarfile, tempfile, time
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity

bundle, out = sys.argv[1], sys.argv[2]
if torch.cuda.is_available():
    os.environ.setdefault("TILEFUSE_LOG", "jit")
    jit_log = open(os.path.join(out, "jit.log"), "w")
    os.dup2(jit_log.fileno(), sys.stderr.fileno())
folder = tempfile.mkdtemp()
with tarfile.open(bundle) as t:
    t.extractall(folder, filter="data")
torch.ops.load_library(os.path.join(folder, "libtilefuse_torch.so"))
ops = torch.ops.tilefuse
dev = "cuda" if torch.cuda.is_available() else "cpu"
bf16 = torch.bfloat16
lines = []

def report(name, fn, reps=20):
    fn(); fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])) as prof:
        for _ in range(reps):
            fn()
        if dev == "cuda":
            torch.cuda.synchronize()
    lines.append(f"## {name} ({reps} calls)")
    table = prof.key_averages().table(sort_by="cuda_time_total" if dev == "cuda" else "cpu_time_total", row_limit=14, max_name_column_width=60)
    lines.append(table)
    print(lines[-2]); print(table, flush=True)

# n = 32000: the forward norms hold their loads packed there (the traffic
# model's prediction: 1 -> 2 blocks per SM, 65-73% -> 100% of HBM).
for rows, n in ([(16384, 4096), (16384, 8192), (8192, 1000), (8192, 32000)]
                if dev == "cuda" else [(8, 64)]):
    torch.manual_seed(0)
    x = torch.randn(rows, n, device=dev, dtype=bf16)
    w = torch.randn(n, device=dev, dtype=bf16)
    b = torch.randn(n, device=dev, dtype=bf16)
    dy = torch.randn(rows, n, device=dev, dtype=bf16)
    report(f"rms_norm_fwd {rows}x{n}", lambda: ops.rms_norm_fwd(x, w, 1e-6))
    y, rstd = ops.rms_norm_fwd(x, w, 1e-6)
    report(f"rms_norm_bwd {rows}x{n}", lambda: ops.rms_norm_bwd(dy, x, w, rstd))
    report(f"layer_norm_fwd {rows}x{n}", lambda: ops.layer_norm_fwd(x, w, b, 1e-5))
    y, mean, rstd2 = ops.layer_norm_fwd(x, w, b, 1e-5)
    report(f"layer_norm_bwd {rows}x{n}", lambda: ops.layer_norm_bwd(dy, x, w, mean, rstd2))
    xt, wt = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    yt = F.rms_norm(xt, (n,), wt, 1e-6)
    report(f"eager rms_norm backward {rows}x{n}", lambda: torch.autograd.grad(yt, (xt, wt), dy, retain_graph=True))

for rows, n in ([(8192, 32000)] if dev == "cuda" else [(8, 64)]):
    x = torch.randn(rows, n, device=dev, dtype=bf16)
    t = torch.randint(0, n, (rows,), device=dev)
    report(f"cross_entropy fwd {rows}x{n}", lambda: ops.cross_entropy(x, t))

with open(os.path.join(out, "profile.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
