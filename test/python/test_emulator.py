"""TILEFUSE_TARGET=emulate: CPU tensors run their GPU code in the PTX emulator.

Each test starts a fresh interpreter (the target is read once per process).
The built-in and DSL suites also run whole under the emulator (CTest
`python-emulate`)."""

import json

import pytest
from conftest import run_python

# Every built-in, forward and backward, on CPU tensors; the outputs as lists.
BUILTINS = """
import json, sys, torch, tilefuse.functional as TF
torch.manual_seed(0)
outputs = {}
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(5, 1000).to(dtype).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(1000)).to(dtype).requires_grad_(True)
    b = (0.1 * torch.randn(1000)).to(dtype).requires_grad_(True)
    logits = torch.randn(6, 333).to(dtype).requires_grad_(True)
    target = torch.tensor([0, 5, -100, 332, 7, 100])
    a, g = torch.randn(5, 64).to(dtype).requires_grad_(True), torch.randn(5, 64).to(dtype)
    results = {
        "rms_norm": torch.autograd.grad(TF.rms_norm(x, (1000,), w, 1e-6).float().sum(), (x, w)),
        "layer_norm": torch.autograd.grad(TF.layer_norm(x, (1000,), w, b).float().sum(), (x, w, b)),
        "swiglu": torch.autograd.grad(TF.swiglu(a, g).float().sum(), (a,)),
        "cross_entropy": (TF.cross_entropy(logits, target, label_smoothing=0.1),)
                         + torch.autograd.grad(TF.cross_entropy(logits, target), (logits,)),
    }
    p, m, v = torch.randn(3, 50).to(dtype), torch.zeros(3, 50).to(dtype), torch.zeros(3, 50).to(dtype)
    TF.adamw_step_(p, torch.randn(3, 50).to(dtype), m, v, lr=1e-3, beta1=0.9, beta2=0.999,
                   eps=1e-8, weight_decay=0.01, step=1)
    results["adamw_step_"] = (p, m, v)
    for name, tensors in results.items():
        outputs[f"{name}/{dtype}"] = [t.float().flatten().tolist() for t in tensors]
json.dump(outputs, sys.stdout)
"""


@pytest.mark.parametrize("approximation", ["exact", "high", "low"])
def test_every_builtin_matches_the_cpu_target(tmp_path, approximation):
    # high/low: every f32 .approx result (ex2, div, rcp, rsqrt, sqrt) off by
    # PTX's whole bound, the same way: the tolerances still hold.
    runs = {}
    for target in ("emulate", "cpu"):
        done = run_python(BUILTINS, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET=target,
                          TILEFUSE_EMULATE_APPROX=approximation)
        assert done.returncode == 0, done.stderr
        runs[target] = json.loads(done.stdout)
    assert runs["emulate"].keys() == runs["cpu"].keys()
    for key, emulated in runs["emulate"].items():
        for got, want in zip(emulated, runs["cpu"][key]):
            # The two targets sum in different orders: bf16 outputs may differ
            # by a rounding of the output.
            tolerance = 2e-2 if "bfloat16" in key else 1e-5
            assert len(got) == len(want), key
            worst = max(abs(g - w) - tolerance * abs(w) for g, w in zip(got, want))
            assert worst <= tolerance, f"{key}: {worst}"


def test_launch_records_on_sm80(tmp_path):
    script = """
import torch, tilefuse, tilefuse.functional as TF
assert tilefuse.emulator.active() and tilefuse.emulator.device() == ("sm_80", 108)
x, w = torch.randn(8, 1024), torch.randn(1024)
TF.rms_norm(x, (1024,), w, 1e-6)
(launch,) = tilefuse.emulator.last_launches()
assert launch["kernel"] == "rms_norm_fwd" and launch["chip"] == "sm_80", launch
buffers = {b["name"]: b for b in launch["buffers"]}
assert buffers["x"]["loaded_bytes"] == 8 * 1024 * 4, buffers
assert buffers["x"]["loads"] == 8 * 1024 // 4, "16-byte loads"
assert buffers["y"]["stored_bytes"] == 8 * 1024 * 4, buffers
assert buffers["rstd"]["stored_bytes"] == 8 * 4, buffers
assert launch["shuffles"] > 0 and launch["instructions"]["transcendental"] > 0, launch
assert tilefuse.emulator.last_launches() == []
print("ok")
"""
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET="emulate:sm_80")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_column_reductions_run_their_finalize(tmp_path):
    script = """
import torch, tilefuse, tilefuse.functional as TF
x = torch.randn(300, 64, requires_grad=True)
w = torch.randn(64, requires_grad=True)
dy = torch.randn(300, 64)
dx, dw = torch.autograd.grad(TF.rms_norm(x, (64,), w, 1e-6), (x, w), dy)
rdx, rdw = torch.autograd.grad(torch.nn.functional.rms_norm(x, (64,), w, 1e-6), (x, w), dy)
torch.testing.assert_close(dx, rdx, atol=1e-5, rtol=1e-5)
torch.testing.assert_close(dw, rdw, atol=1e-4, rtol=1e-4)
kernels = [launch["kernel"] for launch in tilefuse.emulator.last_launches()]
assert kernels == ["rms_norm_fwd", "rms_norm_bwd", "rms_norm_bwd_finalize"], kernels
print("ok")
"""
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET="emulate")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_the_cli_says_the_emulator_is_in_use(tmp_path):
    done = run_python("from tilefuse.__main__ import main; main(['info'])",
                      TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET="emulate")
    assert done.returncode == 0, done.stderr
    assert "PTX emulator (loaded; sm_90, 132 SMs)" in done.stdout, done.stdout


@pytest.mark.parametrize("environment, message", [
    ({"TILEFUSE_TARGET": "emulate:sm_75"},
     "tilefuse.swiglu: TILEFUSE_TARGET=emulate:sm_75 is not a target: use cpu, emulate, "
     "emulate:sm_80 or emulate:sm_90"),
    ({"TILEFUSE_TARGET": "emulate", "TILEFUSE_EMULATE_APPROX": "worst"},
     "TILEFUSE_EMULATE_APPROX=worst: expected exact, high or low"),
])
def test_an_unknown_setting_is_refused(tmp_path, environment, message):
    script = """
import torch, tilefuse.functional as TF
try:
    TF.swiglu(torch.randn(2, 8), torch.randn(2, 8))
except RuntimeError as error:
    print(error)
"""
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), **environment)
    assert done.returncode == 0, done.stderr
    assert message in done.stdout, done.stdout


@pytest.mark.parametrize("tile, block, grid, staged", [
    ("", 256, 4, False),  # the heuristic: rows of 128 threads, two a block, on chip
    ("layer_norm_fwd:threads-per-row=256,rows-per-block=1", 256, 8, False),
    ("layer_norm_fwd:row-on-chip=false", 256, 4, True),  # streamed, staged
    ("rms_norm_fwd:threads-per-row=512", 256, 4, False),  # another kernel's
])
def test_tile_overrides_change_the_launch_not_the_result(tmp_path, tile, block, grid, staged):
    script = """
import json, sys, torch, tilefuse.emulator as emulator
torch.manual_seed(0)
x, w, b = torch.randn(8, 4096).bfloat16(), torch.randn(4096).bfloat16(), torch.randn(4096).bfloat16()
emulator.last_launches()
y, mean, rstd = torch.ops.tilefuse.layer_norm_fwd(x, w, b, 1e-5)
launch = emulator.last_launches()[-1]
yt = torch.nn.functional.layer_norm(x.float(), (4096,), w.float(), b.float(), 1e-5)
json.dump({"block": launch["block"][0], "grid": launch["grid"][0],
           "shared": launch["shared_bytes"], "error": float((y.float() - yt).abs().max())},
          sys.stdout)
"""
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET="emulate",
                      TILEFUSE_TILE=tile)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["block"], result["grid"]) == (block, grid)
    assert (result["shared"] > 1024) == staged  # a staged row's dynamic shared memory
    assert result["error"] < 0.05  # bf16 y of values of size ~3: 2-4 ulps


@pytest.mark.parametrize("tile, message", [
    ("layer_norm_fwd", "'layer_norm_fwd': no kernel name or no override"),
    ("layer_norm_fwd:threads=2", "unknown key 'threads'"),
    ("layer_norm_fwd:threads-per-row=0", "threads-per-row is a positive integer"),
    ("layer_norm_fwd:row-on-chip=yes", "row-on-chip is true, false or auto"),
    ("layer_norm_fwd:threads-per-row=96", "threads-per-row must be a power of two"),
])
def test_a_malformed_tile_override_is_refused(tmp_path, tile, message):
    script = """
import torch, tilefuse
try:
    torch.ops.tilefuse.layer_norm_fwd(torch.randn(2, 64), torch.ones(64), torch.zeros(64), 1e-5)
except RuntimeError as error:
    print(error)
"""
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET="emulate",
                      TILEFUSE_TILE=tile)
    assert done.returncode == 0, done.stderr
    assert message in done.stdout, done.stdout
    assert "tilefuse.layer_norm" in done.stdout, done.stdout


def test_approximation_modes_move_the_results(tmp_path):
    # exp of f32 goes through ex2.approx: from TILEFUSE_EMULATE_APPROX=high,
    # then set_approximation, results above / at / below the exact ones.
    script = """
import torch, tilefuse, tilefuse.emulator
@tilefuse.fusion
def exponential(x):
    return tilefuse.exp(x)
x = torch.linspace(-20, 20, 4096).reshape(4, 1024)
exact = torch.exp(x.double())
high = exponential(x).double()
tilefuse.emulator.set_approximation("exact")
rounded = exponential(x).double()
tilefuse.emulator.set_approximation("low")
low = exponential(x).double()
ulp = torch.finfo(torch.float32).eps * exact
print(((high - exact) / ulp).mean().item(), ((rounded - exact) / ulp).abs().max().item(),
      ((low - exact) / ulp).mean().item())
try:
    tilefuse.emulator.set_approximation("worst")
except ValueError as error:
    print(error)
"""
    done = run_python(script, TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_TARGET="emulate",
                      TILEFUSE_EMULATE_APPROX="high")
    assert done.returncode == 0, done.stderr
    numbers, refusal = done.stdout.split("\n", 1)
    high, rounded, low = map(float, numbers.split())
    assert ("tilefuse.emulator.set_approximation: mode must be 'exact', 'high' or 'low', "
            "got 'worst'") in refusal, done.stdout
    # In ulps of the exact value (an upper bound of float32's spacing).
    assert high > 0.5 and low < -0.5, done.stdout
    assert rounded <= 1.5, done.stdout
