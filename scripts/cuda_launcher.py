"""A ctypes launcher of tilefuse's PTX, for scripts/gpu_check.py only.

tilefuse launches kernels from C++ (runtime/lib/CudaDriver.cpp). The GPU
machine lent for checks has PyTorch but no LLVM/MLIR, so tilefuse._C cannot
be loaded there; this launcher packs the same KernelABI.h parameters with
ctypes so that PTX compiled here can be run and checked there. Keep it in
step with CudaDriver.cpp.
"""

from __future__ import annotations

import ctypes
import threading

_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_lock = threading.Lock()
_driver: "Driver | None" = None


class Driver:
    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise RuntimeError(f"the CUDA driver (libcuda.so.1) was not found: {error}") from None
        lib = self.lib
        lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                            ctypes.c_char_p]
        self._modules: dict[tuple, tuple] = {}
        self._sm_counts: dict[int, int] = {}
        self.check(lib.cuInit(0), "cuInit")

    def check(self, result: int, call: str, kernel: str | None = None) -> None:
        if result == 0:
            return
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(result, ctypes.byref(name))
        self.lib.cuGetErrorString(result, ctypes.byref(text))
        where = f" for kernel {kernel}" if kernel else ""
        raise RuntimeError(f"{call} failed{where}: "
                           f"{(name.value or b'CUDA error %d' % result).decode()} "
                           f"({(text.value or b'').decode()})")

    def _context(self) -> int:
        context = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        if not context.value:
            raise RuntimeError("no current CUDA context (allocate a CUDA tensor first)")
        return context.value

    def sm_count(self) -> int:
        device = ctypes.c_int()
        self.check(self.lib.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
        if device.value not in self._sm_counts:
            count = ctypes.c_int()
            self.check(self.lib.cuDeviceGetAttribute(
                ctypes.byref(count), _DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
                "cuDeviceGetAttribute")
            self._sm_counts[device.value] = count.value
        return self._sm_counts[device.value]

    def functions(self, kernel) -> tuple:
        """(main, finalize or None) of `kernel`, loaded in the current context."""
        key = (self._context(), id(kernel))
        loaded = self._modules.get(key)
        if loaded is None:
            module = ctypes.c_void_p()
            self.check(self.lib.cuModuleLoadData(ctypes.byref(module), kernel.ptx),
                       "cuModuleLoadData", kernel.name)
            names = [kernel.name]
            if any(kind == "col" for _, kind, _ in kernel.outputs):
                names.append(kernel.finalize_name)
            found = []
            for name in names:
                function = ctypes.c_void_p()
                self.check(self.lib.cuModuleGetFunction(ctypes.byref(function), module,
                                                        name.encode()),
                           "cuModuleGetFunction", name)
                found.append(function)
            loaded = self._modules[key] = (kernel, found[0], found[1] if len(found) > 1 else None)
        return loaded[1], loaded[2]

    def launch(self, function, name: str, grid: int, block: int, stream: int,
               params: list) -> None:
        pointers = (ctypes.c_void_p * len(params))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
        self.check(self.lib.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0,
                                           ctypes.c_void_p(stream), pointers, None),
                   "cuLaunchKernel", name)


def driver() -> Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = Driver()
        return _driver


_SCALARS = {"f32": ctypes.c_float, "f64": ctypes.c_double, "i64": ctypes.c_int64,
            "i32": ctypes.c_int32}


def launch(kernel, arguments: list, outputs: list, rows: int, stream: int,
           workspaces: dict[int, int]) -> None:
    """Runs `kernel` (a tilefuse._C.GpuKernel) on `rows` rows. `arguments`:
    per input a data pointer or a scalar; `outputs`: data pointers;
    `workspaces`: output index -> f32 [row_groups, n] partials pointer."""
    cuda = driver()
    main, finalize = cuda.functions(kernel)
    params = []
    for (_, kind, dtype), argument in zip(kernel.inputs, arguments):
        params.append(_SCALARS[dtype](argument) if kind == "scalar" else ctypes.c_uint64(argument))
    for index, pointer in enumerate(outputs):
        params.append(ctypes.c_uint64(workspaces.get(index, pointer)))
    params.append(ctypes.c_int64(rows))
    blocks = row_blocks(kernel, rows)
    if blocks:
        cuda.launch(main, kernel.name, blocks, kernel.threads_per_row * kernel.rows_per_block,
                    stream, params)
    if finalize is None:
        return
    final = [ctypes.c_uint64(p) for index in sorted(workspaces)
             for p in (workspaces[index], outputs[index])]
    final += [ctypes.c_int64(blocks * kernel.rows_per_block), ctypes.c_int64(rows)]
    threads = kernel.finalize_threads
    cuda.launch(finalize, kernel.finalize_name, -(-kernel.n // threads), threads, stream, final)


def row_blocks(kernel, rows: int) -> int:
    """The grid of `kernel` for `rows` rows (KernelABI.h)."""
    blocks = -(-rows // kernel.rows_per_block)
    if kernel.blocks_per_sm:
        blocks = min(blocks, kernel.blocks_per_sm * driver().sm_count())
    return blocks
