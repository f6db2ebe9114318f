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
