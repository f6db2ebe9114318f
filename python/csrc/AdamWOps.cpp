//===- AdamWOps.cpp - adamw_step_ as a tilefuse:: op ----------------------===//
//
// One torch.optim.AdamW step (foreach=False) on a parameter and its state,
// in place: the host computes the step's scalars as torch.optim does (in
// Python floats, or in lr's dtype for a tensor lr), the fused kernel
// (kernels_dsl adamw_step, adamw_amsgrad_step) does the rest op for op.
// Options: amsgrad (max_exp_avg_sq), maximize, and f32 state for bf16/f16
// parameters. `lr` is a float or a one-element tensor (the .Tensor
// overload, read on the host: torch.compile keeps a changing lr in one
// graph).
//
//===----------------------------------------------------------------------===//

#include "TorchOpSupport.h"
#include "TorchRunner.h"

#include "tilefuse/Runtime/Fusion.h"
#include "tilefuse/Torch/Ops.h"

#include <ATen/MemoryOverlap.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

using at::Tensor;
using namespace tilefuse::torch_ops;

namespace {

constexpr const char *kOp = "adamw_step_";

/// The hyper-parameters of a step other than lr.
struct AdamWOptions {
  double beta1, beta2, eps, weightDecay;
  bool amsgrad, maximize;
};

/// The tensors of a step, by argument name; max_exp_avg_sq may be undefined.
using NamedTensors = std::array<std::pair<const char *, const Tensor *>, 5>;

NamedTensors namedTensors(const Tensor &param, const Tensor &grad,
                          const Tensor &expAvg, const Tensor &expAvgSq,
                          const Tensor &maxExpAvgSq) {
  return {{{"param", &param},
           {"grad", &grad},
           {"exp_avg", &expAvg},
           {"exp_avg_sq", &expAvgSq},
           {"max_exp_avg_sq", &maxExpAvgSq}}};
}

/// What can be checked without the tensors' data (the Meta kernel too).
void checkAdamW(const NamedTensors &tensors, const c10::SymInt &step,
                const AdamWOptions &options) {
  const Tensor &param = *tensors[0].second;
  const Tensor &expAvg = *tensors[2].second;
  TORCH_CHECK_VALUE(options.amsgrad == tensors[4].second->defined(),
                    "tilefuse.adamw_step_: ",
                    options.amsgrad ? "amsgrad=True needs 'max_exp_avg_sq'"
                                    : "'max_exp_avg_sq' is given but "
                                      "amsgrad=False");
  for (auto [name, tensor] : tensors) {
    if (!tensor->defined())
      continue;
    checkFloat(kOp, name, *tensor);
    TORCH_CHECK_VALUE(tensor->sym_sizes() == param.sym_sizes(), "tilefuse.",
                      kOp, ": '", name, "' has shape ", tensor->sym_sizes(),
                      ", 'param' has ", param.sym_sizes());
    checkSameDevice(kOp, name, *tensor, "param", param);
  }
  TORCH_CHECK_TYPE(tensors[1].second->scalar_type() == param.scalar_type(),
                   "tilefuse.adamw_step_: 'grad' is ",
                   tensors[1].second->scalar_type(), ", 'param' is ",
                   param.scalar_type());
  // The state is in param's dtype, or in float32 for a 16-bit param.
  at::ScalarType state = expAvg.scalar_type();
  bool lowPrecision =
      param.scalar_type() == at::kBFloat16 || param.scalar_type() == at::kHalf;
  TORCH_CHECK_TYPE(state == param.scalar_type() ||
                       (state == at::kFloat && lowPrecision),
                   "tilefuse.adamw_step_: 'exp_avg' is ", state,
                   ", 'param' is ", param.scalar_type(),
                   ": the state must have param's dtype, or float32 for a "
                   "bfloat16 or float16 param");
  for (auto [name, tensor] : {tensors[3], tensors[4]})
    TORCH_CHECK_TYPE(!tensor->defined() || tensor->scalar_type() == state,
                     "tilefuse.adamw_step_: '", name, "' is ",
                     tensor->scalar_type(), " but 'exp_avg' is ", state);
  for (auto [name, tensor] : {tensors[0], tensors[2], tensors[3], tensors[4]})
    TORCH_CHECK_VALUE(!tensor->defined() || tensor->is_contiguous(),
                      "tilefuse.adamw_step_: '", name,
                      "' is updated in place and must be contiguous (a copy "
                      "would not be updated)");
  TORCH_CHECK_VALUE(step >= 1, "tilefuse.adamw_step_: step must be >= 1, got ",
                    step);
  // torch.optim.AdamW's own checks.
  TORCH_CHECK_VALUE(options.beta1 >= 0 && options.beta1 < 1,
                    "tilefuse.adamw_step_: beta1 must be in [0, 1), got ",
                    options.beta1);
  TORCH_CHECK_VALUE(options.beta2 >= 0 && options.beta2 < 1,
                    "tilefuse.adamw_step_: beta2 must be in [0, 1), got ",
                    options.beta2);
  TORCH_CHECK_VALUE(options.eps >= 0,
                    "tilefuse.adamw_step_: eps must be >= 0, got ",
                    options.eps);
  TORCH_CHECK_VALUE(options.weightDecay >= 0,
                    "tilefuse.adamw_step_: weight_decay must be >= 0, got ",
                    options.weightDecay);
  checkFitsComputeType(kOp, "eps", options.eps, param.scalar_type());
  checkFitsComputeType(kOp, "weight_decay", options.weightDecay,
                       param.scalar_type());
}

void checkLr(double lr, at::ScalarType param) {
  TORCH_CHECK_VALUE(lr >= 0, "tilefuse.adamw_step_: lr must be >= 0, got ", lr);
  checkFitsComputeType(kOp, "lr", lr, param);
}

/// The kernel writes what it reads element by element: tensors that share
/// memory would read each other's updates (as PyTorch's in-place ops, it
/// refuses them).
void checkNoOverlap(const NamedTensors &tensors) {
  for (auto [name, tensor] : {tensors[0], tensors[2], tensors[3], tensors[4]})
    TORCH_CHECK_VALUE(!tensor->defined() || at::has_internal_overlap(*tensor) !=
                                                at::MemOverlap::Yes,
                      "tilefuse.adamw_step_: '", name,
                      "' is updated in place and must not overlap itself");
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (size_t j = i + 1; j < tensors.size(); ++j) {
      auto [first, a] = tensors[i];
      auto [second, b] = tensors[j];
      if (!a->defined() || !b->defined())
        continue;
      at::MemOverlapStatus status = at::get_overlap_status(*a, *b);
      TORCH_CHECK_VALUE(status != at::MemOverlapStatus::Full, "tilefuse.", kOp,
                        ": '", first, "' and '", second,
                        "' are the same tensor");
      TORCH_CHECK_VALUE(status != at::MemOverlapStatus::Partial, "tilefuse.",
                        kOp, ": '", first, "' and '", second,
                        "' overlap in memory");
    }
  }
}

BuiltinFusion adamwStepFusion("adamw_step");
BuiltinFusion adamwAmsgradStepFusion("adamw_amsgrad_step");

/// The kernel's scalars for `step`, as torch.optim.AdamW computes them:
/// in Python floats (T = double), except that with a tensor lr,
/// `lr * weight_decay` and `lr / bias_correction1` are ops on lr's dtype T.
template <typename T>
std::vector<c10::Scalar> stepScalars(T lr, const AdamWOptions &options,
                                     int64_t step) {
  double biasCorrection1 = 1 - std::pow(options.beta1, double(step));
  double biasCorrection2 = 1 - std::pow(options.beta2, double(step));
  // Without weight decay PyTorch does not multiply at all.
  T decay =
      options.weightDecay != 0 ? T(1) - lr * T(options.weightDecay) : T(1);
  T stepSize = lr / T(biasCorrection1);
  return {options.maximize ? -1.0 : 1.0,
          double(decay),
          1 - options.beta1,
          options.beta2,
          1 - options.beta2,
          std::pow(biasCorrection2, 0.5),
          options.eps,
          -double(stepSize)};
}

void runStep(const NamedTensors &tensors, std::vector<c10::Scalar> scalars,
             bool amsgrad) {
  const Tensor &param = *tensors[0].second;
  if (param.numel() == 0)
    return;
  // Rows of the last dimension (one row for a 0-d parameter).
  auto rows = [](const Tensor &t) {
    return t.dim() ? t.view({-1, t.size(-1)}) : t.view({1, 1});
  };
  std::vector<Tensor> inputs, updated;
  for (auto [name, tensor] : tensors) {
    if (!tensor->defined())
      continue;
    inputs.push_back(
        rows(tensor == tensors[1].second ? tensor->contiguous() : *tensor));
    if (tensor != tensors[1].second)
      updated.push_back(inputs.back());
  }
  runFusion(
      kOp,
      (amsgrad ? adamwAmsgradStepFusion : adamwStepFusion)(param.scalar_type()),
      inputs, scalars, param.scalar_type(), inputs[0].sizes(), updated,
      /*storagePerTensor=*/true);
}

/// Checks that need no data, for a float lr or a tensor lr.
void checkLrArgument(double lr, at::ScalarType param) { checkLr(lr, param); }

void checkLrArgument(const Tensor &lr, at::ScalarType) {
  TORCH_CHECK_VALUE(lr.numel() == 1,
                    "tilefuse.adamw_step_: a tensor 'lr' must have one "
                    "element, got shape ",
                    lr.sym_sizes());
  TORCH_CHECK_TYPE(lr.scalar_type() == at::kFloat ||
                       lr.scalar_type() == at::kDouble,
                   "tilefuse.adamw_step_: a tensor 'lr' must be float32 or "
                   "float64, got ",
                   lr.scalar_type());
}

std::vector<c10::Scalar> scalarsFor(double lr, at::ScalarType,
                                    const AdamWOptions &options, int64_t step) {
  return stepScalars(lr, options, step);
}

/// A tensor lr is read on the host (a GPU lr waits for the device).
std::vector<c10::Scalar> scalarsFor(const Tensor &lr, at::ScalarType param,
                                    const AdamWOptions &options, int64_t step) {
  if (lr.scalar_type() == at::kFloat) {
    float value = lr.item<float>();
    checkLr(value, param);
    return stepScalars(value, options, step);
  }
  double value = lr.item<double>();
  checkLr(value, param);
  return stepScalars(value, options, step);
}

template <typename Lr>
using AdamWStepOp = void(const Tensor &, const Tensor &, const Tensor &,
                         const Tensor &, const std::optional<Tensor> &, Lr,
                         double, double, double, double, c10::SymInt, bool,
                         bool);

/// adamw_step_ (float lr) and adamw_step_.Tensor, by lr's type.
template <typename Lr>
const c10::TypedOperatorHandle<AdamWStepOp<Lr>> &stepOp() {
  static auto op = findOp<AdamWStepOp<Lr>>(
      "tilefuse::adamw_step_", std::is_same_v<Lr, double> ? "" : "Tensor");
  return op;
}

/// The CPU and CUDA kernel of both overloads.
template <typename Lr>
void adamwStep(const Tensor &param, const Tensor &grad, const Tensor &expAvg,
               const Tensor &expAvgSq, const std::optional<Tensor> &maxExpAvgSq,
               Lr lr, double beta1, double beta2, double eps,
               double weightDecay, c10::SymInt step, bool amsgrad,
               bool maximize) {
  Tensor maxState = maxExpAvgSq ? *maxExpAvgSq : Tensor();
  NamedTensors tensors = namedTensors(param, grad, expAvg, expAvgSq, maxState);
  AdamWOptions options{beta1, beta2, eps, weightDecay, amsgrad, maximize};
  checkAdamW(tensors, step, options);
  checkLrArgument(lr, param.scalar_type());
  checkNoOverlap(tensors);
  runStep(tensors,
          scalarsFor(lr, param.scalar_type(), options, step.expect_int()),
          amsgrad);
}

template <typename Lr>
void adamwStepMeta(const Tensor &param, const Tensor &grad,
                   const Tensor &expAvg, const Tensor &expAvgSq,
                   const std::optional<Tensor> &maxExpAvgSq, Lr lr,
                   double beta1, double beta2, double eps, double weightDecay,
                   c10::SymInt step, bool amsgrad, bool maximize) {
  Tensor maxState = maxExpAvgSq ? *maxExpAvgSq : Tensor();
  checkAdamW(namedTensors(param, grad, expAvg, expAvgSq, maxState), step,
             {beta1, beta2, eps, weightDecay, amsgrad, maximize});
  checkLrArgument(lr, param.scalar_type());
}

/// The step updates tensors autograd may have saved: it bumps their
/// versions, as in-place ops do (inference mode included).
template <typename Lr>
void adamwStepInPlace(const Tensor &param, const Tensor &grad,
                      const Tensor &expAvg, const Tensor &expAvgSq,
                      const std::optional<Tensor> &maxExpAvgSq, Lr lr,
                      double beta1, double beta2, double eps,
                      double weightDecay, c10::SymInt step, bool amsgrad,
                      bool maximize) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    stepOp<Lr>().call(param, grad, expAvg, expAvgSq, maxExpAvgSq, lr, beta1,
                      beta2, eps, weightDecay, step, amsgrad, maximize);
  }
  for (const Tensor *tensor : {&param, &expAvg, &expAvgSq})
    torch::autograd::increment_version(*tensor);
  if (maxExpAvgSq)
    torch::autograd::increment_version(*maxExpAvgSq);
}

/// Not differentiable: like torch.optim's, the step runs in no_grad.
template <typename Lr>
void adamwStepAutograd(const Tensor &param, const Tensor &grad,
                       const Tensor &expAvg, const Tensor &expAvgSq,
                       const std::optional<Tensor> &maxExpAvgSq, Lr lr,
                       double beta1, double beta2, double eps,
                       double weightDecay, c10::SymInt step, bool amsgrad,
                       bool maximize) {
  at::AutoDispatchBelowAutograd below;
  stepOp<Lr>().call(param, grad, expAvg, expAvgSq, maxExpAvgSq, lr, beta1,
                    beta2, eps, weightDecay, step, amsgrad, maximize);
}

} // namespace

//===----------------------------------------------------------------------===//
// The C++ API (Ops.h)
//===----------------------------------------------------------------------===//

void tilefuse::ops::adamw_step_(const at::Tensor &param, const at::Tensor &grad,
                                const at::Tensor &expAvg,
                                const at::Tensor &expAvgSq, double lr,
                                double beta1, double beta2, double eps,
                                double weightDecay, int64_t step,
                                const std::optional<at::Tensor> &maxExpAvgSq,
                                bool maximize) {
  stepOp<double>().call(param, grad, expAvg, expAvgSq, maxExpAvgSq, lr, beta1,
                        beta2, eps, weightDecay, step, maxExpAvgSq.has_value(),
                        maximize);
}

TORCH_LIBRARY_FRAGMENT(tilefuse, m) {
  const char *options = "float beta1=0.9, float beta2=0.999, float eps=1e-08, "
                        "float weight_decay=0.01, SymInt step, "
                        "bool amsgrad=False, bool maximize=False) -> ()";
  const char *tensors = "Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, "
                        "Tensor(c!) exp_avg_sq, "
                        "Tensor(d!)? max_exp_avg_sq=None, *, ";
  for (const char *overload : {"adamw_step_(", "adamw_step_.Tensor("}) {
    bool tensorLr = std::string_view(overload) == "adamw_step_.Tensor(";
    std::string schema = std::string(overload) + tensors +
                         (tensorLr ? "Tensor lr, " : "float lr, ") + options;
    m.def(schema.c_str());
  }
}

#define TILEFUSE_ADAMW_KERNELS(key)                                            \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("adamw_step_", adamwStep<double>);                                  \
    m.impl("adamw_step_.Tensor", adamwStep<const Tensor &>);                   \
  }
TILEFUSE_ADAMW_KERNELS(CPU)
TILEFUSE_ADAMW_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("adamw_step_", adamwStepMeta<double>);
  m.impl("adamw_step_.Tensor", adamwStepMeta<const Tensor &>);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  m.impl("adamw_step_", adamwStepAutograd<double>);
  m.impl("adamw_step_.Tensor", adamwStepAutograd<const Tensor &>);
}

TORCH_LIBRARY_IMPL(tilefuse, ADInplaceOrView, m) {
  m.impl("adamw_step_", adamwStepInPlace<double>);
  m.impl("adamw_step_.Tensor", adamwStepInPlace<const Tensor &>);
}
