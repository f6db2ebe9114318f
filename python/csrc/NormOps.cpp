//===- NormOps.cpp - rms_norm and layer_norm as tilefuse:: ops ------------===//
//
// The public ops (CompositeImplicitAutograd) take torch.nn.functional's
// arguments, with normalized_shape any number of trailing dimensions: they
// flatten those to n, the row length of the fused kernels, and call
//   rms_norm_fwd / rms_norm_bwd, layer_norm_fwd / layer_norm_bwd:
// CPU and CUDA kernels (TorchRunner), Meta kernels, and for *_fwd an
// Autograd kernel whose backward is the fused *_bwd kernel.
//
// RMSNorm's casting modes are those of the model families (see
// python/tilefuse/functional.py); "gemma", everything in f32 and one
// rounding at the end, is how torch.nn.functional.rms_norm computes.
//
//===----------------------------------------------------------------------===//

#include "TorchOpSupport.h"
#include "TorchRunner.h"

#include "tilefuse/Runtime/Fusion.h"
#include "tilefuse/Torch/Ops.h"

#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <limits>

using at::Tensor;
using namespace tilefuse::torch_ops;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

//===----------------------------------------------------------------------===//
// normalized_shape
//===----------------------------------------------------------------------===//

/// The rows view of `input` normalized over its trailing `normalizedShape`
/// dimensions: [..., n] with n their product (symbolic where torch.compile
/// or torch.export marks the hidden size dynamic, as torch's norms take it).
Tensor normalizedRows(const char *op, const Tensor &input,
                      c10::SymIntArrayRef normalizedShape) {
  checkFloat(op, "input", input);
  size_t dims = normalizedShape.size();
  bool trailing = dims >= 1 && dims <= static_cast<size_t>(input.dim());
  c10::SymInt n = 1;
  for (size_t i = 0; trailing && i < dims; ++i) {
    trailing = input.sym_size(input.dim() - dims + i) == normalizedShape[i];
    n *= normalizedShape[i];
  }
  TORCH_CHECK_VALUE(trailing && n != 0, "tilefuse.", op,
                    ": normalized_shape must be the trailing dimensions of "
                    "'input' (shape ",
                    input.sym_sizes(), ") and hold at least one element, got ",
                    normalizedShape);
  c10::SymDimVector rows(input.sym_sizes().begin(),
                         input.sym_sizes().end() - dims);
  rows.push_back(n);
  return input.reshape_symint(rows);
}

/// A weight or bias of shape normalized_shape, as the [n] column the kernels
/// take.
Tensor columnOf(const char *op, const char *name, const Tensor &tensor,
                const Tensor &input, c10::SymIntArrayRef normalizedShape) {
  checkFloat(op, name, tensor);
  TORCH_CHECK_VALUE(tensor.sym_sizes() == normalizedShape, "tilefuse.", op,
                    ": argument '", name, "' must have shape ", normalizedShape,
                    " (normalized_shape), got ", tensor.sym_sizes());
  checkSameDevice(op, name, tensor, "input", input);
  return tensor.reshape({-1});
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

/// Where the forward rounds to the input's dtype (rms_norm_fwd's
/// casting_mode).
enum Casting : int64_t { Gemma = 0, Llama = 1, None = 2 };

void checkCasting(int64_t casting) {
  TORCH_CHECK_VALUE(casting == Gemma || casting == Llama || casting == None,
                    "tilefuse.rms_norm: casting_mode must be 0 (gemma), 1 "
                    "(llama) or 2 (none), got ",
                    casting);
}

/// y's dtype: the input's, or with "llama" casting the promoted dtype of
/// input and weight (`weight * hidden.to(input_dtype)`).
at::ScalarType rmsNormOutputType(const Tensor &x, const Tensor &weight,
                                 int64_t casting) {
  return casting == Llama
             ? at::promoteTypes(x.scalar_type(), weight.scalar_type())
             : x.scalar_type();
}

BuiltinFusion rmsNormFwdFusion("rms_norm_fwd");
BuiltinFusion rmsNormLlamaFwdFusion("rms_norm_llama_fwd");
BuiltinFusion rmsNormNoneFwdFusion("rms_norm_none_fwd");
BuiltinFusion rmsNormBwdFusion("rms_norm_bwd");
BuiltinFusion rmsNormLlamaBwdFusion("rms_norm_llama_bwd");

using RmsNormFwdOp = TensorPair(const Tensor &, const Tensor &, double, double,
                                int64_t);
using RmsNormBwdOp = TensorPair(const Tensor &, const Tensor &, const Tensor &,
                                const Tensor &, double, int64_t);

const c10::TypedOperatorHandle<RmsNormFwdOp> &rmsNormFwdOp() {
  static auto op = findOp<RmsNormFwdOp>("tilefuse::rms_norm_fwd");
  return op;
}

TensorPair rmsNormFwd(const Tensor &x, const Tensor &weight, double eps,
                      double offset, int64_t casting) {
  checkCasting(casting);
  BuiltinFusion &fusion = casting == Gemma   ? rmsNormFwdFusion
                          : casting == Llama ? rmsNormLlamaFwdFusion
                                             : rmsNormNoneFwdFusion;
  Tensor y = at::empty(
      x.sizes(), x.options().dtype(rmsNormOutputType(x, weight, casting)));
  auto out = runFusion("rms_norm", fusion(x.scalar_type()),
                       {x.contiguous(), weight.contiguous()}, {eps, offset},
                       x.scalar_type(), x.sizes(), {y, Tensor()},
                       /*storagePerTensor=*/true);
  return {out[0], out[1]};
}

TensorPair rmsNormFwdMeta(const Tensor &x, const Tensor &weight, double, double,
                          int64_t casting) {
  checkCasting(casting);
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(rmsNormOutputType(
                                              x, weight, casting))),
          emptyRows(x)};
}

TensorPair rmsNormBwd(const Tensor &dy, const Tensor &x, const Tensor &weight,
                      const Tensor &rstd, double offset, int64_t casting) {
  checkCasting(casting);
  BuiltinFusion &fusion =
      casting == Gemma ? rmsNormBwdFusion : rmsNormLlamaBwdFusion;
  Tensor dweight = at::empty(weight.sizes(), weight.options());
  auto out = runFusion(
      "rms_norm", fusion(x.scalar_type()),
      {dy.contiguous(), x.contiguous(), weight.contiguous(), rstd.contiguous()},
      {offset}, x.scalar_type(), x.sizes(), {Tensor(), dweight},
      /*storagePerTensor=*/true);
  return {out[0], out[1]};
}

TensorPair rmsNormBwdMeta(const Tensor &, const Tensor &x, const Tensor &weight,
                          const Tensor &, double, int64_t) {
  return {emptyLike(x), emptyLike(weight)};
}

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static variable_list forward(AutogradContext *ctx, const Tensor &x,
                               const Tensor &weight, double eps, double offset,
                               int64_t casting) {
    const auto &op = rmsNormFwdOp();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, rstd] = op.call(x, weight, eps, offset, casting);
    ctx->save_for_backward({x, weight, rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting"] = casting;
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op = findOp<RmsNormBwdOp>("tilefuse::rms_norm_bwd");
    variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    int64_t casting = ctx->saved_data["casting"].toInt();
    Tensor dy = grads[0].to(rmsNormOutputType(saved[0], saved[1], casting));
    auto [dx, dweight] = op.call(dy, saved[0], saved[1], saved[2],
                                 ctx->saved_data["offset"].toDouble(), casting);
    return {dx, dweight, Tensor(), Tensor(), Tensor()};
  }
};

TensorPair rmsNormFwdAutograd(const Tensor &x, const Tensor &weight, double eps,
                              double offset, int64_t casting) {
  if (!needsGraph("rms_norm", x, weight)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return rmsNormFwdOp().call(x, weight, eps, offset, casting);
  }
  variable_list out = RmsNormFunction::apply(x, weight, eps, offset, casting);
  return {out[0], out[1]};
}

Tensor rmsNorm(const Tensor &input, c10::SymIntArrayRef normalizedShape,
               const std::optional<Tensor> &weight, std::optional<double> eps,
               double offset, c10::string_view castingMode) {
  const char *op = "rms_norm";
  Tensor x = normalizedRows(op, input, normalizedShape);
  std::optional<Casting> casting;
  if (castingMode == "gemma")
    casting = Gemma;
  else if (castingMode == "llama")
    casting = Llama;
  else if (castingMode == "none")
    casting = None;
  TORCH_CHECK_VALUE(casting,
                    "tilefuse.rms_norm: casting_mode must be 'gemma', 'llama' "
                    "or 'none', got '",
                    castingMode, "'");
  Tensor w = weight ? columnOf(op, "weight", *weight, input, normalizedShape)
                    : at::ones_symint({x.sym_size(-1)}, input.options());
  bool float64 = input.scalar_type() == at::kDouble;
  if (*casting == None) {
    w = w.to(input.scalar_type()); // the input's dtype throughout
  } else {
    TORCH_CHECK_TYPE(w.scalar_type() == input.scalar_type() ||
                         (!float64 && w.scalar_type() != at::kDouble),
                     "tilefuse.rms_norm: 'weight' is ", w.scalar_type(),
                     " and 'input' is ", input.scalar_type(),
                     ": float64 mixes only with float64");
  }
  // torch.nn.functional.rms_norm's default: the epsilon of the type it
  // computes in (float32 for float32, bfloat16 and float16 inputs).
  double epsilon =
      eps.value_or(float64 ? std::numeric_limits<double>::epsilon()
                           : std::numeric_limits<float>::epsilon());
  checkFitsComputeType(op, "eps", epsilon, input.scalar_type());
  checkFitsComputeType(op, "offset", offset, input.scalar_type());
  Tensor y = std::get<0>(rmsNormFwdOp().call(x, w, epsilon, offset, *casting));
  return y.view_symint(input.sym_sizes());
}

//===----------------------------------------------------------------------===//
// LayerNorm
//===----------------------------------------------------------------------===//

BuiltinFusion layerNormFwdFusion("layer_norm_fwd");
BuiltinFusion layerNormBwdFusion("layer_norm_bwd");
BuiltinFusion layerNormBwdRecenteredFusion("layer_norm_bwd_recentered");

using LayerNormFwdOp = TensorTriple(const Tensor &, const Tensor &,
                                    const Tensor &, double);

const c10::TypedOperatorHandle<LayerNormFwdOp> &layerNormFwdOp() {
  static auto op = findOp<LayerNormFwdOp>("tilefuse::layer_norm_fwd");
  return op;
}

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
  // f32 and f64 rows are stored precisely enough for the rounding of the
  // saved mean to show (Builtins.cpp, layerNormBackward): their backward is
  // about the row's mean of x, the saved mean only the shift its
  // differences are taken from (a mean that is not the row's, passed to
  // this op, gives the same gradients).
  bool precise = x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
  auto &fusion = precise ? layerNormBwdRecenteredFusion : layerNormBwdFusion;
  auto out = runFusion("layer_norm", fusion(x.scalar_type()),
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

TensorTriple layerNormFwdAutograd(const Tensor &x, const Tensor &weight,
                                  const Tensor &bias, double eps) {
  if (!needsGraph("layer_norm", x, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return layerNormFwdOp().call(x, weight, bias, eps);
  }
  variable_list out = LayerNormFunction::apply(x, weight, bias, eps);
  return {out[0], out[1], out[2]};
}

Tensor layerNorm(const Tensor &input, c10::SymIntArrayRef normalizedShape,
                 const std::optional<Tensor> &weight,
                 const std::optional<Tensor> &bias, double eps) {
  const char *op = "layer_norm";
  Tensor x = normalizedRows(op, input, normalizedShape);
  // The kernels store weight and bias in the input's dtype.
  auto column = [&](const char *name, const std::optional<Tensor> &tensor,
                    double fill) {
    return tensor ? columnOf(op, name, *tensor, input, normalizedShape)
                        .to(input.scalar_type())
                  : at::full_symint({x.sym_size(-1)}, fill, input.options());
  };
  checkFitsComputeType(op, "eps", eps, input.scalar_type());
  Tensor y = std::get<0>(layerNormFwdOp().call(x, column("weight", weight, 1.0),
                                               column("bias", bias, 0.0), eps));
  return y.view_symint(input.sym_sizes());
}

} // namespace

//===----------------------------------------------------------------------===//
// The C++ API (Ops.h)
//===----------------------------------------------------------------------===//

at::Tensor tilefuse::ops::rms_norm(const at::Tensor &input,
                                   at::IntArrayRef normalizedShape,
                                   const std::optional<at::Tensor> &weight,
                                   std::optional<double> eps, double offset,
                                   std::string_view castingMode) {
  static auto op = findOp<Tensor(
      const Tensor &, c10::SymIntArrayRef, const std::optional<Tensor> &,
      std::optional<double>, double, c10::string_view)>("tilefuse::rms_norm");
  return op.call(input, c10::fromIntArrayRefSlow(normalizedShape), weight, eps,
                 offset, castingMode);
}

at::Tensor tilefuse::ops::layer_norm(const at::Tensor &input,
                                     at::IntArrayRef normalizedShape,
                                     const std::optional<at::Tensor> &weight,
                                     const std::optional<at::Tensor> &bias,
                                     double eps) {
  static auto op = findOp<Tensor(
      const Tensor &, c10::SymIntArrayRef, const std::optional<Tensor> &,
      const std::optional<Tensor> &, double)>("tilefuse::layer_norm");
  return op.call(input, c10::fromIntArrayRefSlow(normalizedShape), weight, bias,
                 eps);
}

TORCH_LIBRARY_FRAGMENT(tilefuse, m) {
  m.def(
      "rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, "
      "float? eps=None, *, float offset=0.0, str casting_mode='gemma') -> "
      "Tensor");
  // casting_mode: 0 gemma, 1 llama, 2 none.
  m.def("rms_norm_fwd(Tensor x, Tensor weight, float eps, float offset=0.0, "
        "int casting_mode=0) -> (Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor rstd, "
        "float offset=0.0, int casting_mode=0) -> (Tensor, Tensor)");
  m.def("layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? "
        "weight=None, "
        "Tensor? bias=None, float eps=1e-05) -> Tensor");
  m.def("layer_norm_fwd(Tensor x, Tensor weight, Tensor bias, float eps) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("layer_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor mean, "
        "Tensor rstd) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tilefuse, CompositeImplicitAutograd, m) {
  m.impl("rms_norm", rmsNorm);
  m.impl("layer_norm", layerNorm);
}

// One implementation serves both devices: TorchRunner picks the target.
#define TILEFUSE_NORM_KERNELS(key)                                             \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("rms_norm_fwd", rmsNormFwd);                                        \
    m.impl("rms_norm_bwd", rmsNormBwd);                                        \
    m.impl("layer_norm_fwd", layerNormFwd);                                    \
    m.impl("layer_norm_bwd", layerNormBwd);                                    \
  }
TILEFUSE_NORM_KERNELS(CPU)
TILEFUSE_NORM_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("rms_norm_fwd", rmsNormFwdMeta);
  m.impl("rms_norm_bwd", rmsNormBwdMeta);
  m.impl("layer_norm_fwd", layerNormFwdMeta);
  m.impl("layer_norm_bwd", layerNormBwdMeta);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  // Function::apply only when a gradient is needed: the rest go straight
  // below autograd.
  m.impl("rms_norm_fwd", rmsNormFwdAutograd);
  m.impl("layer_norm_fwd", layerNormFwdAutograd);
  // Backward kernels have no backward: differentiating them raises.
  for (const char *op : {"rms_norm_bwd", "layer_norm_bwd"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
