"""The CUDA launch path's packing of KernelABI parameters, against a fake
driver (no GPU needed): grid, block, parameter order and types, and the
finalize launch for column reductions."""

import ctypes

import pytest

import tilefuse
from tilefuse import _cuda


class FakeDriver:
    def __init__(self, sm_count=132):
        self.launches = []
        self._sm_count = sm_count

    def functions(self, kernel):
        has_columns = any(kind == "col" for _, kind, _ in kernel.outputs)
        return "main", ("finalize" if has_columns else None)

    def sm_count(self):
        return self._sm_count

    def launch(self, function, name, grid, block, stream, params):
        self.launches.append((function, name, grid, block, stream,
                              [(type(p), p.value) for p in params]))


@pytest.fixture
def fake(monkeypatch):
    driver = FakeDriver()
    monkeypatch.setattr(_cuda, "driver", lambda: driver)
    return driver


def test_row_program_launch(fake):
    kernel = tilefuse._C.builtin("rms_norm_fwd").compile_gpu("bf16", 4096, True, "sm_90")
    _cuda.launch(kernel, [0x1000, 0x2000, 1e-6], [0x3000, 0x4000], rows=5, stream=77,
                 workspaces={})
    ((function, name, grid, block, stream, params),) = fake.launches
    assert (function, name, stream) == ("main", "rms_norm_fwd", 77)
    # rows_per_block = 2 row groups of 128 threads: ceil(5 / 2) blocks.
    assert (grid, block) == (3, 256)
    u64, i64, f32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_float
    assert params == [(u64, 0x1000), (u64, 0x2000), (f32, pytest.approx(1e-6)),
                      (u64, 0x3000), (u64, 0x4000), (i64, 5)]


def test_column_reduction_launch_and_finalize(fake):
    kernel = tilefuse._C.builtin("rms_norm_bwd").compile_gpu("f32", 8192, True, "sm_90")
    rows = 100000
    _cuda.launch(kernel, [0x10, 0x20, 0x30, 0x40], [0x50, 0x60], rows=rows, stream=0,
                 workspaces={1: 0x70})
    main, final = fake.launches
    # A persistent grid: 4 blocks per SM on 132 SMs.
    assert main[2] == 4 * 132 and main[3] == kernel.threads_per_row * kernel.rows_per_block
    assert [p for _, p in main[5]] == [0x10, 0x20, 0x30, 0x40, 0x50, 0x70, rows]
    # The finalize kernel: (partials, dweight), row groups, rows.
    assert final[1] == "rms_norm_bwd_finalize"
    assert (final[2], final[3]) == (8192 // 256, 256)
    assert [p for _, p in final[5]] == [0x70, 0x60, 4 * 132 * kernel.rows_per_block, rows]


def test_zero_rows_only_finalize(fake):
    kernel = tilefuse._C.builtin("layer_norm_bwd").compile_gpu("f32", 1024, True, "sm_80")
    _cuda.launch(kernel, [1, 2, 3, 4, 5], [6, 7, 8], rows=0, stream=0, workspaces={1: 9, 2: 10})
    (final,) = fake.launches
    assert final[1] == "layer_norm_bwd_finalize"
    assert [p for _, p in final[5]] == [9, 7, 10, 8, 0, 0]


def test_ctypes_scalar_types():
    assert _cuda._SCALARS["i64"] is ctypes.c_int64
    assert _cuda._SCALARS["f32"] is ctypes.c_float
