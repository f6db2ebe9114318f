//===- TorchOps.cpp - the tilefuse:: ops in PyTorch's dispatcher ----------===//
//
// The built-ins as LibTorch ops, so a call costs one dispatch and no Python:
//   - public ops with the signatures of torch.nn.functional (rms_norm,
//     layer_norm, swiglu, cross_entropy), CompositeImplicitAutograd: they
//     check their arguments, fill in defaults and call
//   - *_fwd / *_bwd ops: CPU and CUDA kernels (TorchRunner), Meta kernels
//     (torch.compile traces with them), and for *_fwd an Autograd kernel
//     whose backward is the fused *_bwd kernel;
//   - adamw_step_, in place;
//   - launch_fusion, which runs a fusion the Python DSL traced or
//     register_fusion parsed from fuse IR text;
//   - compile_count: compilations so far (not counting cache hits).
// Errors are TypeError / ValueError / IndexError naming the op and argument.
//
//===----------------------------------------------------------------------===//

#include "TorchRunner.h"

#include "tilefuse/Runtime/Fusion.h"
#include "tilefuse/Torch/Ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <limits>
#include <numeric>
#include <variant>

using at::Tensor;
using tilefuse::torch_ops::BuiltinFusion;
using tilefuse::torch_ops::runFusion;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

using TensorPair = std::tuple<Tensor, Tensor>;
using TensorTriple = std::tuple<Tensor, Tensor, Tensor>;

//===----------------------------------------------------------------------===//
// Argument checks of the public ops
//===----------------------------------------------------------------------===//

bool isFloatStorage(at::ScalarType type) {
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16 ||
         type == at::kDouble;
}

void checkFloat(const char *op, const char *name, const Tensor &tensor) {
  TORCH_CHECK_TYPE(isFloatStorage(tensor.scalar_type()), "tilefuse.", op,
                   ": argument '", name,
                   "' must be a float32, float16, bfloat16 or float64 "
                   "tensor, got ",
                   tensor.scalar_type());
}

void checkSameDevice(const char *op, const char *name, const Tensor &tensor,
                     const char *referenceName, const Tensor &reference) {
  TORCH_CHECK_VALUE(tensor.device() == reference.device(), "tilefuse.", op,
                    ": argument '", name, "' is on ", tensor.device(),
                    ", but '", referenceName, "' is on ", reference.device());
}

/// A per-column parameter (weight, bias) of an op normalizing `input`.
Tensor checkColumn(const char *op, const char *name, const Tensor &tensor,
                   const Tensor &input, const c10::SymInt &n) {
  checkFloat(op, name, tensor);
  TORCH_CHECK_VALUE(tensor.dim() == 1 && tensor.sym_size(0) == n, "tilefuse.",
                    op, ": argument '", name, "' must have shape [", n,
                    "] ([n]), got ", tensor.sym_sizes());
  checkSameDevice(op, name, tensor, "input", input);
  return tensor.to(input.scalar_type());
}

/// n, after checking that `normalizedShape` is the last dimension.
c10::SymInt normalizedN(const char *op, const Tensor &input,
                        at::IntArrayRef normalizedShape) {
  checkFloat(op, "input", input);
  c10::SymInt n = input.dim() ? input.sym_size(-1) : c10::SymInt(0);
  TORCH_CHECK_VALUE(
      normalizedShape.size() == 1 && n == normalizedShape[0] && n != 0,
      "tilefuse.", op, ": normalized_shape must be the last dimension [", n,
      "] of 'input', got ", normalizedShape);
  return n;
}

c10::SymIntArrayRef leadingSymDims(const Tensor &x) {
  return x.sym_sizes().slice(0, x.dim() - 1);
}

/// The dtype of per-row statistics (rstd, mean, lse, loss): the compute
/// type, f64 for float64 inputs, else f32.
at::ScalarType rowDtype(const Tensor &x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

Tensor emptyRows(const Tensor &x) {
  return at::empty_symint(leadingSymDims(x), x.options().dtype(rowDtype(x)));
}

Tensor emptyLike(const Tensor &x) {
  return at::empty_symint(x.sym_sizes(), x.options());
}

/// Whether a call must record an autograd graph; forward-mode AD (dual
/// tensors) is refused rather than silently dropped.
template <typename... Tensors>
bool needsGraph(const char *op, const Tensors &...tensors) {
  bool dual = (false || ... || tensors._fw_grad(/*level=*/0).defined());
  TORCH_CHECK_NOT_IMPLEMENTED(!dual, "tilefuse.", op,
                              ": forward-mode AD is not supported");
  return torch::autograd::compute_requires_grad(tensors...);
}

template <typename Signature>
c10::TypedOperatorHandle<Signature> findOp(const char *name) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, "")
      .typed<Signature>();
}

/// The built-in fusions the kernels run.
BuiltinFusion rmsNormFwdFusion("rms_norm_fwd");
BuiltinFusion rmsNormBwdFusion("rms_norm_bwd");
BuiltinFusion layerNormFwdFusion("layer_norm_fwd");
BuiltinFusion layerNormBwdFusion("layer_norm_bwd");
BuiltinFusion swigluFwdFusion("swiglu_fwd");
BuiltinFusion swigluBwdFusion("swiglu_bwd");
BuiltinFusion crossEntropyFwdFusion("cross_entropy_fwd");
BuiltinFusion crossEntropyBwdFusion("cross_entropy_bwd");
BuiltinFusion adamwStepFusion("adamw_step");

/// The typed handles the public ops and autograd kernels call through.
using RmsNormFwdOp = TensorPair(const Tensor &, const Tensor &, double);
using LayerNormFwdOp = TensorTriple(const Tensor &, const Tensor &,
                                    const Tensor &, double);
using SwigluFwdOp = Tensor(const Tensor &, const Tensor &);
using CrossEntropyFwdOp = TensorPair(const Tensor &, const Tensor &, int64_t,
                                     double, int64_t);

const c10::TypedOperatorHandle<RmsNormFwdOp> &rmsNormFwdOp() {
  static auto op = findOp<RmsNormFwdOp>("tilefuse::rms_norm_fwd");
  return op;
}
const c10::TypedOperatorHandle<LayerNormFwdOp> &layerNormFwdOp() {
  static auto op = findOp<LayerNormFwdOp>("tilefuse::layer_norm_fwd");
  return op;
}
const c10::TypedOperatorHandle<SwigluFwdOp> &swigluFwdOp() {
  static auto op = findOp<SwigluFwdOp>("tilefuse::swiglu_fwd");
  return op;
}
const c10::TypedOperatorHandle<CrossEntropyFwdOp> &crossEntropyFwdOp() {
  static auto op = findOp<CrossEntropyFwdOp>("tilefuse::cross_entropy_fwd");
  return op;
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

TensorPair rmsNormFwd(const Tensor &x, const Tensor &weight, double eps) {
  auto out = runFusion("rms_norm", rmsNormFwdFusion(x.scalar_type()),
                       {x.contiguous(), weight.contiguous()}, {eps},
                       x.scalar_type(), x.sizes());
  return {out[0], out[1]};
}

TensorPair rmsNormFwdMeta(const Tensor &x, const Tensor &, double) {
  return {emptyLike(x), emptyRows(x)};
}

TensorPair rmsNormBwd(const Tensor &dy, const Tensor &x, const Tensor &weight,
                      const Tensor &rstd) {
  auto out = runFusion(
      "rms_norm", rmsNormBwdFusion(x.scalar_type()),
      {dy.contiguous(), x.contiguous(), weight.contiguous(), rstd.contiguous()},
      {}, x.scalar_type(), x.sizes());
  return {out[0], out[1]};
}

TensorPair rmsNormBwdMeta(const Tensor &, const Tensor &x, const Tensor &weight,
                          const Tensor &) {
  return {emptyLike(x), emptyLike(weight)};
}

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static variable_list forward(AutogradContext *ctx, const Tensor &x,
                               const Tensor &weight, double eps) {
    const auto &op = rmsNormFwdOp();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, rstd] = op.call(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op =
        findOp<TensorPair(const Tensor &, const Tensor &, const Tensor &,
                          const Tensor &)>("tilefuse::rms_norm_bwd");
    variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {Tensor(), Tensor(), Tensor()};
    auto [dx, dweight] = op.call(grads[0].to(saved[0].scalar_type()), saved[0],
                                 saved[1], saved[2]);
    return {dx, dweight, Tensor()};
  }
};

Tensor rmsNorm(const Tensor &input, at::IntArrayRef normalizedShape,
               const std::optional<Tensor> &weight, std::optional<double> eps) {
  const auto &op = rmsNormFwdOp();
  c10::SymInt n = normalizedN("rms_norm", input, normalizedShape);
  Tensor w = weight ? checkColumn("rms_norm", "weight", *weight, input, n)
                    : at::ones_symint({n}, input.options());
  // torch.nn.functional.rms_norm's default: torch.finfo(input.dtype).eps.
  double epsilon = std::numeric_limits<double>::epsilon();
  switch (input.scalar_type()) {
  case at::kHalf:
    epsilon = std::numeric_limits<c10::Half>::epsilon();
    break;
  case at::kBFloat16:
    epsilon = std::numeric_limits<c10::BFloat16>::epsilon();
    break;
  case at::kFloat:
    epsilon = std::numeric_limits<float>::epsilon();
    break;
  default:
    break;
  }
  if (eps)
    epsilon = *eps;
  return std::get<0>(op.call(input, w, epsilon));
}

//===----------------------------------------------------------------------===//
// LayerNorm
//===----------------------------------------------------------------------===//

TensorTriple layerNormFwd(const Tensor &x, const Tensor &weight,
                          const Tensor &bias, double eps) {
  auto out = runFusion("layer_norm", layerNormFwdFusion(x.scalar_type()),
                       {x.contiguous(), weight.contiguous(), bias.contiguous()},
                       {eps}, x.scalar_type(), x.sizes());
  return {out[0], out[1], out[2]};
}

TensorTriple layerNormFwdMeta(const Tensor &x, const Tensor &, const Tensor &,
                              double) {
  return {emptyLike(x), emptyRows(x), emptyRows(x)};
}

TensorTriple layerNormBwd(const Tensor &dy, const Tensor &x,
                          const Tensor &weight, const Tensor &mean,
                          const Tensor &rstd) {
  auto out = runFusion("layer_norm", layerNormBwdFusion(x.scalar_type()),
                       {dy.contiguous(), x.contiguous(), weight.contiguous(),
                        mean.contiguous(), rstd.contiguous()},
                       {}, x.scalar_type(), x.sizes());
  return {out[0], out[1], out[2]};
}

TensorTriple layerNormBwdMeta(const Tensor &, const Tensor &x,
                              const Tensor &weight, const Tensor &,
                              const Tensor &) {
  return {emptyLike(x), emptyLike(weight), emptyLike(weight)};
}

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static variable_list forward(AutogradContext *ctx, const Tensor &x,
                               const Tensor &weight, const Tensor &bias,
                               double eps) {
    const auto &op = layerNormFwdOp();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, mean, rstd] = op.call(x, weight, bias, eps);
    ctx->save_for_backward({x, weight, mean, rstd});
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op =
        findOp<TensorTriple(const Tensor &, const Tensor &, const Tensor &,
                            const Tensor &, const Tensor &)>(
            "tilefuse::layer_norm_bwd");
    variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {Tensor(), Tensor(), Tensor(), Tensor()};
    auto [dx, dweight, dbias] = op.call(grads[0].to(saved[0].scalar_type()),
                                        saved[0], saved[1], saved[2], saved[3]);
    return {dx, dweight, dbias, Tensor()};
  }
};

Tensor layerNorm(const Tensor &input, at::IntArrayRef normalizedShape,
                 const std::optional<Tensor> &weight,
                 const std::optional<Tensor> &bias, double eps) {
  const auto &op = layerNormFwdOp();
  c10::SymInt n = normalizedN("layer_norm", input, normalizedShape);
  Tensor w = weight ? checkColumn("layer_norm", "weight", *weight, input, n)
                    : at::ones_symint({n}, input.options());
  Tensor b = bias ? checkColumn("layer_norm", "bias", *bias, input, n)
                  : at::zeros_symint({n}, input.options());
  return std::get<0>(op.call(input, w, b, eps));
}

//===----------------------------------------------------------------------===//
// SwiGLU
//===----------------------------------------------------------------------===//

Tensor swigluFwd(const Tensor &a, const Tensor &b) {
  return runFusion("swiglu", swigluFwdFusion(a.scalar_type()),
                   {a.contiguous(), b.contiguous()}, {}, a.scalar_type(),
                   a.sizes())[0];
}

Tensor swigluFwdMeta(const Tensor &a, const Tensor &) { return emptyLike(a); }

TensorPair swigluBwd(const Tensor &dc, const Tensor &a, const Tensor &b) {
  auto out = runFusion("swiglu", swigluBwdFusion(a.scalar_type()),
                       {dc.contiguous(), a.contiguous(), b.contiguous()}, {},
                       a.scalar_type(), a.sizes());
  return {out[0], out[1]};
}

TensorPair swigluBwdMeta(const Tensor &, const Tensor &a, const Tensor &b) {
  return {emptyLike(a), emptyLike(b)};
}

struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static Tensor forward(AutogradContext *ctx, const Tensor &a,
                        const Tensor &b) {
    const auto &op = swigluFwdOp();
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({a, b});
    return op.call(a, b);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op =
        findOp<TensorPair(const Tensor &, const Tensor &, const Tensor &)>(
            "tilefuse::swiglu_bwd");
    variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {Tensor(), Tensor()};
    auto [da, db] =
        op.call(grads[0].to(saved[0].scalar_type()), saved[0], saved[1]);
    return {da, db};
  }
};

Tensor swiglu(const Tensor &a, const Tensor &b) {
  const auto &op = swigluFwdOp();
  checkFloat("swiglu", "a", a);
  checkFloat("swiglu", "b", b);
  TORCH_CHECK_VALUE(a.sym_sizes() == b.sym_sizes(),
                    "tilefuse.swiglu: 'a' and 'b' must have the same shape, "
                    "got ",
                    a.sym_sizes(), " and ", b.sym_sizes());
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(),
                   "tilefuse.swiglu: 'a' is ", a.scalar_type(), " but 'b' is ",
                   b.scalar_type());
  TORCH_CHECK_VALUE(a.dim() > 0,
                    "tilefuse.swiglu: 'a' must have at least one dimension");
  checkSameDevice("swiglu", "b", b, "a", a);
  return op.call(a, b);
}

//===----------------------------------------------------------------------===//
// Cross-entropy
//===----------------------------------------------------------------------===//

/// How cross_entropy_fwd reduces the per-row losses (at::Reduction's values).
enum Reduction : int64_t { None = 0, Mean = 1, Sum = 2 };

/// Checks that every target is a class index or ignore_index (on a GPU this
/// waits for the targets) and returns how many are not ignored (on a GPU, as
/// a tensor, on the CPU as a number).
std::variant<int64_t, Tensor>
countTargets(const Tensor &target, int64_t classes, int64_t ignoreIndex) {
  auto outOfRange = [&](int64_t index) {
    TORCH_CHECK_INDEX(false, "tilefuse.cross_entropy: target ", index,
                      " is out of bounds for ", classes, " classes");
  };
  if (target.is_cpu()) {
    Tensor contiguous = target.contiguous();
    const int64_t *data = contiguous.const_data_ptr<int64_t>();
    int64_t counted = 0;
    for (int64_t i = 0, e = contiguous.numel(); i < e; ++i) {
      if (data[i] == ignoreIndex)
        continue;
      if (data[i] < 0 || data[i] >= classes)
        outOfRange(data[i]);
      ++counted;
    }
    return counted;
  }
  Tensor valid = target.ne(ignoreIndex);
  Tensor bad = target.lt(0).logical_or(target.ge(classes)).logical_and(valid);
  if (bad.any().item<bool>())
    outOfRange(target.masked_select(bad)[0].item<int64_t>());
  return valid.sum();
}

/// The per-row losses, or their sum or mean over the targets not ignored.
TensorPair crossEntropyFwd(const Tensor &logits, const Tensor &target,
                           int64_t ignoreIndex, double labelSmoothing,
                           int64_t reduction) {
  TORCH_CHECK_VALUE(logits.dim() == 2,
                    "tilefuse.cross_entropy: 'logits' must "
                    "be [N, C], got shape ",
                    logits.sizes());
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong,
                   "tilefuse.cross_entropy: 'target' must hold int64 class "
                   "indices, got ",
                   target.scalar_type());
  TORCH_CHECK_VALUE(reduction == None || reduction == Mean || reduction == Sum,
                    "tilefuse.cross_entropy: reduction must be 0 (none), 1 "
                    "(mean) or 2 (sum), got ",
                    reduction);
  auto counted = countTargets(target, logits.size(-1), ignoreIndex);
  auto out = runFusion(
      "cross_entropy", crossEntropyFwdFusion(logits.scalar_type()),
      {logits.contiguous(), target.contiguous()}, {ignoreIndex, labelSmoothing},
      logits.scalar_type(), logits.sizes());
  Tensor loss = out[0];
  if (reduction == None)
    return {loss, out[1]};
  if (loss.is_cpu()) {
    // Reduced here rather than by three more dispatches.
    double total = 0;
    if (loss.scalar_type() == at::kDouble) {
      const double *rows = loss.const_data_ptr<double>();
      total = std::accumulate(rows, rows + loss.numel(), 0.0);
    } else {
      const float *rows = loss.const_data_ptr<float>();
      total = std::accumulate(rows, rows + loss.numel(), 0.0);
    }
    if (reduction == Mean)
      total /= static_cast<double>(std::get<int64_t>(counted));
    return {at::scalar_tensor(total, loss.options()), out[1]};
  }
  Tensor total = loss.sum();
  return {reduction == Mean ? total.div(std::get<Tensor>(counted)) : total,
          out[1]};
}

TensorPair crossEntropyFwdMeta(const Tensor &logits, const Tensor &, int64_t,
                               double, int64_t reduction) {
  Tensor loss = reduction == None
                    ? emptyRows(logits)
                    : at::empty({}, logits.options().dtype(rowDtype(logits)));
  return {loss, emptyRows(logits)};
}

Tensor crossEntropyBwd(const Tensor &logits, const Tensor &target,
                       const Tensor &lse, const Tensor &dloss,
                       int64_t ignoreIndex, double labelSmoothing) {
  return runFusion("cross_entropy", crossEntropyBwdFusion(logits.scalar_type()),
                   {logits.contiguous(), target.contiguous(), lse.contiguous(),
                    dloss.to(rowDtype(logits)).contiguous()},
                   {ignoreIndex, labelSmoothing}, logits.scalar_type(),
                   logits.sizes())[0];
}

Tensor crossEntropyBwdMeta(const Tensor &logits, const Tensor &, const Tensor &,
                           const Tensor &, int64_t, double) {
  return emptyLike(logits);
}

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static variable_list forward(AutogradContext *ctx, const Tensor &logits,
                               const Tensor &target, int64_t ignoreIndex,
                               double labelSmoothing, int64_t reduction) {
    const auto &op = crossEntropyFwdOp();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, lse] =
        op.call(logits, target, ignoreIndex, labelSmoothing, reduction);
    ctx->save_for_backward({logits, target, lse});
    ctx->saved_data["ignore_index"] = ignoreIndex;
    ctx->saved_data["label_smoothing"] = labelSmoothing;
    ctx->saved_data["reduction"] = reduction;
    ctx->mark_non_differentiable({lse});
    return {loss, lse};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op =
        findOp<Tensor(const Tensor &, const Tensor &, const Tensor &,
                      const Tensor &, int64_t, double)>(
            "tilefuse::cross_entropy_bwd");
    variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    const Tensor &target = saved[1];
    int64_t ignoreIndex = ctx->saved_data["ignore_index"].toInt();
    // The upstream gradient of each row's loss.
    Tensor dloss = grads[0];
    switch (ctx->saved_data["reduction"].toInt()) {
    case Mean:
      dloss = dloss.expand(target.sizes()).div(target.ne(ignoreIndex).sum());
      break;
    case Sum:
      dloss = dloss.expand(target.sizes());
      break;
    default:
      break;
    }
    Tensor dlogits = op.call(saved[0], target, saved[2], dloss, ignoreIndex,
                             ctx->saved_data["label_smoothing"].toDouble());
    return {dlogits, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor crossEntropy(const Tensor &input, const Tensor &target,
                    const std::optional<Tensor> &weight, int64_t ignoreIndex,
                    c10::string_view reduction, double labelSmoothing) {
  const auto &op = crossEntropyFwdOp();
  const char *name = "cross_entropy";
  checkFloat(name, "input", input);
  TORCH_CHECK_VALUE(!weight, "tilefuse.cross_entropy: class weights ('weight') "
                             "are not supported");
  TORCH_CHECK_VALUE(reduction == "none" || reduction == "mean" ||
                        reduction == "sum",
                    "tilefuse.cross_entropy: reduction must be 'none', 'mean' "
                    "or 'sum', got '",
                    reduction, "'");
  TORCH_CHECK_VALUE(labelSmoothing >= 0.0 && labelSmoothing <= 1.0,
                    "tilefuse.cross_entropy: label_smoothing must be in [0, "
                    "1], got ",
                    labelSmoothing);
  TORCH_CHECK_VALUE(input.dim() == 2,
                    "tilefuse.cross_entropy: 'input' must be [N, C] logits, "
                    "got shape ",
                    input.sym_sizes());
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong,
                   "tilefuse.cross_entropy: 'target' must hold int64 class "
                   "indices, got ",
                   target.scalar_type());
  TORCH_CHECK_VALUE(target.dim() == 1 &&
                        target.sym_size(0) == input.sym_size(0),
                    "tilefuse.cross_entropy: 'target' must have shape [",
                    input.sym_size(0), "], got ", target.sym_sizes());
  checkSameDevice(name, "target", target, "input", input);
  Reduction mode = reduction == "none" ? None : reduction == "sum" ? Sum : Mean;
  return std::get<0>(op.call(input, target, ignoreIndex, labelSmoothing, mode))
      .to(input.scalar_type());
}

//===----------------------------------------------------------------------===//
// AdamW
//===----------------------------------------------------------------------===//

void checkAdamW(const Tensor &param, const Tensor &grad, const Tensor &expAvg,
                const Tensor &expAvgSq, const c10::SymInt &step) {
  const char *op = "adamw_step_";
  std::pair<const char *, const Tensor *> tensors[] = {
      {"param", &param},
      {"grad", &grad},
      {"exp_avg", &expAvg},
      {"exp_avg_sq", &expAvgSq}};
  for (auto [name, tensor] : tensors) {
    checkFloat(op, name, *tensor);
    TORCH_CHECK_VALUE(tensor->sym_sizes() == param.sym_sizes(), "tilefuse.", op,
                      ": '", name, "' has shape ", tensor->sym_sizes(),
                      ", 'param' has ", param.sym_sizes());
    TORCH_CHECK_TYPE(tensor->scalar_type() == param.scalar_type(), "tilefuse.",
                     op, ": '", name, "' is ", tensor->scalar_type(),
                     ", 'param' is ", param.scalar_type());
    checkSameDevice(op, name, *tensor, "param", param);
  }
  for (auto [name, tensor] : {tensors[0], tensors[2], tensors[3]})
    TORCH_CHECK_VALUE(tensor->is_contiguous(), "tilefuse.", op, ": '", name,
                      "' is updated in place and must be contiguous (a copy "
                      "would not be updated)");
  TORCH_CHECK_VALUE(step >= 1, "tilefuse.", op, ": step must be >= 1, got ",
                    step);
}

void adamwStep(const Tensor &param, const Tensor &grad, const Tensor &expAvg,
               const Tensor &expAvgSq, double lr, double beta1, double beta2,
               double eps, double weightDecay, c10::SymInt step) {
  checkAdamW(param, grad, expAvg, expAvgSq, step);
  if (param.numel() == 0)
    return;
  // Rows of the last dimension (one row for a 0-d parameter).
  auto rows = [](const Tensor &t) {
    return t.dim() ? t.view({-1, t.size(-1)}) : t.view({1, 1});
  };
  Tensor flatParam = rows(param);
  runFusion("adamw_step_", adamwStepFusion(param.scalar_type()),
            {flatParam, rows(grad.contiguous()), rows(expAvg), rows(expAvgSq)},
            {lr, beta1, beta2, eps, weightDecay,
             static_cast<double>(step.expect_int())},
            param.scalar_type(), flatParam.sizes(),
            {flatParam, rows(expAvg), rows(expAvgSq)});
}

void adamwStepMeta(const Tensor &param, const Tensor &grad,
                   const Tensor &expAvg, const Tensor &expAvgSq, double, double,
                   double, double, double, c10::SymInt step) {
  checkAdamW(param, grad, expAvg, expAvgSq, step);
}

using AdamWStepOp = void(const Tensor &, const Tensor &, const Tensor &,
                         const Tensor &, double, double, double, double, double,
                         c10::SymInt);

const c10::TypedOperatorHandle<AdamWStepOp> &adamwStepOp() {
  static auto op = findOp<AdamWStepOp>("tilefuse::adamw_step_");
  return op;
}

/// The step updates tensors autograd may have saved: it bumps their
/// versions, as in-place ops do (inference mode included).
void adamwStepInPlace(const Tensor &param, const Tensor &grad,
                      const Tensor &expAvg, const Tensor &expAvgSq, double lr,
                      double beta1, double beta2, double eps,
                      double weightDecay, c10::SymInt step) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    adamwStepOp().call(param, grad, expAvg, expAvgSq, lr, beta1, beta2, eps,
                       weightDecay, step);
  }
  for (const Tensor *tensor : {&param, &expAvg, &expAvgSq})
    torch::autograd::increment_version(*tensor);
}

/// Not differentiable: like torch.optim's, the step runs in no_grad.
void adamwStepAutograd(const Tensor &param, const Tensor &grad,
                       const Tensor &expAvg, const Tensor &expAvgSq, double lr,
                       double beta1, double beta2, double eps,
                       double weightDecay, c10::SymInt step) {
  at::AutoDispatchBelowAutograd below;
  adamwStepOp().call(param, grad, expAvg, expAvgSq, lr, beta1, beta2, eps,
                     weightDecay, step);
}

//===----------------------------------------------------------------------===//
// DSL fusions: launch_fusion runs one; under autograd it runs the fusion's
// derived forward (which also outputs the per-row statistics the backward
// reads) and records launch_fusion_backward, the derived backward kernel
// for the inputs that need gradients. launch_fusion_forward and
// launch_fusion_backward have Meta kernels, so torch.compile traces both.
//===----------------------------------------------------------------------===//

using tilefuse::Fusion;
using tilefuse::FusionDerivative;
using tilefuse::PortInfo;
using tilefuse::torch_ops::RegisteredFusion;
using tilefuse::torch_ops::registeredFusion;

/// The tensor whose shape is the iteration space: the fusion's first full
/// input among `tensors` (its full, per-row and per-column inputs).
const Tensor &iterationTensor(const Fusion &fusion, at::TensorList tensors) {
  const Tensor *tensor = tensors.begin();
  for (const PortInfo &port : fusion.inputs()) {
    if (port.kind == PortInfo::Kind::Full)
      break;
    if (port.kind != PortInfo::Kind::Scalar)
      ++tensor;
  }
  TORCH_CHECK_VALUE(tensor < tensors.end(), "tilefuse.", fusion.name(),
                    ": expected a full [..., n] tensor input");
  return *tensor;
}

FusionDerivative &derivativeOf(Fusion &fusion) {
  llvm::Expected<FusionDerivative &> derivative = fusion.derivative();
  TORCH_CHECK(static_cast<bool>(derivative), "tilefuse.", fusion.name(),
              ": cannot derive the backward: ",
              llvm::toString(derivative.takeError()));
  return *derivative;
}

/// Empty tensors shaped as `fusion`'s outputs over `shape`, typed as the
/// registration stores them.
std::vector<Tensor> emptyOutputs(const RegisteredFusion &registered,
                                 const Fusion &fusion,
                                 c10::SymIntArrayRef shape,
                                 const at::TensorOptions &options) {
  c10::SymIntArrayRef lead = shape.slice(0, shape.size() - 1);
  std::vector<Tensor> outputs;
  for (const PortInfo &port : fusion.outputs()) {
    std::vector<c10::SymInt> sizes(lead.begin(), lead.end());
    if (port.kind == PortInfo::Kind::Full)
      sizes.push_back(shape.back());
    if (port.kind == PortInfo::Kind::Col)
      sizes = {shape.back()};
    outputs.push_back(
        at::empty_symint(sizes, options.dtype(registered.dtypeOf(port))));
  }
  return outputs;
}

/// Runs `kernel` (the registered fusion or one of its derived kernels) over
/// the iteration space of the fusion called with `inputs`; errors name it.
std::vector<Tensor> runDsl(const RegisteredFusion &registered, Fusion &kernel,
                           at::TensorList tensors,
                           c10::ArrayRef<c10::Scalar> scalars,
                           at::TensorList inputs) {
  return runFusion(registered.fusion.name(), kernel, tensors, scalars,
                   registered.storage,
                   iterationTensor(registered.fusion, inputs).sizes());
}

/// Runs a fusion the DSL traced. `scalarTensors` are the scalars it reads
/// through pointers, in order; outputs written in place go to their inputs'
/// tensors.
std::vector<Tensor> launchFusion(int64_t handle, at::TensorList tensors,
                                 c10::ArrayRef<c10::Scalar> scalars,
                                 std::optional<at::TensorList> scalarTensorList) {
  RegisteredFusion registered = registeredFusion("launch_fusion", handle);
  Fusion &fusion = registered.fusion;
  at::TensorList scalarTensors = scalarTensorList.value_or(at::TensorList());
  const std::vector<PortInfo> &ports = fusion.inputs();
  std::vector<std::optional<Tensor>> scalarSlots;
  if (!registered.pointerScalars.empty()) {
    const Tensor *scalarTensor = scalarTensors.begin();
    for (auto [i, port] : llvm::enumerate(ports)) {
      if (port.kind != PortInfo::Kind::Scalar)
        continue;
      bool pointer = registered.pointerScalars[i];
      TORCH_CHECK_VALUE(!pointer || scalarTensor < scalarTensors.end(),
                        "tilefuse.", fusion.name(), ": scalar '", port.name,
                        "' expects a tensor");
      scalarSlots.push_back(pointer ? std::optional<Tensor>(*scalarTensor++)
                                    : std::nullopt);
    }
  }
  std::vector<Tensor> out;
  if (!registered.inplace.empty()) {
    // Each input's position among the tensors (-1 for scalars).
    std::vector<int64_t> tensorIndex;
    int64_t next = 0;
    for (const PortInfo &port : ports)
      tensorIndex.push_back(port.kind == PortInfo::Kind::Scalar ? -1 : next++);
    out.resize(fusion.outputs().size());
    for (auto [output, input] : registered.inplace) {
      TORCH_CHECK_VALUE(tensorIndex[input] >= 0 &&
                            tensorIndex[input] < int64_t(tensors.size()),
                        "tilefuse.", fusion.name(), ": input ", input,
                        " is not a tensor");
      out[output] = tensors[tensorIndex[input]];
    }
  }
  return runFusion(fusion.name(), fusion, tensors, scalars, registered.storage,
                   iterationTensor(fusion, tensors).sizes(), out, scalarSlots);
}

/// The derived forward: the fusion's outputs, then the saved statistics.
std::vector<Tensor> launchFusionForward(int64_t handle, at::TensorList tensors,
                                        c10::ArrayRef<c10::Scalar> scalars) {
  RegisteredFusion registered =
      registeredFusion("launch_fusion_forward", handle);
  return runDsl(registered, derivativeOf(registered.fusion).forward(), tensors,
                scalars, tensors);
}

std::vector<Tensor> launchFusionForwardMeta(int64_t handle,
                                            at::TensorList tensors,
                                            c10::ArrayRef<c10::Scalar>) {
  RegisteredFusion registered =
      registeredFusion("launch_fusion_forward", handle);
  return emptyOutputs(registered, derivativeOf(registered.fusion).forward(),
                      iterationTensor(registered.fusion, tensors).sym_sizes(),
                      tensors.front().options());
}

/// Which differentiable inputs `wanted` (bit i: differentiable()[i]) asks
/// the gradients of.
std::vector<bool> wantedInputs(const FusionDerivative &derivative,
                               int64_t wanted) {
  std::vector<bool> flags;
  for (size_t i = 0; i < derivative.differentiable().size(); ++i)
    flags.push_back(wanted >> i & 1);
  return flags;
}

/// The gradients of the inputs `wanted` asks for, in input order, from the
/// gradients of every output, the forward's tensor inputs and scalars, and
/// the derived forward's outputs (only those the backward reads need be
/// defined).
std::vector<Tensor>
launchFusionBackward(int64_t handle, int64_t wanted, at::TensorList gradients,
                     at::TensorList tensors,
                     const c10::List<std::optional<Tensor>> &forwardOutputs,
                     c10::ArrayRef<c10::Scalar> scalars) {
  RegisteredFusion registered =
      registeredFusion("launch_fusion_backward", handle);
  Fusion &fusion = registered.fusion;
  FusionDerivative &derivative = derivativeOf(fusion);
  TORCH_CHECK(gradients.size() == fusion.outputs().size(), "tilefuse.",
              fusion.name(), ": expected a gradient for each of its ",
              fusion.outputs().size(), " outputs, got ", gradients.size());
  // Where each forward input sits among `tensors` or `scalars`.
  std::vector<size_t> positions;
  size_t tensorCount = 0, scalarCount = 0;
  for (const PortInfo &port : fusion.inputs())
    positions.push_back(port.kind == PortInfo::Kind::Scalar ? scalarCount++
                                                            : tensorCount++);
  std::vector<Tensor> backwardTensors;
  std::vector<c10::Scalar> backwardScalars;
  for (const FusionDerivative::Source &source : derivative.backwardInputs()) {
    switch (source.kind) {
    case FusionDerivative::Source::OutputGradient: {
      const PortInfo &port = fusion.outputs()[source.index];
      backwardTensors.push_back(
          gradients[source.index].to(registered.dtypeOf(port)).contiguous());
      break;
    }
    case FusionDerivative::Source::Input:
      if (fusion.inputs()[source.index].kind == PortInfo::Kind::Scalar)
        backwardScalars.push_back(scalars[positions[source.index]]);
      else
        backwardTensors.push_back(tensors[positions[source.index]]);
      break;
    case FusionDerivative::Source::ForwardOutput: {
      std::optional<Tensor> saved = forwardOutputs.get(source.index);
      TORCH_CHECK(saved && saved->defined(), "tilefuse.", fusion.name(),
                  ": the backward reads output #", source.index,
                  " of the derived forward, which is missing");
      backwardTensors.push_back(*saved);
      break;
    }
    }
  }
  llvm::Expected<Fusion &> backward =
      derivative.backward(wantedInputs(derivative, wanted));
  TORCH_CHECK(static_cast<bool>(backward), "tilefuse.", fusion.name(), ": ",
              llvm::toString(backward.takeError()));
  return runDsl(registered, *backward, backwardTensors, backwardScalars,
                tensors);
}

std::vector<Tensor>
launchFusionBackwardMeta(int64_t handle, int64_t wanted, at::TensorList,
                         at::TensorList tensors,
                         const c10::List<std::optional<Tensor>> &,
                         c10::ArrayRef<c10::Scalar>) {
  Fusion &fusion = registeredFusion("launch_fusion_backward", handle).fusion;
  FusionDerivative &derivative = derivativeOf(fusion);
  std::vector<size_t> positions;
  size_t tensorCount = 0;
  for (const PortInfo &port : fusion.inputs())
    positions.push_back(port.kind == PortInfo::Kind::Scalar ? 0 : tensorCount++);
  std::vector<Tensor> gradients;
  std::vector<bool> flags = wantedInputs(derivative, wanted);
  for (auto [index, input] : llvm::enumerate(derivative.differentiable()))
    if (flags[index])
      gradients.push_back(emptyLike(tensors[positions[input]]));
  return gradients;
}

using LaunchBackwardOp =
    std::vector<Tensor>(int64_t, int64_t, at::TensorList, at::TensorList,
                        const c10::List<std::optional<Tensor>> &,
                        c10::ArrayRef<c10::Scalar>);

/// Autograd of a DSL fusion: the derived forward, then the derived backward
/// for the inputs that need gradients (every float output's gradient, zeros
/// where autograd has none).
struct FusionFunction : torch::autograd::Function<FusionFunction> {
  static variable_list forward(AutogradContext *ctx, int64_t handle,
                               at::TensorList tensors,
                               c10::ArrayRef<c10::Scalar> scalars) {
    static auto op = findOp<std::vector<Tensor>(
        int64_t, at::TensorList, c10::ArrayRef<c10::Scalar>)>(
        "tilefuse::launch_fusion_forward");
    Fusion &fusion = registeredFusion("launch_fusion", handle).fusion;
    FusionDerivative &derivative = derivativeOf(fusion);
    std::vector<Tensor> outputs;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      outputs = op.call(handle, tensors, scalars);
    }
    // Keep the forward's inputs and the outputs the backward reads.
    variable_list saved(tensors.begin(), tensors.end());
    for (size_t index : derivative.savedOutputs())
      saved.push_back(outputs[index]);
    ctx->save_for_backward(saved);
    ctx->saved_data["handle"] = handle;
    ctx->saved_data["tensors"] = static_cast<int64_t>(tensors.size());
    c10::impl::GenericList scalarList(c10::AnyType::get());
    for (const c10::Scalar &scalar : scalars)
      scalarList.push_back(scalar);
    ctx->saved_data["scalars"] = scalarList;
    outputs.resize(fusion.outputs().size());
    for (const Tensor &output : outputs)
      if (!at::isFloatingType(output.scalar_type()))
        ctx->mark_non_differentiable({output});
    return outputs;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op = findOp<LaunchBackwardOp>("tilefuse::launch_fusion_backward");
    int64_t handle = ctx->saved_data["handle"].toInt();
    FusionDerivative &derivative =
        derivativeOf(registeredFusion("launch_fusion", handle).fusion);
    variable_list saved = ctx->get_saved_variables();
    size_t count = ctx->saved_data["tensors"].toInt();
    std::vector<Tensor> tensors(saved.begin(), saved.begin() + count);
    c10::List<std::optional<Tensor>> forwardOutputs;
    forwardOutputs.resize(derivative.forward().outputs().size());
    for (auto [index, output] : llvm::enumerate(derivative.savedOutputs()))
      forwardOutputs.set(output, saved[count + index]);
    std::vector<c10::Scalar> scalars;
    for (const c10::IValue &scalar : ctx->saved_data["scalars"].toList())
      scalars.push_back(scalar.toScalar());
    // The gradients of the tensors that need them: bit i of `wanted` for
    // differentiable input i.
    std::vector<size_t> tensorOf;
    size_t tensorCount = 0;
    for (const PortInfo &port :
         registeredFusion("launch_fusion", handle).fusion.inputs())
      tensorOf.push_back(port.kind == PortInfo::Kind::Scalar ? SIZE_MAX
                                                             : tensorCount++);
    int64_t wanted = 0;
    for (auto [index, input] : llvm::enumerate(derivative.differentiable()))
      if (ctx->needs_input_grad(tensorOf[input]))
        wanted |= int64_t(1) << index;
    variable_list result(count + 2);
    if (!wanted)
      return result;
    // Integer outputs have no gradient; materialized zeros stand in.
    std::vector<Tensor> gradients(grads.begin(), grads.end());
    std::vector<Tensor> computed = op.call(handle, wanted, gradients, tensors,
                                           forwardOutputs, scalars);
    auto next = computed.begin();
    for (auto [index, input] : llvm::enumerate(derivative.differentiable()))
      if (wanted >> index & 1)
        result[1 + tensorOf[input]] = *next++;
    return result;
  }
};

std::vector<Tensor>
launchFusionAutograd(int64_t handle, at::TensorList tensors,
                     c10::ArrayRef<c10::Scalar> scalars,
                     std::optional<at::TensorList> scalarTensors) {
  static auto op =
      findOp<std::vector<Tensor>(int64_t, at::TensorList,
                                 c10::ArrayRef<c10::Scalar>,
                                 std::optional<at::TensorList>)>(
          "tilefuse::launch_fusion");
  bool dual = llvm::any_of(tensors, [](const Tensor &tensor) {
    return tensor._fw_grad(/*level=*/0).defined();
  });
  TORCH_CHECK_NOT_IMPLEMENTED(!dual, "tilefuse.launch_fusion: forward-mode AD "
                                     "is not supported");
  RegisteredFusion registered = registeredFusion("launch_fusion", handle);
  Fusion &fusion = registered.fusion;
  bool floatOutput = llvm::any_of(fusion.outputs(), [](const PortInfo &port) {
    return at::isFloatingType(tilefuse::torch_ops::scalarType(port.dtype));
  });
  bool graph = torch::autograd::compute_requires_grad(tensors) && floatOutput;
  if (!registered.inplace.empty()) {
    // A fusion writing in place is not differentiable: it overwrites what a
    // graph would need (as torch refuses in-place ops on leaves that need a
    // gradient).
    TORCH_CHECK(!graph, "tilefuse.", fusion.name(),
                ": writes in place and is not differentiable; call it under "
                "torch.no_grad() or on tensors that do not require grad");
    std::vector<Tensor> outputs;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      outputs = op.call(handle, tensors, scalars, scalarTensors);
    }
    // Tensors written in place: a new version, as torch's in-place ops.
    for (auto [output, input] : registered.inplace)
      torch::autograd::increment_version(outputs[output]);
    return outputs;
  }
  if (!graph) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(handle, tensors, scalars, scalarTensors);
  }
  TORCH_CHECK_VALUE(!scalarTensors || scalarTensors->empty(), "tilefuse.",
                    fusion.name(),
                    ": a differentiated call takes its scalars as numbers");
  return FusionFunction::apply(handle, tensors, scalars);
}

/// A fusion written as fuse IR text (Fusion::ir(), test/lit/fusions), for
/// processes without the Python extension: the self-contained library on a
/// machine that has only PyTorch. Returns a handle for launch_fusion.
int64_t registerFusion(c10::string_view ir, c10::string_view storage) {
  auto fusion = tilefuse::Fusion::parse(llvm::StringRef(ir.data(), ir.size()));
  TORCH_CHECK_VALUE(static_cast<bool>(fusion),
                    "tilefuse.register_fusion: argument 'ir': ",
                    llvm::toString(fusion.takeError()));
  std::string name(storage.data(), storage.size());
  bool isStorage = llvm::is_contained({"f32", "f16", "bf16", "f64"}, name);
  TORCH_CHECK_TYPE(isStorage,
                   "tilefuse.register_fusion: storage dtype must be f32, f16, "
                   "bf16 or f64, got ",
                   name);
  return tilefuse::torch_ops::registerFusion(
      std::move(*fusion), tilefuse::torch_ops::scalarType(name));
}

} // namespace

//===----------------------------------------------------------------------===//
// The C++ API (Ops.h): the public ops, through the dispatcher
//===----------------------------------------------------------------------===//

at::Tensor tilefuse::ops::rms_norm(const at::Tensor &input,
                                   at::IntArrayRef normalizedShape,
                                   const std::optional<at::Tensor> &weight,
                                   std::optional<double> eps) {
  static auto op =
      findOp<Tensor(const Tensor &, at::IntArrayRef,
                    const std::optional<Tensor> &, std::optional<double>)>(
          "tilefuse::rms_norm");
  return op.call(input, normalizedShape, weight, eps);
}

at::Tensor tilefuse::ops::layer_norm(const at::Tensor &input,
                                     at::IntArrayRef normalizedShape,
                                     const std::optional<at::Tensor> &weight,
                                     const std::optional<at::Tensor> &bias,
                                     double eps) {
  static auto op = findOp<Tensor(
      const Tensor &, at::IntArrayRef, const std::optional<Tensor> &,
      const std::optional<Tensor> &, double)>("tilefuse::layer_norm");
  return op.call(input, normalizedShape, weight, bias, eps);
}

at::Tensor tilefuse::ops::swiglu(const at::Tensor &a, const at::Tensor &b) {
  static auto op =
      findOp<Tensor(const Tensor &, const Tensor &)>("tilefuse::swiglu");
  return op.call(a, b);
}

at::Tensor tilefuse::ops::cross_entropy(const at::Tensor &input,
                                        const at::Tensor &target,
                                        int64_t ignoreIndex,
                                        std::string_view reduction,
                                        double labelSmoothing) {
  static auto op = findOp<Tensor(
      const Tensor &, const Tensor &, const std::optional<Tensor> &, int64_t,
      c10::string_view, double)>("tilefuse::cross_entropy");
  return op.call(input, target, std::nullopt, ignoreIndex, reduction,
                 labelSmoothing);
}

void tilefuse::ops::adamw_step_(const at::Tensor &param, const at::Tensor &grad,
                                const at::Tensor &expAvg,
                                const at::Tensor &expAvgSq, double lr,
                                double beta1, double beta2, double eps,
                                double weightDecay, int64_t step) {
  adamwStepOp().call(param, grad, expAvg, expAvgSq, lr, beta1, beta2, eps,
                     weightDecay, step);
}

TORCH_LIBRARY(tilefuse, m) {
  m.def("rms_norm(Tensor input, int[1] normalized_shape, Tensor? weight=None, "
        "float? eps=None) -> Tensor");
  m.def("rms_norm_fwd(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> "
        "(Tensor, Tensor)");
  m.def(
      "layer_norm(Tensor input, int[1] normalized_shape, Tensor? weight=None, "
      "Tensor? bias=None, float eps=1e-05) -> Tensor");
  m.def("layer_norm_fwd(Tensor x, Tensor weight, Tensor bias, float eps) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("layer_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean, "
        "Tensor rstd) -> (Tensor, Tensor, Tensor)");
  m.def("swiglu(Tensor a, Tensor b) -> Tensor");
  m.def("swiglu_fwd(Tensor a, Tensor b) -> Tensor");
  m.def("swiglu_bwd(Tensor dc, Tensor a, Tensor b) -> (Tensor, Tensor)");
  m.def("cross_entropy(Tensor input, Tensor target, Tensor? weight=None, "
        "int ignore_index=-100, str reduction='mean', "
        "float label_smoothing=0.0) -> Tensor");
  // reduction: 0 none, 1 mean, 2 sum (at::Reduction).
  m.def("cross_entropy_fwd(Tensor logits, Tensor target, int ignore_index, "
        "float label_smoothing, int reduction) -> (Tensor, Tensor)");
  m.def("cross_entropy_bwd(Tensor logits, Tensor target, Tensor lse, "
        "Tensor dloss, int ignore_index, float label_smoothing) -> Tensor");
  m.def("adamw_step_(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, "
        "Tensor(c!) exp_avg_sq, *, float lr, float beta1=0.9, "
        "float beta2=0.999, float eps=1e-08, float weight_decay=0.01, "
        "SymInt step) -> ()");
  m.def("launch_fusion(int fusion, Tensor[] tensors, Scalar[] scalars, "
        "Tensor[]? scalar_tensors=None) -> Tensor[]");
  m.def("launch_fusion_forward(int fusion, Tensor[] tensors, Scalar[] scalars) "
        "-> Tensor[]");
  m.def("launch_fusion_backward(int fusion, int wanted, Tensor[] gradients, "
        "Tensor[] tensors, Tensor?[] forward_outputs, Scalar[] scalars) -> "
        "Tensor[]");
  m.def("register_fusion(str ir, str storage) -> int", registerFusion);
  m.def("compile_count() -> int",
        [] { return tilefuse::Runtime::global().compileCount(); });
}

TORCH_LIBRARY_IMPL(tilefuse, CompositeImplicitAutograd, m) {
  m.impl("rms_norm", rmsNorm);
  m.impl("layer_norm", layerNorm);
  m.impl("swiglu", swiglu);
  m.impl("cross_entropy", crossEntropy);
}

// One implementation serves both devices: TorchRunner picks the target.
#define TILEFUSE_DEVICE_KERNELS(key)                                           \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("rms_norm_fwd", rmsNormFwd);                                        \
    m.impl("rms_norm_bwd", rmsNormBwd);                                        \
    m.impl("layer_norm_fwd", layerNormFwd);                                    \
    m.impl("layer_norm_bwd", layerNormBwd);                                    \
    m.impl("swiglu_fwd", swigluFwd);                                           \
    m.impl("swiglu_bwd", swigluBwd);                                           \
    m.impl("cross_entropy_fwd", crossEntropyFwd);                              \
    m.impl("cross_entropy_bwd", crossEntropyBwd);                              \
    m.impl("adamw_step_", adamwStep);                                          \
    m.impl("launch_fusion", launchFusion);                                     \
    m.impl("launch_fusion_forward", launchFusionForward);                      \
    m.impl("launch_fusion_backward", launchFusionBackward);                    \
  }
TILEFUSE_DEVICE_KERNELS(CPU)
TILEFUSE_DEVICE_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("rms_norm_fwd", rmsNormFwdMeta);
  m.impl("rms_norm_bwd", rmsNormBwdMeta);
  m.impl("layer_norm_fwd", layerNormFwdMeta);
  m.impl("layer_norm_bwd", layerNormBwdMeta);
  m.impl("swiglu_fwd", swigluFwdMeta);
  m.impl("swiglu_bwd", swigluBwdMeta);
  m.impl("cross_entropy_fwd", crossEntropyFwdMeta);
  m.impl("cross_entropy_bwd", crossEntropyBwdMeta);
  m.impl("adamw_step_", adamwStepMeta);
  m.impl("launch_fusion_forward", launchFusionForwardMeta);
  m.impl("launch_fusion_backward", launchFusionBackwardMeta);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  // Function::apply only when a gradient is needed: the rest go straight
  // below autograd.
  m.impl("rms_norm_fwd", [](const Tensor &x, const Tensor &weight, double eps) {
    if (!needsGraph("rms_norm", x, weight)) {
      at::AutoDispatchBelowADInplaceOrView below;
      return rmsNormFwdOp().call(x, weight, eps);
    }
    variable_list out = RmsNormFunction::apply(x, weight, eps);
    return TensorPair(out[0], out[1]);
  });
  m.impl("layer_norm_fwd", [](const Tensor &x, const Tensor &weight,
                              const Tensor &bias, double eps) {
    if (!needsGraph("layer_norm", x, weight, bias)) {
      at::AutoDispatchBelowADInplaceOrView below;
      return layerNormFwdOp().call(x, weight, bias, eps);
    }
    variable_list out = LayerNormFunction::apply(x, weight, bias, eps);
    return TensorTriple(out[0], out[1], out[2]);
  });
  m.impl("swiglu_fwd", [](const Tensor &a, const Tensor &b) {
    if (!needsGraph("swiglu", a, b)) {
      at::AutoDispatchBelowADInplaceOrView below;
      return swigluFwdOp().call(a, b);
    }
    return SwigluFunction::apply(a, b);
  });
  m.impl("cross_entropy_fwd", [](const Tensor &logits, const Tensor &target,
                                 int64_t ignoreIndex, double labelSmoothing,
                                 int64_t reduction) {
    if (!needsGraph("cross_entropy", logits)) {
      at::AutoDispatchBelowADInplaceOrView below;
      return crossEntropyFwdOp().call(logits, target, ignoreIndex,
                                      labelSmoothing, reduction);
    }
    variable_list out = CrossEntropyFunction::apply(logits, target, ignoreIndex,
                                                    labelSmoothing, reduction);
    return TensorPair(out[0], out[1]);
  });
  m.impl("adamw_step_", adamwStepAutograd);
  m.impl("launch_fusion", launchFusionAutograd);
  // Backward kernels have no backward: differentiating them raises.
  for (const char *op :
       {"rms_norm_bwd", "layer_norm_bwd", "swiglu_bwd", "cross_entropy_bwd",
        "launch_fusion_forward", "launch_fusion_backward"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}

TORCH_LIBRARY_IMPL(tilefuse, ADInplaceOrView, m) {
  m.impl("adamw_step_", adamwStepInPlace);
}
