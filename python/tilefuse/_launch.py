"""Running a compiled fusion on torch tensors.

Shared by DSL fusions and the built-ins: compile on first use per (storage
dtype, n, alignment class, target), allocate the outputs, and run the kernel
on the CPU or launch it on the GPU. Nothing that changes per call (rows,
scalars, pointers) selects a kernel.
"""

from __future__ import annotations

import math
import os

import torch

from . import _cuda

DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "i1",
}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
FLOAT_STORAGE = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


_CHIPS = {(8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89", (9, 0): "sm_90"}


def target_for(device: torch.device, op: str) -> str:
    """The compile target of `device`; TILEFUSE_TARGET=cpu forces the CPU."""
    if device.type == "cpu":
        return "cpu"
    if device.type != "cuda":
        raise RuntimeError(f"tilefuse.{op}: unsupported device {device}")
    if os.environ.get("TILEFUSE_TARGET") == "cpu":
        raise RuntimeError(f"tilefuse.{op}: TILEFUSE_TARGET=cpu needs CPU tensors, got {device}")
    try:
        _cuda.driver()
    except RuntimeError as error:
        raise RuntimeError(f"tilefuse.{op}: CUDA tensors need the CUDA driver: {error}") from None
    capability = torch.cuda.get_device_capability(device)
    chip = _CHIPS.get(capability) or ("sm_90" if capability[0] == 9 else None)
    if chip is None:
        raise RuntimeError(f"tilefuse.{op}: compute capability {capability} is not supported "
                           "(sm_80, sm_86, sm_89 and sm_90 are)")
    return chip


class CompiledFusion:
    """A fusion (C++ `_C.Fusion`) with its kernels, one per specialization.
    `inputs` and `outputs` are (name, kind, dtype) of the unspecialized
    kernel."""

    def __init__(self, fusion):
        self.fusion = fusion
        self.inputs = fusion.inputs
        self.outputs = fusion.outputs
        self._kernels: dict[tuple, object] = {}

    def kernel(self, op: str, storage: str, n: int, aligned: bool, target: str):
        """(kernel, its outputs' (name, kind, dtype)) for a specialization."""
        key = (storage, n, aligned, target)
        entry = self._kernels.get(key)
        if entry is None:
            try:
                if target == "cpu":
                    kernel = self.fusion.compile_cpu(storage, n, aligned)
                else:
                    kernel = self.fusion.compile_gpu(storage, n, aligned, target)
            except RuntimeError as error:
                raise RuntimeError(f"tilefuse.{op}: {error}") from None
            entry = self._kernels[key] = (kernel, tuple(kernel.outputs))
        return entry


def _aligned(tensors: list[torch.Tensor], n: int, storage: torch.dtype) -> bool:
    vector = 16 // storage.itemsize
    return n % vector == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)


def run(op: str, compiled: CompiledFusion, args: list, *, n: int,
        lead: tuple[int, ...], storage: torch.dtype, device: torch.device,
        out: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Runs `compiled` on `args` (one per input: contiguous tensors on
    `device`, or Python numbers) and returns the outputs in declaration
    order. `out` may name outputs to write in place (contiguous, right
    shape and dtype)."""
    target = target_for(device, op)
    out = out or {}
    tensors = [a for a in args if isinstance(a, torch.Tensor)] + list(out.values())
    kernel, kernel_outputs = compiled.kernel(op, DTYPE_NAMES[storage], n,
                                             _aligned(tensors, n, storage), target)
    outputs = []
    for name, kind, dtype in kernel_outputs:
        given = out.get(name)
        if given is None:
            shape = {"full": (*lead, n), "row": tuple(lead), "col": (n,)}[kind]
            given = torch.empty(shape, dtype=TORCH_DTYPES[dtype], device=device)
        outputs.append(given)
    arguments = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
    rows = math.prod(lead)
    if target == "cpu":
        kernel.run(arguments + [o.data_ptr() for o in outputs], rows)
        return outputs
    # Column reductions leave f32 partials, one row per row group.
    row_groups = _cuda.row_blocks(kernel, rows) * kernel.rows_per_block
    workspaces = {i: torch.empty((max(row_groups, 1), n), dtype=torch.float32, device=device)
                  for i, (_, kind, _) in enumerate(kernel_outputs) if kind == "col"}
    try:
        _cuda.launch(kernel, arguments, [o.data_ptr() for o in outputs], rows,
                     torch.cuda.current_stream(device).cuda_stream,
                     {i: w.data_ptr() for i, w in workspaces.items()})
    except RuntimeError as error:
        raise RuntimeError(f"tilefuse.{op}: {error}") from None
    return outputs
