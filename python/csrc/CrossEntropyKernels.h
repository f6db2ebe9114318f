//===- CrossEntropyKernels.h - running cross-entropy fusions ----*- C++ -*-===//
//
// What the cross-entropy ops (CrossEntropyOps.cpp) and the fused linear
// cross-entropy (LinearCrossEntropyOps.cpp) share: the per-row values the
// kernels take from the targets, the choice among the eighteen fusions
// (kernels_dsl/lib/CrossEntropy.cpp), their argument lists, and the
// reductions of per-row losses and their gradients. Logits are [..., n]
// rows with the classes last; targets are class indices of the leading
// shape or probabilities of the logits' shape.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_PYTHON_CROSSENTROPYKERNELS_H
#define TILEFUSE_PYTHON_CROSSENTROPYKERNELS_H

#include <ATen/core/Tensor.h>

#include <optional>

namespace tilefuse::torch_ops::cross_entropy {

/// How per-row losses are reduced (at::Reduction's values).
enum Reduction : int64_t { None = 0, Mean = 1, Sum = 2 };

/// "none", "mean" or "sum"; anything else is an error naming `op`.
Reduction parseReduction(const char *op, c10::string_view reduction);
/// A reduction passed as an int to an internal op, checked.
Reduction checkReduction(const char *op, int64_t reduction);

/// The scalar options every cross-entropy kernel takes.
struct Options {
  int64_t ignoreIndex;
  double labelSmoothing;
  double lseSquareScale;
  std::optional<double> softcap;
  Reduction reduction;
};

/// Checks the options (label_smoothing in [0, 1], softcap > 0, no
/// ignore_index >= 0 with probabilities, as torch); errors name `op`.
void checkOptions(const char *op, const Options &options, bool probs);

/// What the kernels and the reductions take from the targets.
struct Targets {
  bool probs;
  bool weighted;           // class weights (probabilities always take them)
  bool gpu;                // prepared for GPU code (a GPU or the emulator):
                           // by tensor ops, without reading them here
  at::Tensor classWeight;  // [n] in the logits' dtype, when weighted (ones
                           // for probabilities without weights)
  at::Tensor targetWeight; // class indices: each row's class weight, 0 where
                           // ignored (compute dtype)
  at::Tensor weightTotal;  // 0-d: what 'mean' divides the loss by
  at::Tensor count;        // 0-d: what 'mean' divides the z-loss by

  /// The targets of rows [start, start + length) of flat [rows, n] logits.
  Targets rows(int64_t start, int64_t length) const;
};

/// The targets of logits with `classes` classes and options `logits`
/// (dtype, device). Class indices outside [0, n) that are not
/// ignore_index raise an IndexError naming `op`: always on the CPU, on a GPU
/// (where the check waits for the targets) with `check`.
Targets prepareTargets(const char *op, const at::Tensor &target,
                       const std::optional<at::Tensor> &weight,
                       int64_t ignoreIndex, int64_t classes,
                       const at::TensorOptions &logits, bool check);

/// The forward kernel: per-row (loss, z_loss, max, log_sum, mass), with
/// max and log_sum = log(sum(exp(z - max))) of the (soft-capped) logits z
/// and mass empty when not weighted (it is 1). `rowOut` may give the loss and
/// z-loss rows.
std::vector<at::Tensor> runForward(const char *op, const at::Tensor &logits,
                                   const at::Tensor &target,
                                   const Targets &targets,
                                   const Options &options,
                                   at::TensorList rowOut = {});

/// The backward kernel: dlogits for per-row upstream gradients of the loss
/// (`dloss`) and of the z-loss (`dzLoss`); `rowMax`, `logSum` and `mass` as
/// runForward gave them.
at::Tensor runBackward(const char *op, const at::Tensor &logits,
                       const at::Tensor &target, const Targets &targets,
                       const Options &options, const at::Tensor &rowMax,
                       const at::Tensor &logSum, const at::Tensor &mass,
                       const at::Tensor &dloss, const at::Tensor &dzLoss);

/// Forward and backward in one kernel: per-row (loss, z_loss), and dlogits
/// written over the contiguous `logits`.
std::vector<at::Tensor>
runForwardGrad(const char *op, const at::Tensor &logits,
               const at::Tensor &target, const Targets &targets,
               const Options &options, const at::Tensor &dloss,
               const at::Tensor &dzLoss, at::TensorList rowOut = {});

/// (loss + z-loss, z-loss) reduced as `reduction` says from per-row values:
/// 'mean' divides the loss by targets.weightTotal and the z-loss by
/// targets.count (as Liger); 'none' keeps the rows.
std::pair<at::Tensor, at::Tensor> reduceLoss(const at::Tensor &loss,
                                             const at::Tensor &zLoss,
                                             const Targets &targets,
                                             const Options &options);

/// The per-row upstream gradients (of the loss, of the z-loss) for `grad`,
/// the gradient of the reduced loss; `rows` is the leading shape.
std::pair<at::Tensor, at::Tensor>
rowGradients(const at::Tensor &grad, const Targets &targets,
             Reduction reduction, at::IntArrayRef rows, at::ScalarType dtype);

/// The shapes of reduceLoss's results for logits `logits` (meta kernels).
at::Tensor emptyLoss(const at::Tensor &logits, Reduction reduction);

} // namespace tilefuse::torch_ops::cross_entropy

#endif // TILEFUSE_PYTHON_CROSSENTROPYKERNELS_H
