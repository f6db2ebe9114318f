"""The tilefuse:: ops as PyTorch sees them: C++ kernels in the dispatcher
(CPU, CUDA, Meta, Autograd), shape-only tracing, dynamic shapes under
torch.compile, the no-grad fast path, in-place versioning, and DSL fusions'
derived backward kernels."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse
import tilefuse.functional as TF

PUBLIC = ["rms_norm", "layer_norm", "swiglu", "geglu", "cross_entropy"]
KERNELS = ["rms_norm_fwd", "rms_norm_bwd", "layer_norm_fwd", "layer_norm_bwd", "swiglu_fwd",
           "swiglu_bwd", "geglu_fwd", "geglu_bwd", "cross_entropy_fwd", "cross_entropy_bwd",
           "adamw_step_", "adamw_step_.Tensor"]


def has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"tilefuse::{op}", key)


@pytest.mark.parametrize("op", KERNELS)
def test_kernels_registered_for_every_device(op):
    assert all(has_kernel(op, key) for key in ("CPU", "CUDA", "Meta"))


@pytest.mark.parametrize("op", PUBLIC)
def test_public_ops_are_composite(op):
    assert has_kernel(op, "CompositeImplicitAutograd")
    assert has_kernel(f"{op}_fwd", "Autograd")


def test_meta_tensors_give_shapes_and_dtypes():
    x = torch.empty(2, 3, 64, device="meta", dtype=torch.bfloat16)
    w = torch.empty(64, device="meta", dtype=torch.bfloat16)
    y = TF.rms_norm(x, (64,), w)
    assert (y.shape, y.dtype, y.device.type) == ((2, 3, 64), torch.bfloat16, "meta")
    assert TF.layer_norm(x, (64,), w, w).shape == (2, 3, 64)
    assert TF.swiglu(x, x).shape == (2, 3, 64)
    logits = torch.empty(5, 100, device="meta")
    target = torch.empty(5, dtype=torch.int64, device="meta")
    assert TF.cross_entropy(logits, target, reduction="none").shape == (5,)
    assert TF.cross_entropy(logits, target).shape == ()


def test_torch_compile_dynamic_shapes():
    def model(x, w, target):
        h = TF.rms_norm(x, (x.shape[-1],), w, 1e-6)
        return TF.cross_entropy(TF.swiglu(h, h), target)

    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    w = torch.randn(48)
    for rows in (4, 9):
        x, target = torch.randn(rows, 48), torch.randint(0, 48, (rows,))
        torch.testing.assert_close(compiled(x, w, target), model(x, w, target))


def test_torch_compile_in_place_adamw():
    def step(param, grad, exp_avg, exp_avg_sq):
        TF.adamw_step_(param, grad, exp_avg, exp_avg_sq, lr=1e-2, step=1)
        return param.sum()

    tensors = [torch.randn(3, 16) for _ in range(2)] + [torch.zeros(3, 16) for _ in range(2)]
    expected = [t.clone() for t in tensors]
    step(*expected)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(*tensors)
    for got, want in zip(tensors, expected):
        torch.testing.assert_close(got, want)


def test_no_grad_needed_no_graph():
    x, w = torch.randn(2, 8), torch.randn(8)
    assert not TF.rms_norm(x, (8,), w).requires_grad
    y = TF.rms_norm(x, (8,), w.requires_grad_())
    assert y.requires_grad and y.grad_fn is not None
    with torch.no_grad():
        assert not TF.swiglu(x.requires_grad_(), x).requires_grad


def test_adamw_bumps_versions_of_what_it_updates():
    param, grad = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    exp_avg, exp_avg_sq = torch.zeros(4, 8), torch.zeros(4, 8)
    versions = [t._version for t in (param, grad, exp_avg, exp_avg_sq)]
    with torch.no_grad():
        TF.adamw_step_(param, grad, exp_avg, exp_avg_sq, lr=1e-3, step=1)
    assert [t._version for t in (param, grad, exp_avg, exp_avg_sq)] == [
        versions[0] + 1, versions[1], versions[2] + 1, versions[3] + 1]


def test_cross_entropy_mean_of_no_targets_is_nan_like_torch():
    logits, target = torch.randn(3, 7), torch.full((3,), -100)
    assert TF.cross_entropy(logits, target).isnan()
    assert F.cross_entropy(logits, target).isnan()


@tilefuse.fusion
def scaled(x, s):
    return x * s


def test_dsl_zero_dim_scalar_is_read_every_call():
    x = torch.randn(2, 8)
    for value in (2.0, 3.0):
        torch.testing.assert_close(scaled(x, torch.tensor(value)), x * value)


def test_dsl_fusion_backward_is_a_kernel_without_a_backward():
    x = torch.randn(2, 8, requires_grad=True)
    (dx,) = torch.autograd.grad(scaled(x, 2.0).sum(), x, create_graph=True)
    torch.testing.assert_close(dx, torch.full_like(x, 2.0))
    with pytest.raises(RuntimeError, match=r"derivative for tilefuse::launch_fusion_backward "
                                           r"is not implemented"):
        dx.sum().backward()


def test_unknown_fusion_handle():
    with pytest.raises(IndexError, match=r"tilefuse.launch_fusion: no fusion has handle 99999"):
        torch.ops.tilefuse.launch_fusion(99999, [torch.ones(1, 4)], [])


def test_runner_checks_tensors_against_the_kernel():
    fused = torch.ops.tilefuse.swiglu_fwd
    with pytest.raises(ValueError, match=r"tilefuse.swiglu: input 'b' must have shape \[2, 8\]"):
        fused(torch.ones(2, 8), torch.ones(2, 9))
    with pytest.raises(TypeError, match=r"tilefuse.swiglu: input 'b' must be Float"):
        fused(torch.ones(2, 8), torch.ones(2, 8, dtype=torch.float64))


def test_dsl_on_meta_tensors_allocates_only():
    y = scaled(torch.empty(3, 5, device="meta", dtype=torch.float16), 2.0)
    assert (y.shape, y.dtype, y.device.type) == ((3, 5), torch.float16, "meta")


def test_second_order_gradients_raise():
    x = torch.randn(3, 8, requires_grad=True)
    (dx,) = torch.autograd.grad(TF.rms_norm(x, (8,)).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"derivative for tilefuse::rms_norm_bwd is not implemented"):
        dx.sum().backward()


def test_forward_mode_ad_is_refused():
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        x = fwAD.make_dual(torch.randn(2, 8), torch.randn(2, 8))
        with pytest.raises(NotImplementedError, match=r"tilefuse.swiglu: forward-mode AD"):
            TF.swiglu(x, x)


def test_adamw_bumps_versions_in_inference_mode():
    param, grad = torch.randn(2, 8), torch.randn(2, 8)
    exp_avg, exp_avg_sq = torch.zeros(2, 8), torch.zeros(2, 8)
    before = param._version
    with torch.inference_mode():
        TF.adamw_step_(param, grad, exp_avg, exp_avg_sq, lr=1e-3, step=1)
    assert param._version == before + 1


def test_internal_ops_check_their_arguments():
    with pytest.raises(ValueError, match=r"tilefuse.cross_entropy: reduction must be 0 \(none\)"):
        torch.ops.tilefuse.cross_entropy_fwd(torch.randn(2, 5), torch.tensor([0, 1]), -100, 0.0, 7)
    with pytest.raises(ValueError, match=r"tilefuse.rms_norm: the input must have a last dimension"):
        torch.ops.tilefuse.rms_norm_fwd(torch.tensor(1.0), torch.ones(1), 1e-6)


def test_outputs_must_not_depend_on_argument_kinds():
    @tilefuse.fusion
    def shape_shifter(x, y):
        return (x * y, y) if y.kind == "full" else x * y

    shape_shifter(torch.ones(2, 4), torch.ones(2, 4))
    with pytest.raises(TypeError, match=r"a fusion's outputs must not depend on its arguments' kinds"):
        shape_shifter(torch.ones(2, 4), torch.ones(4))


def test_compiled_adamw_does_not_recompile_every_step():
    from torch._dynamo.utils import counters

    def step(param, grad, exp_avg, exp_avg_sq, number):
        TF.adamw_step_(param, grad, exp_avg, exp_avg_sq, lr=1e-3, step=number)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    tensors = [torch.randn(4, 8), torch.randn(4, 8), torch.zeros(4, 8), torch.zeros(4, 8)]
    for number in range(1, 6):
        compiled(*tensors, number)
    # The first new step recompiles with `step` symbolic; later ones reuse it.
    assert counters["stats"]["unique_graphs"] == 2
