"""torch.library.opcheck on every tilefuse:: op: the schema matches what
the kernels do (mutation, aliasing), autograd is registered at the Autograd
key, the Meta (fake) kernels give the real kernels' shapes, strides and
dtypes, and AOTDispatcher (torch.compile's dynamic-shape tracing, with the
backward where an input requires grad) gives eager's results.

Each op has at least one sample (test_every_op_has_a_sample enumerates the
namespace); ops with options have one per meaningful variant. Samples are
tiny CPU tensors ([4, 37] rows, 11-class vocabularies), built inside the test
so every run draws them from the seeded generator."""

import functools

import pytest
import torch
from torch.library import opcheck

import tilefuse

ops = torch.ops.tilefuse

UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
         "test_aot_dispatch_dynamic")

ROWS, N, VOCAB = 4, 37, 11


def case(op: str, variant: str, make):
    """A sample: `make()` gives (args, kwargs) for op `op` ("name" or
    "name.overload")."""
    return pytest.param(op, make, id=f"{op}-{variant}")


def overload(op: str) -> torch._ops.OpOverload:
    name, _, overload_name = op.partition(".")
    return getattr(getattr(ops, name), overload_name or "default")


#===----------------------------------------------------------------------===#
# Tensors
#===----------------------------------------------------------------------===#

def rand(*shape, dtype=torch.float32, grad=False):
    return torch.randn(shape, dtype=dtype).requires_grad_(grad)


def rows(grad=False, dtype=torch.float32):
    """[4, 37] rows."""
    return rand(ROWS, N, dtype=dtype, grad=grad)


def column(grad=False, dtype=torch.float32):
    return rand(N, dtype=dtype, grad=grad)


def classes(*lead, n=N, ignored=False):
    """Class indices of shape `lead` (default [4]) in [0, n); with `ignored`,
    the second is -100 (ignore_index)."""
    target = torch.randint(0, n, lead or (ROWS,))
    if ignored:
        target.view(-1)[1] = -100
    return target


def probabilities(*shape, dtype=torch.float32, grad=False):
    """Rows of probabilities (float targets) of shape `shape` (default [4, 37])."""
    return torch.softmax(rand(*(shape or (ROWS, N))), -1).to(dtype).requires_grad_(grad)


def intermediate(tensor):
    """`tensor` as the output of an op (not a leaf), so it may be written in
    place while it requires grad."""
    return tensor * 1


#===----------------------------------------------------------------------===#
# Norms and gated activations
#===----------------------------------------------------------------------===#

def rms_norm_bwd(dtype, weight_dtype, casting):
    x, w = rows(dtype=dtype), column(dtype=weight_dtype)
    y, rstd = ops.rms_norm_fwd(x, w, 1e-6, 0.0, casting)
    return (torch.randn_like(y), x, w, rstd, 0.0, casting), {}


def layer_norm_bwd(dtype):
    x, w, b = rows(dtype=dtype), column(dtype=dtype), column(dtype=dtype)
    _, mean, rstd = ops.layer_norm_fwd(x, w, b, 1e-5)
    return (torch.randn_like(x), x, w, mean, rstd), {}


NORM_CASES = [
    case("rms_norm", "weight-grad", lambda: ((rows(grad=True), [N], column(grad=True)), {})),
    case("rms_norm", "no-weight-eps-none", lambda: ((rows(grad=True), [N]), {})),
    case("rms_norm", "3d-two-dims-normalized", lambda: (
        (rand(2, 3, N, grad=True), [3, N], rand(3, N, grad=True), 1e-5), {})),
    case("rms_norm", "llama-bf16-input-f32-weight", lambda: (
        (rows(grad=True, dtype=torch.bfloat16), [N], column(grad=True), 1e-6),
        {"casting_mode": "llama"})),
    case("rms_norm", "none-casting-offset", lambda: (
        (rows(grad=True, dtype=torch.float16), [N], column(dtype=torch.float16, grad=True)),
        {"casting_mode": "none", "offset": 1.0})),
    case("rms_norm", "f64", lambda: (
        (rows(grad=True, dtype=torch.float64), [N], column(dtype=torch.float64)), {})),
    case("rms_norm_fwd", "gemma-grad", lambda: ((rows(grad=True), column(grad=True), 1e-6), {})),
    case("rms_norm_fwd", "llama-bf16-f32-weight", lambda: (
        (rows(dtype=torch.bfloat16, grad=True), column(grad=True), 1e-6, 0.5, 1), {})),
    case("rms_norm_fwd", "zero-rows", lambda: ((rand(0, N), column(), 1e-6), {})),
    case("rms_norm_fwd", "none-bf16", lambda: (
        (rows(dtype=torch.bfloat16), column(dtype=torch.bfloat16), 1e-6, 0.0, 2), {})),
    case("rms_norm_bwd", "gemma", lambda: rms_norm_bwd(torch.float32, torch.float32, 0)),
    case("rms_norm_bwd", "llama-bf16-f32-weight",
         lambda: rms_norm_bwd(torch.bfloat16, torch.float32, 1)),
    case("layer_norm", "weight-bias-grad", lambda: (
        (rows(grad=True), [N], column(grad=True), column(grad=True)), {})),
    case("layer_norm", "no-weight-no-bias", lambda: ((rows(grad=True), [N]), {"eps": 1e-6})),
    case("layer_norm", "bf16-f32-weight-3d", lambda: (
        (rand(2, 3, N, dtype=torch.bfloat16, grad=True), [N], column(), None), {})),
    case("layer_norm_fwd", "grad", lambda: (
        (rows(grad=True), column(grad=True), column(grad=True), 1e-5), {})),
    case("layer_norm_fwd", "f16", lambda: (
        (rows(dtype=torch.float16), column(dtype=torch.float16), column(dtype=torch.float16),
         1e-5), {})),
    case("layer_norm_bwd", "f32-recentered", lambda: layer_norm_bwd(torch.float32)),
    case("layer_norm_bwd", "bf16", lambda: layer_norm_bwd(torch.bfloat16)),
]

GLU_CASES = [
    case("swiglu", "grad", lambda: ((rows(grad=True), rows(grad=True)), {})),
    case("swiglu", "3d-bf16", lambda: (
        (rand(2, 3, N, dtype=torch.bfloat16, grad=True), rand(2, 3, N, dtype=torch.bfloat16)),
        {})),
    case("swiglu_fwd", "grad", lambda: ((rows(grad=True), rows(grad=True)), {})),
    case("swiglu_fwd", "no-grad", lambda: ((rows(), rows()), {})),
    case("swiglu_bwd", "f32", lambda: ((rows(), rows(), rows()), {})),
    case("geglu", "exact", lambda: ((rows(grad=True), rows(grad=True)), {})),
    case("geglu", "tanh", lambda: ((rows(grad=True), rows(grad=True), "tanh"), {})),
    case("geglu_fwd", "exact-grad", lambda: ((rows(grad=True), rows(grad=True), 0), {})),
    case("geglu_fwd", "tanh-f16", lambda: (
        (rows(dtype=torch.float16), rows(dtype=torch.float16), 1), {})),
    case("geglu_bwd", "exact", lambda: ((rows(), rows(), rows(), 0), {})),
    case("geglu_bwd", "tanh", lambda: ((rows(), rows(), rows(), 1), {})),
]


#===----------------------------------------------------------------------===#
# Cross-entropy
#===----------------------------------------------------------------------===#

NONE, MEAN, SUM = 0, 1, 2


def ce_kernel_options(ignore_index=-100, label_smoothing=0.0, lse_square_scale=0.0,
                      softcap=None, reduction=MEAN):
    """cross_entropy_fwd's trailing arguments, in schema order."""
    return (ignore_index, label_smoothing, lse_square_scale, softcap, reduction)


def ce_fwd(target, weight=None, grad=False, dtype=torch.float32, **options):
    return (rows(grad=grad, dtype=dtype), target, weight, *ce_kernel_options(**options)), {}


def ce_bwd(target, weight=None, softcap=None, reduction=MEAN, **options):
    """cross_entropy_bwd's arguments from a forward with these options."""
    logits = rows()
    opts = ce_kernel_options(softcap=softcap, reduction=reduction, **options)
    _, _, row_max, log_sum, mass = ops.cross_entropy_fwd(logits, target, weight, *opts)
    grad_loss = torch.rand(ROWS) if reduction == NONE else torch.tensor(0.5)
    return (grad_loss, logits, target, weight, row_max, log_sum, mass, *opts), {}


def ce_target_bwd(weight=None, softcap=None, reduction=MEAN, label_smoothing=0.0):
    logits, target = rows(), probabilities()
    opts = ce_kernel_options(label_smoothing=label_smoothing, softcap=softcap,
                             reduction=reduction)
    _, _, row_max, log_sum, _ = ops.cross_entropy_fwd(logits, target, weight, *opts)
    grad_loss = torch.rand(ROWS) if reduction == NONE else torch.tensor(2.0)
    return (grad_loss, logits, target, weight, row_max, log_sum, label_smoothing, softcap,
            reduction), {}


def ce_fwd_grad(target, weight=None, grad=False, **options):
    logits = intermediate(rows(grad=True)) if grad else rows()
    return (logits, target, weight, *ce_kernel_options(**options)), {}


CROSS_ENTROPY_CASES = [
    case("cross_entropy", "indices-mean-grad", lambda: ((rows(grad=True), classes()), {})),
    case("cross_entropy", "class-weights", lambda: (
        (rows(grad=True), classes(), torch.rand(N)), {})),
    case("cross_entropy", "probabilities-grad-both", lambda: (
        (rows(grad=True), probabilities(grad=True)), {})),
    case("cross_entropy", "ignore-index-label-smoothing-sum", lambda: (
        (rows(grad=True), classes(ignored=True), None, -100, "sum", 0.1), {})),
    case("cross_entropy", "reduction-none-softcap", lambda: (
        (rows(grad=True), classes()), {"reduction": "none", "softcap": 5.0})),
    case("cross_entropy", "torch-form-N-C-d", lambda: (
        (rand(2, N, 3, grad=True), classes(2, 3)), {})),
    case("cross_entropy", "lm-form-B-T-V", lambda: (
        (rand(2, 3, N, grad=True), classes(2, 3)), {"reduction": "none"})),
    case("cross_entropy", "bf16", lambda: (
        (rows(grad=True, dtype=torch.bfloat16), classes()), {})),
    case("cross_entropy", "1d-input", lambda: ((rand(N, grad=True), classes(1)[0]), {})),
    case("cross_entropy_with_z_loss", "z-loss", lambda: (
        (rows(grad=True), classes()), {"lse_square_scale": 1e-2})),
    case("cross_entropy_with_z_loss", "z-loss-softcap-weights-none", lambda: (
        (rows(grad=True), classes(), torch.rand(N), -100, "none"),
        {"lse_square_scale": 1e-2, "softcap": 3.0})),
    case("cross_entropy_inplace_backward", "no-grad-no-write", lambda: (
        (rows(), classes()), {})),
    case("cross_entropy_inplace_backward", "grad-writes-input", lambda: (
        (intermediate(rows(grad=True)), classes()), {"lse_square_scale": 1e-3})),
    case("cross_entropy_inplace_backward", "grad-probabilities-sum", lambda: (
        (intermediate(rows(grad=True)), probabilities(), None, -100, "sum"), {})),
    case("cross_entropy_fwd", "mean", lambda: ce_fwd(classes())),
    case("cross_entropy_fwd", "none-grad", lambda: ce_fwd(classes(), grad=True, reduction=NONE)),
    case("cross_entropy_fwd", "sum-weights-grad", lambda: ce_fwd(
        classes(ignored=True), torch.rand(N), grad=True, reduction=SUM)),
    case("cross_entropy_fwd", "probabilities-grad-both", lambda: (
        (rows(grad=True), probabilities(grad=True), None, *ce_kernel_options()), {})),
    case("cross_entropy_fwd", "softcap-z-loss-smoothing-grad", lambda: ce_fwd(
        classes(), grad=True, softcap=4.0, lse_square_scale=1e-2, label_smoothing=0.1)),
    case("cross_entropy_fwd", "bf16-none", lambda: ce_fwd(
        classes(), dtype=torch.bfloat16, reduction=NONE)),
    case("cross_entropy_fwd", "3d-logits-none", lambda: (
        (rand(2, 3, N), classes(2, 3), None, *ce_kernel_options(reduction=NONE)), {})),
    case("cross_entropy_fwd", "zero-rows-none", lambda: (
        (rand(0, N), classes(0), None, *ce_kernel_options(reduction=NONE)), {})),
    case("cross_entropy_bwd", "mean", lambda: ce_bwd(classes())),
    case("cross_entropy_bwd", "none", lambda: ce_bwd(classes(), reduction=NONE)),
    case("cross_entropy_bwd", "sum-weights-ignored", lambda: ce_bwd(
        classes(ignored=True), torch.rand(N), reduction=SUM)),
    case("cross_entropy_bwd", "probabilities-softcap", lambda: ce_bwd(
        probabilities(), softcap=4.0)),
    case("cross_entropy_bwd", "z-loss-smoothing", lambda: ce_bwd(
        classes(), lse_square_scale=1e-2, label_smoothing=0.2)),
    case("cross_entropy_target_bwd", "mean", lambda: ce_target_bwd()),
    case("cross_entropy_target_bwd", "none-weights-softcap", lambda: ce_target_bwd(
        torch.rand(N), softcap=4.0, reduction=NONE, label_smoothing=0.1)),
    case("cross_entropy_weight_bwd", "mean", lambda: ce_target_bwd(torch.rand(N) + 0.5)),
    case("cross_entropy_weight_bwd", "none-softcap-smoothing", lambda: ce_target_bwd(
        torch.rand(N) + 0.5, softcap=4.0, reduction=NONE, label_smoothing=0.1)),
    case("cross_entropy_fwd_grad_", "mean", lambda: ce_fwd_grad(classes())),
    case("cross_entropy_fwd_grad_", "sum-weights-ignored", lambda: ce_fwd_grad(
        classes(ignored=True), torch.rand(N), reduction=SUM)),
    case("cross_entropy_fwd_grad_", "none-probabilities-softcap", lambda: ce_fwd_grad(
        probabilities(), reduction=NONE, softcap=4.0)),
    case("cross_entropy_fwd_grad_", "grad-z-loss", lambda: ce_fwd_grad(
        classes(), grad=True, lse_square_scale=1e-2)),
    case("scale_grad_", "0d", lambda: ((rows(), torch.tensor(0.5)), {})),
    case("scale_grad_", "per-row", lambda: ((rand(2, 3, N), torch.rand(2, 3)), {})),
]


#===----------------------------------------------------------------------===#
# Linear cross-entropy
#===----------------------------------------------------------------------===#

def lce_kernel(target=None, bias=None, ce_weight=None, grad=False, ignore_index=-100,
               label_smoothing=0.0, lse_square_scale=0.0, softcap=None, reduction=MEAN,
               chunk_rows=2, dtype=torch.float32):
    """linear_cross_entropy_fwd's arguments ([4, 37] input, [11, 37] weight;
    two chunks of two rows by default)."""
    target = classes(n=VOCAB) if target is None else target
    return [rand(ROWS, N, dtype=dtype, grad=grad), rand(VOCAB, N, dtype=dtype, grad=grad), bias,
            target, ce_weight, ignore_index, label_smoothing, lse_square_scale, softcap,
            reduction, chunk_rows]


LINEAR_CROSS_ENTROPY_CASES = [
    case("linear_cross_entropy", "mean-grad", lambda: (
        (rand(ROWS, N, grad=True), rand(VOCAB, N, grad=True), classes(n=VOCAB)), {})),
    case("linear_cross_entropy", "bias-ce-weight-ignored-sum", lambda: (
        (rand(ROWS, N, grad=True), rand(VOCAB, N, grad=True), classes(n=VOCAB, ignored=True),
         rand(VOCAB, grad=True), torch.rand(VOCAB), -100, "sum"), {})),
    case("linear_cross_entropy", "probabilities", lambda: (
        (rand(ROWS, N, grad=True), rand(VOCAB, N, grad=True), probabilities(ROWS, VOCAB)), {})),
    case("linear_cross_entropy", "none-3d-chunked", lambda: (
        (rand(2, 3, N, grad=True), rand(VOCAB, N, grad=True), classes(2, 3, n=VOCAB)),
        {"reduction": "none", "chunk_bytes": 2 * VOCAB * 4})),
    case("linear_cross_entropy", "softcap-z-loss-smoothing", lambda: (
        (rand(ROWS, N, grad=True), rand(VOCAB, N), classes(n=VOCAB), None, None, -100, "mean",
         0.1), {"lse_square_scale": 1e-2, "softcap": 5.0})),
    case("linear_cross_entropy", "bf16-chunked", lambda: (
        (rand(ROWS, N, dtype=torch.bfloat16, grad=True),
         rand(VOCAB, N, dtype=torch.bfloat16, grad=True), classes(n=VOCAB)),
        {"chunk_bytes": 2 * VOCAB * 2})),
    case("linear_cross_entropy_fwd", "mean", lambda: (tuple(lce_kernel()), {})),
    case("linear_cross_entropy_fwd", "mean-grad", lambda: (tuple(lce_kernel(grad=True)), {})),
    case("linear_cross_entropy_fwd", "none-grad-bias", lambda: (
        tuple(lce_kernel(grad=True, bias=rand(VOCAB, grad=True), reduction=NONE)), {})),
    case("linear_cross_entropy_fwd", "sum-probabilities-ce-weight", lambda: (
        tuple(lce_kernel(probabilities(ROWS, VOCAB), ce_weight=torch.rand(VOCAB),
                         reduction=SUM)), {})),
    case("linear_cross_entropy_fwd_grad", "input-weight", lambda: (
        (*lce_kernel(), [True, True, False]), {})),
    case("linear_cross_entropy_fwd_grad", "bias-all-softcap", lambda: (
        (*lce_kernel(bias=rand(VOCAB), softcap=5.0, lse_square_scale=1e-2), [True, True, True]),
        {})),
    case("linear_cross_entropy_fwd_grad", "bias-weight-only-bf16", lambda: (
        (*lce_kernel(bias=rand(VOCAB, dtype=torch.bfloat16), dtype=torch.bfloat16,
                     reduction=SUM), [False, True, False]), {})),
    case("linear_cross_entropy_bwd", "none-all", lambda: (
        (torch.rand(ROWS), *lce_kernel(bias=rand(VOCAB), reduction=NONE), [True, True, True]),
        {})),
    case("linear_cross_entropy_bwd", "mean-input-only-no-bias", lambda: (
        (torch.tensor(2.0), *lce_kernel(ce_weight=torch.rand(VOCAB)), [True, False, True]), {})),
]


#===----------------------------------------------------------------------===#
# AdamW
#===----------------------------------------------------------------------===#

def adamw(param_dtype=torch.float32, state_dtype=None, amsgrad=False):
    """param, grad, exp_avg, exp_avg_sq (after a step: not zeros), and
    max_exp_avg_sq with amsgrad."""
    state_dtype = state_dtype or param_dtype
    tensors = [rows(dtype=param_dtype), rows(dtype=param_dtype), rows(dtype=state_dtype),
               rows(dtype=state_dtype).abs()]
    if amsgrad:
        tensors.append(tensors[3] + rows(dtype=state_dtype).abs())
    return tuple(tensors)


ADAMW_CASES = [
    case("adamw_step_", "f32", lambda: (adamw(), {"lr": 1e-2, "step": 1})),
    case("adamw_step_", "no-decay-maximize", lambda: (
        adamw(), {"lr": 1e-2, "step": 7, "weight_decay": 0.0, "maximize": True})),
    case("adamw_step_", "amsgrad", lambda: (
        adamw(amsgrad=True), {"lr": 1e-3, "step": 3, "amsgrad": True, "beta1": 0.8})),
    case("adamw_step_", "bf16-param-f32-state", lambda: (
        adamw(torch.bfloat16, torch.float32), {"lr": 1e-2, "step": 2})),
    case("adamw_step_", "param-requires-grad", lambda: (
        (rows(grad=True), *adamw()[1:]), {"lr": 1e-2, "step": 1})),
    case("adamw_step_", "0d-param", lambda: (
        (rand(), rand(), rand(), rand().abs()), {"lr": 1e-2, "step": 1})),
    case("adamw_step_.Tensor", "f32-lr", lambda: (
        adamw(), {"lr": torch.tensor(1e-2), "step": 1})),
    case("adamw_step_.Tensor", "f64-lr-amsgrad-f64", lambda: (
        adamw(torch.float64, amsgrad=True),
        {"lr": torch.tensor([1e-3], dtype=torch.float64), "step": 4, "amsgrad": True})),
]


#===----------------------------------------------------------------------===#
# DSL fusions: launch_fusion, its derived forward and backward, run_fusion
# (torch.compile's path), launch_multi_tensor, register_fusion
#===----------------------------------------------------------------------===#

@tilefuse.fusion
def axpy(x, y, a):
    return x * a + y


@tilefuse.fusion
def moments(x, w, eps):
    mean = tilefuse.mean(x)
    var = tilefuse.mean((x - mean) * (x - mean))
    return {"normalized": (x - mean) * tilefuse.rsqrt(var + eps) * w, "mean": mean}


@tilefuse.fusion
def compare(x, y):
    return x * y, tilefuse.cast(x > y, torch.int32)


@tilefuse.fusion(inplace={"param": "param"})
def momentum_step(param, grad, lr, beta):
    update = lr * grad * beta
    return {"param": param - update, "update": update}


@tilefuse.fusion
def multi_axpy(x, y, a):
    return x * a + y, tilefuse.cast(x > y, torch.int32)


@tilefuse.fusion(inplace=("param",))
def multi_sgd(param, grad, lr, scale):
    return {"param": param - lr * scale * grad}


def compiled(fusion, *args):
    """The trace of `fusion` for arguments like `args` (traced once)."""
    return fusion._compiled_for(list(args))[0]


@functools.cache
def multi_handle(name: str) -> int:
    """The launch handle of a multi-tensor fusion, traced for the lists
    multi_tensor_args gives."""
    fusion = {"multi_axpy": multi_axpy, "multi_sgd": multi_sgd}[name]
    fusion.multi_tensor(*multi_tensor_args(name)[0])
    (trace,) = fusion._multi_traces.values()
    return trace.handle


def multi_tensor_args(name: str):
    """(the Python call's arguments, the op's lists): three row sets of
    different shapes."""
    shapes = [(5,), (3, 4), (ROWS, N)]
    if name == "multi_axpy":
        xs, ys = [rand(*s) for s in shapes], [rand(*s) for s in shapes]
        return (xs, ys, 0.3), (xs, ys)
    params, grads = [rand(*s) for s in shapes], [rand(*s) for s in shapes]
    return (params, grads, 0.1, torch.tensor(2.0)), (params, grads)


def launch_multi_axpy():
    xs, ys = multi_tensor_args("multi_axpy")[1]
    out = [torch.empty_like(x) for x in xs] + [torch.empty_like(x, dtype=torch.int32)
                                                for x in xs]
    return (multi_handle("multi_axpy"), "ffv", [], out, xs + ys, [0.3], [], None), {}


def launch_multi_sgd(skip_if=None):
    params, grads = multi_tensor_args("multi_sgd")[1]
    return (multi_handle("multi_sgd"), "ufvp", params, [], grads, [0.1], [torch.tensor(2.0)],
            skip_if), {}


def launch_axpy(grad=False, pointer=False):
    x, y = rows(grad=grad), rows(grad=grad)
    a = torch.tensor(0.5) if pointer else 0.5
    handle = compiled(axpy, x, y, a).handle
    return (handle, [x, y], [] if pointer else [a], [a] if pointer else None), {}


def launch_moments(grad=True):
    x, w = rows(grad=grad), column(grad=grad)
    return (compiled(moments, x, w, 1e-5).handle, [x, w], [1e-5]), {}


def launch_compare():
    x, y = rows(), rows()
    return (compiled(compare, x, y).handle, [x, y], []), {}


def launch_momentum():
    """launch_fusion's arguments for a fusion that writes `param` in place
    (launch_fusion writes every output to a new tensor)."""
    param, grad = rows(), rows()
    return (compiled(momentum_step, param, grad, 0.1, 0.9).handle, [param, grad],
            [0.1, 0.9]), {}


def launch_momentum_in_place():
    """launch_fusion_'s: the written `param`, `out` for the other output, the
    tensors read."""
    (handle, (param, grad), scalars), _ = launch_momentum()
    return (handle, [param], [torch.empty_like(grad)], [grad], scalars), {}


def moments_backward(wanted):
    """launch_fusion_backward's arguments for moments: a gradient per output,
    the forward's tensors, the derived forward's outputs (those the backward
    reads)."""
    x, w = rows(), column()
    trace = compiled(moments, x, w, 1e-5)
    outputs = ops.launch_fusion_forward(trace.handle, [x, w], [1e-5])
    derivative = trace.derivative
    forward_outputs = [outputs[i] if i in derivative["saved_outputs"] else None
                       for i in range(len(derivative["forward_outputs"]))]
    gradients = [torch.randn_like(outputs[i]) for i in range(len(trace.outputs))]
    return (trace.handle, wanted, gradients, [x, w], forward_outputs, [1e-5]), {}


def run_moments_backward(wanted):
    """run_fusion_backward's: launch_fusion_backward's, the fusion named by
    its key and the call by run_fusion's layout."""
    (_, _, gradients, tensors, forward_outputs, floats), _ = moments_backward(wanted)
    return (moments._key, "ttf", "()", tensors, floats, [], wanted, gradients,
            forward_outputs), {}


def run_fusion(fusion, differentiable, grad):
    """run_fusion's arguments for a call fusion(tensors..., floats...)."""
    if fusion is moments:
        tensors, floats, layout = [rows(grad=grad), column(grad=grad)], [1e-5], "ttf"
    else:
        tensors, floats, layout = [rows(grad=grad), rows(grad=grad)], [0.5], "ttf"
    return (fusion._key, layout, "()", tensors, floats, [], differentiable), {}


FUSION_CASES = [
    case("launch_fusion", "no-grad", lambda: launch_axpy()),
    case("launch_fusion", "no-grad-pointer-scalar", lambda: launch_axpy(pointer=True)),
    case("launch_fusion", "no-grad-int-output", launch_compare),
    case("launch_fusion", "inplace-handle", launch_momentum),
    case("launch_fusion_", "inplace-output", launch_momentum_in_place),
    case("launch_fusion", "grad-derived-backward", lambda: launch_axpy(grad=True)),
    case("launch_fusion", "grad-row-outputs", lambda: launch_moments()),
    case("launch_fusion_forward", "elementwise", lambda: (
        launch_axpy()[0][:3], {})),
    case("launch_fusion_forward", "row-outputs", lambda: launch_moments(grad=False)),
    case("launch_fusion_backward", "all-inputs", lambda: moments_backward(0b11)),
    case("launch_fusion_backward", "first-input", lambda: moments_backward(0b01)),
    case("run_fusion_backward", "all-inputs", lambda: run_moments_backward(0b11)),
    case("run_fusion_backward", "first-input", lambda: run_moments_backward(0b01)),
    case("run_fusion", "functional", lambda: run_fusion(axpy, False, False)),
    case("run_fusion", "differentiable-grad", lambda: run_fusion(axpy, True, True)),
    case("run_fusion", "differentiable-row-outputs", lambda: run_fusion(moments, True, True)),
    case("launch_multi_tensor", "lists-to-new-outputs", launch_multi_axpy),
    case("launch_multi_tensor", "inplace-pointer-scalar", lambda: launch_multi_sgd()),
    case("launch_multi_tensor", "inplace-skip-if-zero", lambda: launch_multi_sgd(torch.zeros(1))),
    case("launch_multi_tensor", "inplace-skip-if-set", lambda: launch_multi_sgd(torch.ones(1))),
    case("register_fusion", "ir-text", lambda: ((compiled(axpy, rows(), rows(), 0.5).fusion.ir,
                                                 "f32"), {})),
    case("compile_count", "no-arguments", lambda: ((), {})),
]


CASES = (NORM_CASES + GLU_CASES + CROSS_ENTROPY_CASES + LINEAR_CROSS_ENTROPY_CASES + ADAMW_CASES
         + FUSION_CASES)


def describe(result) -> str:
    """An opcheck failure with its cause (the message that says what is
    wrong)."""
    cause = result.__cause__ if isinstance(result, BaseException) else None
    return f"{result!r}" + (f" (caused by {cause!r})" if cause is not None else "")


@pytest.mark.parametrize("op, make", CASES)
def test_opcheck(op, make):
    args, kwargs = make()
    results = opcheck(overload(op), args, kwargs, test_utils=UTILS, raise_exception=False)
    failed = {util: describe(result) for util, result in results.items() if result != "SUCCESS"}
    assert not failed, f"opcheck of tilefuse::{op} failed: {failed}"


def registered_ops() -> set[str]:
    """Every op in the tilefuse namespace, as "name" or "name.overload"."""
    prefix = "tilefuse::"
    return {name[len(prefix):] for name in torch._C._dispatch_get_all_op_names()
            if name.startswith(prefix)}


def test_every_op_has_a_sample():
    sampled = {param.values[0] for param in CASES}
    registered = registered_ops()
    missing = sorted(registered - sampled)
    assert not missing, (f"tilefuse:: ops without an opcheck sample: {missing}; add a case(...) "
                         f"for each to {__name__}")
    unknown = sorted(sampled - registered)
    assert not unknown, f"opcheck samples for ops that are not registered: {unknown}"
