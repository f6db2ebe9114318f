"""Bad input: a Python exception naming the op and the argument, and the
process stays usable."""

import re

import pytest
import torch

import tilefuse
import tilefuse.functional as TF


def test_wrong_dtype():
    with pytest.raises(TypeError, match=r"tilefuse.rms_norm: argument 'input' must be a float32"):
        TF.rms_norm(torch.ones(2, 4, dtype=torch.int64), (4,))


def test_integer_tensor_to_float_op():
    with pytest.raises(TypeError, match=r"tilefuse.swiglu: argument 'b' must be a float32"):
        TF.swiglu(torch.ones(2, 4), torch.ones(2, 4, dtype=torch.int32))


def test_mixed_devices():
    with pytest.raises(ValueError, match=r"tilefuse.layer_norm: argument 'weight' is on meta"):
        TF.layer_norm(torch.ones(2, 4), (4,), torch.ones(4, device="meta"))


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"tilefuse.rms_norm: argument 'weight' must have shape \[4\]"):
        TF.rms_norm(torch.ones(2, 4), (4,), torch.ones(5))
    with pytest.raises(ValueError, match=r"tilefuse.swiglu: 'a' and 'b' must have the same shape"):
        TF.swiglu(torch.ones(2, 4), torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"tilefuse.rms_norm: normalized_shape must be the trailing "
                                         r"dimensions of 'input' \(shape \[2, 4\]\).*got \[3, 4\]"):
        TF.rms_norm(torch.ones(2, 4), (3, 4))


def test_target_out_of_range():
    with pytest.raises(IndexError, match=r"tilefuse.cross_entropy: target 9 is out of bounds for 5 classes"):
        TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, 9]))


def test_non_contiguous_in_place_state():
    param = torch.randn(8, 6).t()
    zeros = torch.zeros(6, 8)
    with pytest.raises(ValueError, match=r"tilefuse.adamw_step_: 'param' is updated in place and must be contiguous"):
        TF.adamw_step_(param, zeros, zeros.clone(), zeros.clone(), lr=1e-3, step=1)


def test_non_contiguous_input_is_copied():
    x = torch.randn(16, 8).t()
    torch.testing.assert_close(TF.rms_norm(x, (16,), None, 1e-6),
                               torch.nn.functional.rms_norm(x, (16,), None, 1e-6))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
def test_gpu_tensor_without_driver():
    # No CUDA tensor can exist here; the runner prefixes this reason with
    # "tilefuse.<op>: CUDA tensors need the CUDA driver: ".
    assert re.match(r"the CUDA driver \(libcuda.so.1\) was not found|cuInit failed",
                    tilefuse._C.cuda_driver_error())


def test_data_dependent_if_points_to_the_user_line():
    @tilefuse.fusion
    def clipped(x):
        if tilefuse.max(x) > 0:  # the line the error names
            return x
        return -x

    with pytest.raises(TypeError, match=r"data-dependent `if`.*test_errors.py:\d+: if tilefuse.max\(x\) > 0"):
        clipped(torch.ones(2, 3))


def test_unknown_function_points_to_the_user_line():
    @tilefuse.fusion
    def uses_torch(x):
        return torch.exp(x)

    with pytest.raises(TypeError, match=r"torch.exp on a traced value.*test_errors.py:\d+: return torch.exp\(x\)"):
        uses_torch(torch.ones(2, 3))


def test_invalid_fusion_reports_the_verifier():
    @tilefuse.fusion
    def reduce_a_row(x):
        return tilefuse.sum(tilefuse.sum(x))

    with pytest.raises(ValueError, match=r"cannot reduce a per-row value"):
        reduce_a_row(torch.ones(2, 3))


def test_process_stays_usable_after_errors():
    with pytest.raises(TypeError):
        TF.rms_norm(torch.ones(2, 4, dtype=torch.int64), (4,))
    torch.testing.assert_close(TF.rms_norm(torch.ones(2, 4), (4,), None, 0.0), torch.ones(2, 4))


@tilefuse.fusion
def picked(logits, target):
    return tilefuse.gather(logits, target)


@tilefuse.fusion
def picked_after_shift(logits, target, shift):
    return tilefuse.gather(logits, target + shift)


@pytest.mark.parametrize("bad", [5, -1, 2**40])
def test_gather_index_out_of_range_raises_like_torch(bad):
    logits, target = torch.randn(3, 5), torch.tensor([0, bad, 4])
    with pytest.raises(RuntimeError, match="out of bounds"):
        logits.gather(1, target[:, None])  # what PyTorch does
    with pytest.raises(IndexError, match=rf"tilefuse.picked: gather index {bad} is out of "
                                         r"bounds for size 5 \(the last dimension\) at row 1 "
                                         r"\(argument 'target'\)"):
        picked(logits, target)
    # A computed index is checked too, as the kernel used it.
    with pytest.raises(IndexError, match=rf"tilefuse.picked_after_shift: gather index {bad} "
                                         r"is out of bounds for size 5 .* at row 1 \(a computed index\)"):
        picked_after_shift(logits, target - 1, 1)
    torch.testing.assert_close(picked_after_shift(logits, target.clamp(0, 3), 1),
                               logits.gather(1, target.clamp(0, 3)[:, None] + 1).squeeze(1))


def test_gather_index_out_of_range_raises_with_autograd_and_under_compile():
    # The derived forward (eager autograd) and run_fusion (torch.compile)
    # launch the kernel on their own paths; both check the index.
    logits = torch.randn(3, 5, requires_grad=True)
    shifted = torch.compile(picked_after_shift, fullgraph=True, backend="aot_eager")
    for call in (picked_after_shift, shifted):
        with pytest.raises(IndexError, match=r"gather index 5 is out of bounds .* \(a computed index\)"):
            call(logits, torch.tensor([0, 4, 1]), 1)
        call(logits, torch.tensor([0, 3, 1]), 1).sum().backward()
    expected = torch.zeros(3, 5)
    expected[[0, 1, 2], [1, 4, 2]] = 2.0  # two backward passes
    torch.testing.assert_close(logits.grad, expected)


def test_gather_index_out_of_range_in_3d_names_the_row():
    logits, target = torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.int64)
    target[1, 2] = 4
    with pytest.raises(IndexError, match=r"gather index 4 .* at row \(1, 2\)"):
        picked(logits, target)


@tilefuse.fusion
def scaled(x, k):
    return x * k


def test_scalar_that_does_not_fit_names_the_argument():
    x = torch.ones(2, 4)
    scaled(x, 3)  # an int scalar; the same call again goes straight to the kernel
    with pytest.raises(OverflowError, match=r"tilefuse.scaled: argument 'k' = 1180591620717411303424 does not fit in int64"):
        scaled(x, 2**70)
    with pytest.raises(OverflowError, match=r"tilefuse.scaled: argument 'k' = 9223372036854775808 does not fit"):
        scaled(x, 2**63)
    # A Python float is a float64 number until it meets a tensor, as in torch.
    torch.testing.assert_close(scaled(x, 1e300), x * 1e300)
    torch.testing.assert_close(scaled(x, float("inf")), x * float("inf"))
    torch.testing.assert_close(scaled(x.double(), 1e300), x.double() * 1e300)


_state = torch.zeros(4, 3)

# (call, exception, message): each built-in check, as the user meets it.
BUILTIN_BAD_CALLS = {
    "swiglu_mixed_dtypes": (lambda: TF.swiglu(torch.ones(2, 4), torch.ones(2, 4, dtype=torch.float16)),
                            TypeError, r"tilefuse.swiglu: 'a' is Float but 'b' is Half"),
    "swiglu_0d": (lambda: TF.swiglu(torch.tensor(1.0), torch.tensor(1.0)),
                  ValueError, r"tilefuse.swiglu: 'a' must have at least one dimension"),
    "layer_norm_weight_shape": (lambda: TF.layer_norm(torch.ones(2, 4), (4,), torch.ones(3)),
                                ValueError, r"tilefuse.layer_norm: argument 'weight' must have shape \[4\]"),
    "layer_norm_integer_bias": (lambda: TF.layer_norm(torch.ones(2, 4), (4,), torch.ones(4),
                                                      torch.ones(4, dtype=torch.int64)),
                                TypeError, r"tilefuse.layer_norm: argument 'bias' must be a float32"),
    "cross_entropy_no_classes": (lambda: TF.cross_entropy(torch.randn(2, 0), torch.tensor([0, 0])),
                                 ValueError, r"tilefuse.cross_entropy: 'input' must have a class dimension of at least 1"),
    "cross_entropy_int32_target": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, 2], dtype=torch.int32)),
                                   TypeError, r"tilefuse.cross_entropy: 'target' must hold int64 \(or uint8\) class indices or float probabilities, got Int"),
    "cross_entropy_probability_shape": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1.0, 2.0])),
                                        ValueError, r"tilefuse.cross_entropy: probability targets \('target' of a float dtype\) must have the shape of 'input' \[2, 5\], got \[2\]"),
    "cross_entropy_target_shape": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, 2, 3])),
                                   ValueError, r"tilefuse.cross_entropy: 'target' must have shape \[2\] .*, got \[3\]"),
    "cross_entropy_negative_target": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, -3])),
                                      IndexError, r"tilefuse.cross_entropy: target -3 is out of bounds for 5 classes"),
    "cross_entropy_reduction": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, 2]), reduction="avg"),
                                ValueError, r"reduction must be 'none', 'mean' or 'sum', got 'avg'"),
    "cross_entropy_label_smoothing": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, 2]),
                                                               label_smoothing=1.5),
                                      ValueError, r"label_smoothing must be in \[0, 1\], got 1.5"),
    "cross_entropy_weight_shape": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, 2]),
                                                             weight=torch.ones(4)),
                                    ValueError, r"tilefuse.cross_entropy: argument 'weight' must have shape \[5\] \(\[n\]\), got \[4\]"),
    "cross_entropy_size_average": (lambda: TF.cross_entropy(torch.randn(2, 5), torch.tensor([1, 2]),
                                                            size_average=True),
                                   ValueError, r"'size_average' and 'reduce' are deprecated"),
    "adamw_shape_mismatch": (lambda: TF.adamw_step_(_state.clone(), torch.zeros(3, 4), _state.clone(),
                                                    _state.clone(), lr=1e-3, step=1),
                             ValueError, r"tilefuse.adamw_step_: 'grad' has shape \[3, 4\], 'param' has \[4, 3\]"),
    "adamw_dtype_mismatch": (lambda: TF.adamw_step_(_state.clone(), _state.double(), _state.clone(),
                                                    _state.clone(), lr=1e-3, step=1),
                             TypeError, r"tilefuse.adamw_step_: 'grad' is Double, 'param' is Float"),
    "adamw_step_zero": (lambda: TF.adamw_step_(_state.clone(), _state.clone(), _state.clone(),
                                               _state.clone(), lr=1e-3, step=0),
                        ValueError, r"tilefuse.adamw_step_: step must be >= 1, got 0"),
}


@pytest.mark.parametrize("case", BUILTIN_BAD_CALLS)
def test_builtin_bad_call(case):
    call, error, message = BUILTIN_BAD_CALLS[case]
    with pytest.raises(error, match=message):
        call()


@tilefuse.fusion
def identity(x):
    return x


def _trace_with(body):
    """A one-argument fusion whose body is `body(x)`, called on a [2, 4] input."""
    return lambda: tilefuse.fusion(body)(torch.ones(2, 4))


# (call, exception, message): bad DSL calls and bodies.
DSL_BAD_CALLS = {
    "wrong_argument_count": (lambda: identity(torch.ones(2, 4), 1.0),
                             TypeError, r"tilefuse.identity: too many positional arguments"),
    "no_tensor_argument": (lambda: identity(1.0),
                           ValueError, r"tilefuse.identity: needs at least one tensor argument"),
    "unhashable_argument": (lambda: tilefuse.fusion(lambda x, s: x)(torch.ones(2, 4), [1]),
                            TypeError, r"argument 's' must be a tensor, a number or a hashable "
                                       r"trace-time constant, got list"),
    "zero_dim_bool_argument": (lambda: tilefuse.fusion(lambda x, s: x)(torch.ones(2, 4), torch.tensor(True)),
                               TypeError, r"argument 's' is a 0-d bool tensor; pass a Python bool"),
    "unsupported_tensor_dtype": (lambda: identity(torch.ones(2, 4, dtype=torch.int8)),
                                 TypeError, r"tilefuse.identity: argument 'x' has unsupported dtype torch.int8"),
    "shape_fits_no_kind": (lambda: tilefuse.fusion(lambda x, w: x * w)(torch.ones(2, 4), torch.ones(3)),
                           ValueError, r"argument 'w' has shape \[3\]; expected \[2, 4\] \(full\), \[4\] \(per column\)"),
    "mixed_devices": (lambda: tilefuse.fusion(lambda x, w: x * w)(torch.ones(2, 4), torch.ones(4, device="meta")),
                      ValueError, r"argument 'w' is on meta, but 'x' is on cpu"),
    "output_not_traced": (_trace_with(lambda x: 1.0),
                          TypeError, r"output 'out0' is a float, not a traced value"),
    "reduction_dim": (_trace_with(lambda x: tilefuse.sum(x, dim=1)),
                      ValueError, r"tilefuse.sum: dim must be -1 \(over each row\) or 0"),
    "gelu_approximate": (_trace_with(lambda x: tilefuse.gelu(x, approximate="fast")),
                         ValueError, r"tilefuse.gelu: approximate must be 'none' or 'tanh', got 'fast'"),
    "cast_dtype": (_trace_with(lambda x: tilefuse.cast(x, torch.int8)),
                   ValueError, r"tilefuse.cast: unsupported dtype torch.int8"),
    "function_outside_fusion": (lambda: tilefuse.exp(1.0),
                                TypeError, r"tilefuse.exp is only valid inside a @tilefuse.fusion"),
    "iota_outside_fusion": (lambda: tilefuse.iota(),
                            TypeError, r"tilefuse.iota\(\) is only valid inside a @tilefuse.fusion"),
    "operand_type": (_trace_with(lambda x: x + "a"),
                     TypeError, r"cannot trace an operand of type str"),
    "iteration": (_trace_with(lambda x: [v for v in x]),
                  TypeError, r"cannot trace iteration over a traced value"),
    "indexing": (_trace_with(lambda x: x[0]),
                 TypeError, r"cannot trace indexing; use tilefuse.gather"),
    "python_float": (_trace_with(lambda x: float(x)),
                     TypeError, r"cannot trace a traced value used as a Python float"),
    "gather_float_index": (_trace_with(lambda x: tilefuse.gather(x, tilefuse.sum(x))),
                           TypeError, r"tilefuse.gather: index must be an integer value, got torch.float32"),
}


@pytest.mark.parametrize("case", DSL_BAD_CALLS)
def test_dsl_bad_call(case):
    call, error, message = DSL_BAD_CALLS[case]
    with pytest.raises(error, match=message):
        call()
