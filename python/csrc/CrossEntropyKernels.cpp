//===- CrossEntropyKernels.cpp - running the cross-entropy fusions --------===//

#include "CrossEntropyKernels.h"
#include "TorchOpSupport.h"
#include "TorchRunner.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>

#include <cmath>

using at::Tensor;
using namespace tilefuse::torch_ops;
using namespace tilefuse::torch_ops::cross_entropy;

namespace {

enum Stage { Forward = 0, Backward = 1, ForwardGrad = 2 };

/// The fusions, by (targets, soft-capped, stage); targets: class indices,
/// class indices with class weights, probabilities (which take weights).
BuiltinFusion kernelTable[] = {
    BuiltinFusion("cross_entropy_fwd"),
    BuiltinFusion("cross_entropy_bwd"),
    BuiltinFusion("cross_entropy_fwd_grad"),
    BuiltinFusion("cross_entropy_capped_fwd"),
    BuiltinFusion("cross_entropy_capped_bwd"),
    BuiltinFusion("cross_entropy_capped_fwd_grad"),
    BuiltinFusion("cross_entropy_weighted_fwd"),
    BuiltinFusion("cross_entropy_weighted_bwd"),
    BuiltinFusion("cross_entropy_weighted_fwd_grad"),
    BuiltinFusion("cross_entropy_weighted_capped_fwd"),
    BuiltinFusion("cross_entropy_weighted_capped_bwd"),
    BuiltinFusion("cross_entropy_weighted_capped_fwd_grad"),
    BuiltinFusion("cross_entropy_probs_fwd"),
    BuiltinFusion("cross_entropy_probs_bwd"),
    BuiltinFusion("cross_entropy_probs_fwd_grad"),
    BuiltinFusion("cross_entropy_probs_capped_fwd"),
    BuiltinFusion("cross_entropy_probs_capped_bwd"),
    BuiltinFusion("cross_entropy_probs_capped_fwd_grad"),
};

/// Runs the kernel of `stage` for these targets and options: its tensors
/// are the logits, the targets, the class weights and each row's target
/// weight (when weighted; probabilities take no target weight), then
/// `rowInputs`; its scalars ignore_index (class indices), label_smoothing,
/// lse_square_scale, and softcap and 1 / softcap (when capped).
std::vector<Tensor> runKernel(const char *op, Stage stage, const Tensor &logits,
                              const Tensor &target, const Targets &targets,
                              const Options &options,
                              std::initializer_list<Tensor> rowInputs,
                              at::TensorList out = {}) {
  int form = targets.probs ? 2 : targets.weighted ? 1 : 0;
  int index = form * 6 + options.softcap.has_value() * 3 + stage;
  std::vector<Tensor> tensors{logits.contiguous(), target.contiguous()};
  if (targets.weighted)
    tensors.push_back(targets.classWeight);
  if (targets.weighted && !targets.probs)
    tensors.push_back(targets.targetWeight);
  for (const Tensor &row : rowInputs)
    tensors.push_back(row.contiguous());
  std::vector<c10::Scalar> scalars;
  if (!targets.probs)
    scalars.emplace_back(options.ignoreIndex);
  scalars.emplace_back(options.labelSmoothing);
  scalars.emplace_back(options.lseSquareScale);
  if (options.softcap) {
    scalars.emplace_back(*options.softcap);
    scalars.emplace_back(1.0 / *options.softcap);
  }
  at::ScalarType storage = logits.scalar_type();
  return runFusion(op, kernelTable[index](storage), tensors, scalars, storage,
                   logits.sizes(), out);
}

/// The class weights of probabilities when none are given. On the CPU
/// filled here: ATen's
/// fill runs a parallel region (its threads then spin) for a few hundred
/// kilobytes.
Tensor ones(int64_t classes, const at::TensorOptions &options) {
  if (!options.device().is_cpu())
    return at::ones({classes}, options);
  Tensor weight = at::empty({classes}, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, weight.scalar_type(), "ones", [&] {
        std::fill_n(weight.mutable_data_ptr<scalar_t>(), classes, scalar_t(1));
      });
  return weight;
}

[[noreturn]] void outOfRange(const char *op, int64_t index, int64_t classes) {
  TORCH_CHECK_INDEX(false, "tilefuse.", op, ": target ", index,
                    " is out of bounds for ", classes, " classes");
  __builtin_unreachable();
}

/// Class-index targets on the CPU: one pass over them, which also checks
/// them (it costs nothing here).
void prepareHostTargets(const char *op, Targets &targets, const Tensor &target,
                        bool weighted, int64_t classes, int64_t ignoreIndex) {
  Tensor indices = target.contiguous();
  const int64_t *index = indices.const_data_ptr<int64_t>();
  Tensor hostWeight = weighted ? targets.classWeight.to(at::kDouble) : Tensor();
  const double *weight =
      weighted ? hostWeight.const_data_ptr<double>() : nullptr;
  double total = 0;
  int64_t counted = 0;
  AT_DISPATCH_FLOATING_TYPES(
      targets.targetWeight.scalar_type(), "prepareTargets", [&] {
        scalar_t *rowWeight = targets.targetWeight.mutable_data_ptr<scalar_t>();
        for (int64_t i = 0, e = indices.numel(); i < e; ++i) {
          int64_t t = index[i];
          if (t == ignoreIndex) {
            rowWeight[i] = 0;
            continue;
          }
          if (t < 0 || t >= classes)
            outOfRange(op, t, classes);
          rowWeight[i] = weighted ? static_cast<scalar_t>(weight[t]) : 1;
          total += rowWeight[i];
          ++counted;
        }
      });
  auto options = targets.targetWeight.options();
  targets.weightTotal = at::scalar_tensor(total, options);
  targets.count = at::scalar_tensor(static_cast<double>(counted), options);
}

} // namespace

Reduction cross_entropy::parseReduction(const char *op,
                                        c10::string_view reduction) {
  TORCH_CHECK_VALUE(
      reduction == "none" || reduction == "mean" || reduction == "sum",
      "tilefuse.", op, ": reduction must be 'none', 'mean' or 'sum', got '",
      reduction, "'");
  return reduction == "none" ? None : reduction == "sum" ? Sum : Mean;
}

Reduction cross_entropy::checkReduction(const char *op, int64_t reduction) {
  TORCH_CHECK_VALUE(
      reduction == None || reduction == Mean || reduction == Sum, "tilefuse.",
      op, ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ", reduction);
  return static_cast<Reduction>(reduction);
}

void cross_entropy::checkOptions(const char *op, const Options &options,
                                 bool probs) {
  TORCH_CHECK_VALUE(
      options.labelSmoothing >= 0.0 && options.labelSmoothing <= 1.0,
      "tilefuse.", op, ": label_smoothing must be in [0, 1], got ",
      options.labelSmoothing);
  // The kernels take 1 / softcap too, a float32 at float32 compute.
  TORCH_CHECK_VALUE(!options.softcap ||
                        (std::isfinite(*options.softcap) &&
                         *options.softcap >=
                             1.0 / std::numeric_limits<float>::max()),
                    "tilefuse.", op,
                    ": softcap must be a positive number (at least 1 / "
                    "FLT_MAX, 2.9e-39) or None, got ",
                    options.softcap.value_or(0.0));
  TORCH_CHECK_VALUE(!probs || options.ignoreIndex < 0, "tilefuse.", op,
                    ": ignore_index is not supported with probability targets "
                    "(as in torch), got ignore_index=",
                    options.ignoreIndex);
}

Targets Targets::rows(int64_t start, int64_t length) const {
  Targets slice = *this;
  if (!probs)
    slice.targetWeight = targetWeight.narrow(0, start, length);
  return slice;
}

Targets cross_entropy::prepareTargets(const char *op, const Tensor &target,
                                      const std::optional<Tensor> &weight,
                                      int64_t ignoreIndex, int64_t classes,
                                      const at::TensorOptions &logits,
                                      bool check) {
  Targets targets;
  targets.probs = at::isFloatingType(target.scalar_type());
  targets.gpu = runsGPUCode(op, logits.device());
  targets.weighted = targets.probs || weight.has_value();
  auto rowOptions =
      logits.dtype(logits.dtype() == at::kDouble ? at::kDouble : at::kFloat);
  if (targets.weighted)
    targets.classWeight = weight ? weight->contiguous() : ones(classes, logits);
  if (targets.probs) {
    // torch divides the 'mean' of probability targets by the rows.
    targets.weightTotal = at::scalar_tensor(
        static_cast<double>(target.numel() / classes), rowOptions);
    targets.count = targets.weightTotal;
    return targets;
  }
  if (!targets.gpu) {
    targets.targetWeight = at::empty(target.sizes(), rowOptions);
    prepareHostTargets(op, targets, target, weight.has_value(), classes,
                       ignoreIndex);
    return targets;
  }
  Tensor valid = target.ne(ignoreIndex);
  if (check) {
    Tensor bad = target.lt(0).logical_or(target.ge(classes)).logical_and(valid);
    if (bad.any().item<bool>())
      outOfRange(op, target.masked_select(bad)[0].item<int64_t>(), classes);
  }
  Tensor rowWeight = valid.to(rowOptions.dtype());
  if (weight) {
    Tensor safe = target.masked_fill(valid.logical_not(), 0).reshape(-1);
    Tensor gathered = targets.classWeight.to(rowOptions.dtype())
                          .index_select(0, safe)
                          .view(target.sizes());
    rowWeight = at::where(valid, gathered, 0.0);
  }
  targets.targetWeight = rowWeight.contiguous();
  targets.weightTotal = targets.targetWeight.sum();
  targets.count = valid.sum().to(rowOptions.dtype());
  return targets;
}

std::vector<Tensor>
cross_entropy::runForward(const char *op, const Tensor &logits,
                          const Tensor &target, const Targets &targets,
                          const Options &options, at::TensorList rowOut) {
  std::vector<Tensor> out(rowOut.begin(), rowOut.end());
  if (!out.empty())
    out.resize(targets.weighted ? 5 : 4);
  auto result =
      runKernel(op, Forward, logits, target, targets, options, {}, out);
  if (!targets.weighted) // every row's mass is 1: not kept
    result.push_back(logits.new_empty({0}, rowDtype(logits)));
  return result;
}

Tensor cross_entropy::runBackward(const char *op, const Tensor &logits,
                                  const Tensor &target, const Targets &targets,
                                  const Options &options, const Tensor &rowMax,
                                  const Tensor &logSum, const Tensor &mass,
                                  const Tensor &dloss, const Tensor &dzLoss) {
  if (!targets.weighted)
    return runKernel(op, Backward, logits, target, targets, options,
                     {rowMax, logSum, dloss, dzLoss})[0];
  return runKernel(op, Backward, logits, target, targets, options,
                   {rowMax, logSum, mass, dloss, dzLoss})[0];
}

std::vector<Tensor>
cross_entropy::runForwardGrad(const char *op, const Tensor &logits,
                              const Tensor &target, const Targets &targets,
                              const Options &options, const Tensor &dloss,
                              const Tensor &dzLoss, at::TensorList rowOut) {
  TORCH_CHECK(logits.is_contiguous(), "tilefuse.", op,
              ": the logits the gradient is written over must be contiguous");
  std::vector<Tensor> out(rowOut.begin(), rowOut.end());
  out.resize(2);
  out.push_back(logits);
  auto result = runKernel(op, ForwardGrad, logits, target, targets, options,
                          {dloss, dzLoss}, out);
  result.pop_back();
  return result;
}

std::pair<Tensor, Tensor> cross_entropy::reduceLoss(const Tensor &loss,
                                                    const Tensor &zLoss,
                                                    const Targets &targets,
                                                    const Options &options) {
  bool withZ = options.lseSquareScale != 0.0;
  if (options.reduction == None)
    return {withZ ? loss.add(zLoss) : loss, zLoss};
  if (targets.gpu) {
    Tensor total = loss.sum(), zTotal = zLoss.sum();
    if (options.reduction == Mean) {
      total = total.div(targets.weightTotal);
      zTotal = zTotal.div(targets.count);
    }
    return {withZ ? total.add(zTotal) : total, zTotal};
  }
  // On the CPU, summed here (in double) rather than by more dispatches.
  double total = 0, zTotal = 0;
  AT_DISPATCH_FLOATING_TYPES(loss.scalar_type(), "reduceLoss", [&] {
    const scalar_t *rows = loss.const_data_ptr<scalar_t>();
    const scalar_t *zRows = zLoss.const_data_ptr<scalar_t>();
    for (int64_t i = 0, e = loss.numel(); i < e; ++i) {
      total += rows[i];
      zTotal += zRows[i];
    }
  });
  if (options.reduction == Mean) {
    total /= targets.weightTotal.item<double>();
    zTotal /= targets.count.item<double>();
  }
  // Rounded to float32 first where the loss is: a sum past its range is
  // inf, as torch's float32 sum gives, where at::scalar_tensor would refuse
  // the double.
  auto scalar = [&](double value) {
    if (loss.scalar_type() == at::kFloat)
      value = static_cast<float>(value);
    return at::scalar_tensor(value, loss.options());
  };
  return {scalar(withZ ? total + zTotal : total), scalar(zTotal)};
}

std::pair<Tensor, Tensor> cross_entropy::rowGradients(const Tensor &grad,
                                                      const Targets &targets,
                                                      Reduction reduction,
                                                      at::IntArrayRef rows,
                                                      at::ScalarType dtype) {
  Tensor upstream = grad.to(dtype);
  switch (reduction) {
  case None:
  case Sum:
    upstream = upstream.expand(rows).contiguous();
    return {upstream, upstream};
  case Mean:
    return {upstream.div(targets.weightTotal).expand(rows).contiguous(),
            upstream.div(targets.count).expand(rows).contiguous()};
  }
  TORCH_INTERNAL_ASSERT(false, "unknown reduction");
}

Tensor cross_entropy::emptyLoss(const Tensor &logits, Reduction reduction) {
  return reduction == None
             ? emptyRows(logits)
             : at::empty({}, logits.options().dtype(rowDtype(logits)));
}
