//===- TorchOpSupport.h - what the tilefuse:: op files share ----*- C++ -*-===//
//
// Argument checks with errors that name the op and the argument, output
// allocation, the autograd decision and op lookup, for the files that
// register the tilefuse:: ops (TorchOps.cpp, NormOps.cpp, GluOps.cpp,
// AdamWOps.cpp, CrossEntropyOps.cpp, LinearCrossEntropyOps.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_PYTHON_TORCHOPSUPPORT_H
#define TILEFUSE_PYTHON_TORCHOPSUPPORT_H

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <tuple>

namespace tilefuse::torch_ops {

using TensorPair = std::tuple<at::Tensor, at::Tensor>;
using TensorTriple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

inline bool isFloatStorage(at::ScalarType type) {
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16 ||
         type == at::kDouble;
}

inline void checkFloat(const char *op, const char *name,
                       const at::Tensor &tensor) {
  TORCH_CHECK_TYPE(isFloatStorage(tensor.scalar_type()), "tilefuse.", op,
                   ": argument '", name,
                   "' must be a float32, float16, bfloat16 or float64 "
                   "tensor, got ",
                   tensor.scalar_type());
}

inline void checkSameDevice(const char *op, const char *name,
                            const at::Tensor &tensor, const char *referenceName,
                            const at::Tensor &reference) {
  TORCH_CHECK_VALUE(tensor.device() == reference.device(), "tilefuse.", op,
                    ": argument '", name, "' is on ", tensor.device(),
                    ", but '", referenceName, "' is on ", reference.device());
}

/// A per-column parameter (a bias, class weights) of an op on `input`, in
/// the input's dtype.
inline at::Tensor checkColumn(const char *op, const char *name,
                              const at::Tensor &tensor, const at::Tensor &input,
                              const c10::SymInt &n) {
  checkFloat(op, name, tensor);
  TORCH_CHECK_VALUE(tensor.dim() == 1 && tensor.sym_size(0) == n, "tilefuse.",
                    op, ": argument '", name, "' must have shape [", n,
                    "] ([n]), got ", tensor.sym_sizes());
  checkSameDevice(op, name, tensor, "input", input);
  return tensor.to(input.scalar_type());
}

/// A float argument of an op computing in f32 (any input but float64) must
/// fit in f32: it would become infinity in the kernel.
inline void checkFitsComputeType(const char *op, const char *name, double value,
                                 at::ScalarType input) {
  TORCH_CHECK_VALUE(input == at::kDouble || !std::isfinite(value) ||
                        std::abs(value) <= FLT_MAX,
                    "tilefuse.", op, ": ", name, " = ", value,
                    " is out of range for float32, the type ", input,
                    " tensors compute in");
}

inline c10::SymIntArrayRef leadingSymDims(const at::Tensor &x) {
  return x.sym_sizes().slice(0, x.dim() - 1);
}

/// The dtype of per-row statistics (rstd, mean, lse, loss): the compute
/// type, f64 for float64 inputs, else f32.
inline at::ScalarType rowDtype(const at::Tensor &x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline at::Tensor emptyRows(const at::Tensor &x) {
  return at::empty_symint(leadingSymDims(x), x.options().dtype(rowDtype(x)));
}

inline at::Tensor emptyLike(const at::Tensor &x) {
  return at::empty_symint(x.sym_sizes(), x.options());
}

inline bool hasTangent(const at::Tensor &tensor) {
  return tensor._fw_grad(/*level=*/0).defined();
}
inline bool hasTangent(at::TensorList tensors) {
  return std::any_of(
      tensors.begin(), tensors.end(),
      [](const at::Tensor &tensor) { return hasTangent(tensor); });
}

/// Whether a call on `tensors` (tensors or lists of them) must record an
/// autograd graph; forward-mode AD (dual tensors) is refused rather than
/// silently dropped.
template <typename... Tensors>
bool needsGraph(const char *op, const Tensors &...tensors) {
  bool dual = (false || ... || hasTangent(tensors));
  TORCH_CHECK_NOT_IMPLEMENTED(!dual, "tilefuse.", op,
                              ": forward-mode AD is not supported");
  return torch::autograd::compute_requires_grad(tensors...);
}

template <typename Signature>
c10::TypedOperatorHandle<Signature> findOp(const char *name,
                                           const char *overload = "") {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, overload)
      .typed<Signature>();
}

} // namespace tilefuse::torch_ops

#endif // TILEFUSE_PYTHON_TORCHOPSUPPORT_H
