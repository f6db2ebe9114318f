"""tilefuse::register_fusion: a fusion from fuse IR text, for processes that
have only the tilefuse:: ops (the self-contained library on a GPU machine;
scripts/gpu_check.py runs its DSL fusions this way)."""

import contextlib
import os
import sys

import pytest
import torch

from test_dsl import moments, scaled_column_sum, softmax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from gpu_check import DSL_FUSIONS  # noqa: E402

ops = torch.ops.tilefuse


@pytest.mark.parametrize("name", ["softmax", "scaled_column_sum", "moments"])
def test_ir_text_runs_as_the_traced_fusion(name, dtype):
    """The GPU check's IR text computes bit for bit what the DSL traces."""
    x, w = torch.randn(6, 40).to(dtype), torch.randn(40).to(dtype)
    args = {"softmax": ([x], []), "scaled_column_sum": ([x, w], []),
            "moments": ([x], [1e-5])}[name]
    storage = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    handle = ops.register_fusion(DSL_FUSIONS[name], storage)
    ours = ops.launch_fusion(handle, *args)
    traced = {"softmax": softmax, "scaled_column_sum": scaled_column_sum,
              "moments": moments}[name](*args[0], *args[1])
    traced = list(traced.values()) if isinstance(traced, dict) else [traced]
    assert len(ours) == len(traced)
    for a, b in zip(ours, traced):
        assert torch.equal(a.to(b.dtype), b)


def test_first_call_compiles_once():
    handle = ops.register_fusion(DSL_FUSIONS["softmax"].replace("@softmax", "@softmax_once"),
                                 "f32")
    x = torch.randn(3, 24)
    before = ops.compile_count()
    ops.launch_fusion(handle, [x], [])
    ops.launch_fusion(handle, [x], [])
    assert ops.compile_count() - before == 1


def test_the_same_text_gives_the_same_handle():
    """register_fusion is idempotent: a graph torch.compile traced with the
    handle it got runs the fusion eager calls run (and registering again
    costs no memory)."""
    ir = DSL_FUSIONS["softmax"].replace("@softmax", "@softmax_again")
    handle = ops.register_fusion(ir, "f32")
    assert ops.register_fusion(ir, "f32") == handle
    assert ops.register_fusion(ir, "bf16") != handle
    assert ops.register_fusion(ir.replace("@softmax_again", "@softmax_other"), "f32") != handle


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_bad_launch_arguments_fail_alike_on_fake_tensors(fake):
    """launch_fusion's Meta kernel (torch.compile traces with it) checks
    what the kernel checks, with the same errors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    handle = ops.register_fusion(DSL_FUSIONS["scaled_column_sum"], "f32")
    moments = ops.register_fusion(DSL_FUSIONS["moments"], "f32")
    with FakeTensorMode() if fake else contextlib.nullcontext():
        x, w = torch.randn(6, 40), torch.randn(40)
        assert ops.launch_fusion(handle, [x, w], [])[0].shape == (40,)
        with pytest.raises(RuntimeError, match="scaled_column_sum takes 2 tensors and 0 "
                                               "scalars, got 1 and 0"):
            ops.launch_fusion(handle, [x], [])
        with pytest.raises(RuntimeError, match="moments takes 1 tensors and 1 scalars, got 1 "
                                               "and 0"):
            ops.launch_fusion(moments, [x], [])
        with pytest.raises(TypeError, match="input 'w' must be Float, got Half"):
            ops.launch_fusion(handle, [x, w.half()], [])
        with pytest.raises(ValueError, match=r"input 'w' must have shape \[40\] \(col\), "
                                             r"got \[41\]"):
            ops.launch_fusion(handle, [x, torch.randn(41)], [])
        with pytest.raises(ValueError, match="the input must have a last dimension of at "
                                             "least 1"):
            ops.launch_fusion(handle, [torch.randn(6, 0), torch.randn(0)], [])
        with pytest.raises(ValueError, match=r"at least 1, got shape \[\]"):
            ops.launch_fusion(handle, [torch.tensor(1.0), w], [])


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_column_extremes_of_zero_rows_raise_as_torch(fake):
    from torch._subclasses.fake_tensor import FakeTensorMode

    handle = ops.register_fusion("""module {
  fuse.kernel @column_peak(%x: !fuse.full<f32>) -> (peak: !fuse.col<f32>, total: !fuse.col<f32>) {
    %0 = fuse.reduce min %x : !fuse.full<f32> to !fuse.col<f32>
    %1 = fuse.reduce sum %x : !fuse.full<f32> to !fuse.col<f32>
    fuse.yield %0, %1 : !fuse.col<f32>, !fuse.col<f32>
  }
}""", "f32")
    with FakeTensorMode() if fake else contextlib.nullcontext():
        for shape in [(0, 5), (3, 0, 5)]:
            with pytest.raises(IndexError, match=r"column_peak: min over the rows \(dim=0\) of "
                                                 "zero rows: expected reduction dim 0"):
                ops.launch_fusion(handle, [torch.empty(shape)], [])
        peak, total = ops.launch_fusion(handle, [torch.ones(2, 5)], [])
        assert peak.shape == total.shape == (5,)


def test_meta_checks_trace_unbacked_sizes():
    """The Meta kernel's checks decide no data-dependent size (a row length
    from .item() or marked unbacked): torch.compile traces them."""
    handle = ops.register_fusion(DSL_FUSIONS["scaled_column_sum"], "f32")
    x, w = torch.randn(4, 8), torch.randn(8)
    torch._dynamo.reset()
    torch._dynamo.decorators.mark_unbacked(x, 1)
    torch._dynamo.decorators.mark_unbacked(w, 0)
    compiled = torch.compile(lambda x, w: ops.launch_fusion(handle, [x, w], [])[0],
                             backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, w), (x * w).sum(0))


def test_bad_ir_names_the_op_and_the_problem():
    with pytest.raises(ValueError, match=r"register_fusion: argument 'ir': invalid fuse IR.*"
                                         r"fuse.nope"):
        ops.register_fusion("fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {\n"
                            "  %0 = fuse.nope %x : !fuse.full<f32>\n"
                            "  fuse.yield %0 : !fuse.full<f32>\n}", "f32")
    with pytest.raises(ValueError, match="exactly one fuse.kernel, got 2"):
        ops.register_fusion(DSL_FUSIONS["softmax"] + DSL_FUSIONS["softmax"].replace(
            "@softmax", "@other"), "f32")
    with pytest.raises(TypeError, match="storage dtype must be f32, f16, bf16 or f64"):
        ops.register_fusion(DSL_FUSIONS["softmax"], "i32")


_INT_SCALARS = """
fuse.kernel @shifted(%x: !fuse.full<f32>, %k: !fuse.scalar<i32>, %j: !fuse.scalar<i64>) -> (out: !fuse.full<f32>) {
  %0 = fuse.cast %k : !fuse.scalar<i32> to !fuse.scalar<f32>
  %1 = fuse.cast %j : !fuse.scalar<i64> to !fuse.scalar<f32>
  %2 = fuse.add %0, %1 : !fuse.scalar<f32>
  %3 = fuse.broadcast %2 : !fuse.scalar<f32> to !fuse.full<f32>
  %4 = fuse.add %x, %3 : !fuse.full<f32>
  fuse.yield %4 : !fuse.full<f32>
}"""


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
@pytest.mark.parametrize("scalars, error, message", [
    ([2.7, 1], TypeError, r"tilefuse.shifted: scalar 'k' = 2.7 is a float; the fusion takes "
                          r"an integer \(i32\)"),
    ([1, -2.0], TypeError, r"scalar 'j' = -2.0 is a float; the fusion takes an integer \(i64\)"),
    ([2**31, 1], ValueError, r"tilefuse.shifted: scalar 'k' = 2147483648 does not fit in int32"),
    ([-2**31 - 1, 1], ValueError, r"scalar 'k' = -2147483649 does not fit in int32"),
    ([1, 2**63], ValueError, r"scalar 'j' = 9223372036854775808 does not fit in int64"),
    ([1j, 1], TypeError, r"tilefuse.shifted: scalar 'k' is complex; the fusion takes i32"),
])
def test_integer_scalars_take_no_float_and_no_overflow(scalars, error, message, fake):
    """An int scalar of launch_fusion is an int, as torch's int arguments: a
    float was truncated (2.7 ran as 2) and an overflow raised c10's message,
    naming neither the fusion nor the scalar. The Meta kernel (fake tensors:
    torch.compile, export) refuses them alike."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    handle = ops.register_fusion(_INT_SCALARS, "f32")
    with FakeTensorMode() if fake else contextlib.nullcontext():
        with pytest.raises(error, match=message):
            ops.launch_fusion(handle, [torch.zeros(2, 8)], scalars)
    x = torch.zeros(2, 8)
    # In range (the ends of int32, beyond it for int64), bools as ints (as
    # torch takes them): the sum of both, exact in float32.
    assert torch.equal(ops.launch_fusion(handle, [x], [-2**31, 2**40])[0],
                       torch.full((2, 8), 2.0**40 - 2.0**31))
    assert torch.equal(ops.launch_fusion(handle, [x], [True, -4])[0], torch.full((2, 8), -3.0))
