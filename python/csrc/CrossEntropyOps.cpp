//===- CrossEntropyOps.cpp - the cross-entropy ops ------------------------===//
//
// torch.nn.functional.cross_entropy as tilefuse:: ops, with the options of
// LLM training:
//   - cross_entropy, cross_entropy_with_z_loss and
//     cross_entropy_inplace_backward (CompositeImplicitAutograd): torch's forms
//     ([N, C], [C], [N, C, d1, ...] with the classes moved last by a copy, and
//     [..., V] logits with [...] targets as language models produce them, with
//     no copy), class weights, class-index or probability targets,
//     ignore_index, label smoothing, every reduction; and the z-loss,
//     soft-capping and the in-place gradient;
//   - cross_entropy_fwd / _bwd / _target_bwd: CPU and CUDA kernels (the
//     fused kernels), Meta kernels, and an Autograd kernel for _fwd whose
//     backward is the fused _bwd;
//   - cross_entropy_fwd_grad_: the loss and, written over the logits, its
//     gradient for an upstream gradient of 1; its backward only scales that
//     gradient in place (scale_grad_).
//
//===----------------------------------------------------------------------===//

#include "CrossEntropyKernels.h"
#include "TorchOpSupport.h"

#include "tilefuse/Torch/Ops.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tanh.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

using at::Tensor;
using namespace tilefuse::torch_ops;
using namespace tilefuse::torch_ops::cross_entropy;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char *kOp = "cross_entropy";

/// The forward's loss, z-loss, and each row's max, log-sum and mass.
using ForwardRows = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

using FwdOp = ForwardRows(const Tensor &, const Tensor &,
                          const std::optional<Tensor> &, int64_t, double,
                          double, std::optional<double>, int64_t);
using FwdGradOp = TensorPair(const Tensor &, const Tensor &,
                             const std::optional<Tensor> &, int64_t, double,
                             double, std::optional<double>, int64_t);
using BwdOp = Tensor(const Tensor &, const Tensor &, const Tensor &,
                     const std::optional<Tensor> &, const Tensor &,
                     const Tensor &, const Tensor &, int64_t, double, double,
                     std::optional<double>, int64_t);
using TargetBwdOp = Tensor(const Tensor &, const Tensor &, const Tensor &,
                           const std::optional<Tensor> &, const Tensor &,
                           const Tensor &, double, std::optional<double>,
                           int64_t);
using WeightBwdOp = Tensor(const Tensor &, const Tensor &, const Tensor &,
                           const Tensor &, const Tensor &, const Tensor &,
                           double, std::optional<double>, int64_t);
using ScaleGradOp = void(const Tensor &, const Tensor &);
using PublicOp = Tensor(const Tensor &, const Tensor &,
                        const std::optional<Tensor> &, int64_t,
                        c10::string_view, double, double,
                        std::optional<double>);
using PublicPairOp = TensorPair(const Tensor &, const Tensor &,
                                const std::optional<Tensor> &, int64_t,
                                c10::string_view, double, double,
                                std::optional<double>);

const c10::TypedOperatorHandle<FwdOp> &fwdOp() {
  static auto op = findOp<FwdOp>("tilefuse::cross_entropy_fwd");
  return op;
}
const c10::TypedOperatorHandle<FwdGradOp> &fwdGradOp() {
  static auto op = findOp<FwdGradOp>("tilefuse::cross_entropy_fwd_grad_");
  return op;
}

Options optionsOf(int64_t ignoreIndex, double labelSmoothing,
                  double lseSquareScale, std::optional<double> softcap,
                  int64_t reduction) {
  return {ignoreIndex, labelSmoothing, lseSquareScale, softcap,
          checkReduction(kOp, reduction)};
}

/// The internal ops take [..., n] logits with class indices of the leading
/// shape or probabilities of the logits' shape.
void checkKernelArguments(const Tensor &logits, const Tensor &target) {
  TORCH_CHECK_VALUE(logits.dim() >= 1 && logits.size(-1) >= 1,
                    "tilefuse.cross_entropy: 'logits' must be [..., n] with "
                    "n >= 1, got shape ",
                    logits.sizes());
  if (at::isFloatingType(target.scalar_type())) {
    TORCH_CHECK_VALUE(target.sizes() == logits.sizes(),
                      "tilefuse.cross_entropy: probability targets must have "
                      "the logits' shape ",
                      logits.sizes(), ", got ", target.sizes());
    return;
  }
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong,
                   "tilefuse.cross_entropy: 'target' must hold int64 class "
                   "indices, got ",
                   target.scalar_type());
  TORCH_CHECK_VALUE(target.sizes() == logits.sizes().slice(0, logits.dim() - 1),
                    "tilefuse.cross_entropy: class-index targets must have the "
                    "leading shape of the logits ",
                    logits.sizes(), ", got ", target.sizes());
}

//===----------------------------------------------------------------------===//
// Kernels (CPU and CUDA: TorchRunner picks the target) and their shapes
//===----------------------------------------------------------------------===//

ForwardRows crossEntropyFwd(const Tensor &logits, const Tensor &target,
                            const std::optional<Tensor> &weight,
                            int64_t ignoreIndex, double labelSmoothing,
                            double lseSquareScale,
                            std::optional<double> softcap, int64_t reduction) {
  checkKernelArguments(logits, target);
  Options options = optionsOf(ignoreIndex, labelSmoothing, lseSquareScale,
                              softcap, reduction);
  Targets targets =
      prepareTargets(kOp, target, weight, ignoreIndex, logits.size(-1),
                     logits.options(), /*check=*/true);
  auto rows = runForward(kOp, logits, target, targets, options);
  auto [loss, zLoss] = reduceLoss(rows[0], rows[1], targets, options);
  return {loss, zLoss, rows[2], rows[3], rows[4]};
}

ForwardRows crossEntropyFwdMeta(const Tensor &logits, const Tensor &target,
                                const std::optional<Tensor> &weight, int64_t,
                                double, double, std::optional<double>,
                                int64_t reduction) {
  Reduction mode = checkReduction(kOp, reduction);
  // Without class weights every row's mass is 1: not kept.
  bool weighted = weight || at::isFloatingType(target.scalar_type());
  return {emptyLoss(logits, mode), emptyLoss(logits, mode), emptyRows(logits),
          emptyRows(logits),
          weighted ? emptyRows(logits)
                   : logits.new_empty({0}, rowDtype(logits))};
}

Tensor crossEntropyBwd(const Tensor &gradLoss, const Tensor &logits,
                       const Tensor &target,
                       const std::optional<Tensor> &weight,
                       const Tensor &rowMax, const Tensor &logSum,
                       const Tensor &mass, int64_t ignoreIndex,
                       double labelSmoothing, double lseSquareScale,
                       std::optional<double> softcap, int64_t reduction) {
  checkKernelArguments(logits, target);
  Options options = optionsOf(ignoreIndex, labelSmoothing, lseSquareScale,
                              softcap, reduction);
  Targets targets =
      prepareTargets(kOp, target, weight, ignoreIndex, logits.size(-1),
                     logits.options(), /*check=*/false);
  auto [dloss, dzLoss] = rowGradients(gradLoss, targets, options.reduction,
                                      rowMax.sizes(), rowMax.scalar_type());
  return runBackward(kOp, logits, target, targets, options, rowMax, logSum,
                     mass, dloss, dzLoss);
}

Tensor crossEntropyBwdMeta(const Tensor &, const Tensor &logits, const Tensor &,
                           const std::optional<Tensor> &, const Tensor &,
                           const Tensor &, const Tensor &, int64_t, double,
                           double, std::optional<double>, int64_t) {
  return emptyLike(logits);
}

/// The log-probabilities of probability-target rows, each times its row's
/// share of the upstream gradient, and the targets' class weights: what the
/// gradients of the targets and of the class weights are made of (ATen
/// ops, not a fused kernel: they rarely need a gradient).
std::pair<Tensor, Tensor>
scaledLogProbs(const Tensor &gradLoss, const Tensor &logits,
               const Tensor &target, const std::optional<Tensor> &weight,
               const Tensor &rowMax, const Tensor &logSum,
               double labelSmoothing, std::optional<double> softcap,
               int64_t reduction) {
  checkKernelArguments(logits, target);
  Options options = optionsOf(-100, labelSmoothing, 0.0, softcap, reduction);
  Targets targets = prepareTargets(kOp, target, weight, -100, logits.size(-1),
                                   logits.options(), /*check=*/false);
  auto [dloss, dzLoss] = rowGradients(gradLoss, targets, options.reduction,
                                      rowMax.sizes(), rowMax.scalar_type());
  Tensor z = logits.to(rowMax.scalar_type());
  if (softcap)
    z = at::tanh(z.mul(1.0 / *softcap)).mul(*softcap); // as the kernels do
  // (z - max) - log_sum, as the kernels take it: max + log_sum rounds to
  // the max in rows of huge logits.
  Tensor logProbs = z.sub(rowMax.unsqueeze(-1)).sub(logSum.unsqueeze(-1));
  return {logProbs.mul(dloss.unsqueeze(-1)), targets.classWeight};
}

/// The gradient of the loss with respect to probability targets,
/// -(1 - label_smoothing) * w * log_softmax(z) per row's upstream gradient.
Tensor crossEntropyTargetBwd(const Tensor &gradLoss, const Tensor &logits,
                             const Tensor &target,
                             const std::optional<Tensor> &weight,
                             const Tensor &rowMax, const Tensor &logSum,
                             double labelSmoothing,
                             std::optional<double> softcap, int64_t reduction) {
  auto [scaled, classWeight] =
      scaledLogProbs(gradLoss, logits, target, weight, rowMax, logSum,
                     labelSmoothing, softcap, reduction);
  return scaled.mul(classWeight)
      .mul(-(1.0 - labelSmoothing))
      .to(target.scalar_type());
}

/// The class weights' gradient of a probability-target loss (torch gives
/// one there; class indices get none, as torch's nll_loss): -sum over the
/// rows of the upstream share times the smoothed target times the
/// log-probability.
Tensor crossEntropyWeightBwd(const Tensor &gradLoss, const Tensor &logits,
                             const Tensor &target, const Tensor &weight,
                             const Tensor &rowMax, const Tensor &logSum,
                             double labelSmoothing,
                             std::optional<double> softcap, int64_t reduction) {
  auto [scaled, classWeight] =
      scaledLogProbs(gradLoss, logits, target, weight, rowMax, logSum,
                     labelSmoothing, softcap, reduction);
  Tensor smoothed = target.to(scaled.scalar_type())
                        .mul(1.0 - labelSmoothing)
                        .add(labelSmoothing / logits.size(-1));
  return scaled.mul(smoothed)
      .neg()
      .reshape({-1, logits.size(-1)})
      .sum(0)
      .to(weight.scalar_type());
}

Tensor crossEntropyWeightBwdMeta(const Tensor &, const Tensor &, const Tensor &,
                                 const Tensor &weight, const Tensor &,
                                 const Tensor &, double, std::optional<double>,
                                 int64_t) {
  return emptyLike(weight);
}

Tensor crossEntropyTargetBwdMeta(const Tensor &, const Tensor &,
                                 const Tensor &target,
                                 const std::optional<Tensor> &, const Tensor &,
                                 const Tensor &, double, std::optional<double>,
                                 int64_t) {
  return emptyLike(target);
}

TensorPair crossEntropyFwdGrad(const Tensor &logits, const Tensor &target,
                               const std::optional<Tensor> &weight,
                               int64_t ignoreIndex, double labelSmoothing,
                               double lseSquareScale,
                               std::optional<double> softcap,
                               int64_t reduction) {
  checkKernelArguments(logits, target);
  TORCH_CHECK_VALUE(logits.is_contiguous(),
                    "tilefuse.cross_entropy: inplace_backward=True writes the "
                    "gradient over 'input', which must be contiguous");
  Options options = optionsOf(ignoreIndex, labelSmoothing, lseSquareScale,
                              softcap, reduction);
  Targets targets =
      prepareTargets(kOp, target, weight, ignoreIndex, logits.size(-1),
                     logits.options(), /*check=*/true);
  Tensor one = at::ones({}, logits.options().dtype(rowDtype(logits)));
  at::IntArrayRef rows = logits.sizes().slice(0, logits.dim() - 1);
  auto [dloss, dzLoss] =
      rowGradients(one, targets, options.reduction, rows, one.scalar_type());
  auto losses =
      runForwardGrad(kOp, logits, target, targets, options, dloss, dzLoss);
  auto [loss, zLoss] = reduceLoss(losses[0], losses[1], targets, options);
  return {loss, zLoss};
}

TensorPair crossEntropyFwdGradMeta(const Tensor &logits, const Tensor &,
                                   const std::optional<Tensor> &, int64_t,
                                   double, double, std::optional<double>,
                                   int64_t reduction) {
  Reduction mode = checkReduction(kOp, reduction);
  return {emptyLoss(logits, mode), emptyLoss(logits, mode)};
}

/// gradient *= gradOutput: a 0-d gradOutput, or one per row of `gradient`.
void scaleGrad(const Tensor &gradient, const Tensor &gradOutput) {
  TORCH_CHECK_VALUE(gradOutput.dim() == 0 ||
                        gradOutput.sizes() ==
                            gradient.sizes().slice(0, gradient.dim() - 1),
                    "tilefuse.scale_grad_: 'grad_output' must be 0-d or of "
                    "the leading shape of ",
                    gradient.sizes(), ", got ", gradOutput.sizes());
  gradient.mul_(gradOutput.dim() ? gradOutput.unsqueeze(-1) : gradOutput);
}

void scaleGradMeta(const Tensor &, const Tensor &) {}

//===----------------------------------------------------------------------===//
// Autograd
//===----------------------------------------------------------------------===//

/// Class weights get a gradient with probability targets, as torch's
/// cross_entropy; none with class indices (as torch's nll_loss) or from
/// the in-place gradient.
void checkNoWeightGrad(const std::optional<Tensor> &weight,
                       const Tensor &target, bool inplace = false) {
  bool probs = at::isFloatingType(target.scalar_type());
  TORCH_CHECK_VALUE(!weight || !weight->requires_grad() ||
                        !at::GradMode::is_enabled() || (probs && !inplace),
                    "tilefuse.cross_entropy: 'weight' (the class weights) "
                    "requires grad, but the loss is not differentiable with "
                    "respect to it ",
                    inplace ? "with inplace_backward=True"
                            : "with class-index targets (as torch's nll_loss)",
                    ": detach it");
}

void saveOptions(AutogradContext *ctx, int64_t ignoreIndex,
                 double labelSmoothing, double lseSquareScale,
                 std::optional<double> softcap, int64_t reduction) {
  ctx->saved_data["ignore_index"] = ignoreIndex;
  ctx->saved_data["label_smoothing"] = labelSmoothing;
  ctx->saved_data["lse_square_scale"] = lseSquareScale;
  ctx->saved_data["softcap"] = softcap;
  ctx->saved_data["reduction"] = reduction;
}

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static variable_list
  forward(AutogradContext *ctx, const Tensor &logits, const Tensor &target,
          const std::optional<Tensor> &weight, int64_t ignoreIndex,
          double labelSmoothing, double lseSquareScale,
          std::optional<double> softcap, int64_t reduction) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, zLoss, rowMax, logSum, mass] =
        fwdOp().call(logits, target, weight, ignoreIndex, labelSmoothing,
                     lseSquareScale, softcap, reduction);
    ctx->save_for_backward(
        {logits, target, rowMax, logSum, mass, weight.value_or(Tensor())});
    saveOptions(ctx, ignoreIndex, labelSmoothing, lseSquareScale, softcap,
                reduction);
    ctx->mark_non_differentiable({zLoss, rowMax, logSum, mass});
    return {loss, zLoss, rowMax, logSum, mass};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto bwdOp = findOp<BwdOp>("tilefuse::cross_entropy_bwd");
    static auto targetBwdOp =
        findOp<TargetBwdOp>("tilefuse::cross_entropy_target_bwd");
    variable_list saved = ctx->get_saved_variables();
    variable_list result(8);
    if (!grads[0].defined())
      return result;
    const Tensor &logits = saved[0], &target = saved[1], &rowMax = saved[2],
                 &logSum = saved[3];
    std::optional<Tensor> weight;
    if (saved[5].defined())
      weight = saved[5];
    auto &data = ctx->saved_data;
    double labelSmoothing = data["label_smoothing"].toDouble();
    auto softcap = data["softcap"].toOptional<double>();
    int64_t reduction = data["reduction"].toInt();
    if (ctx->needs_input_grad(0))
      result[0] =
          bwdOp.call(grads[0], logits, target, weight, rowMax, logSum, saved[4],
                     data["ignore_index"].toInt(), labelSmoothing,
                     data["lse_square_scale"].toDouble(), softcap, reduction);
    if (ctx->needs_input_grad(1))
      result[1] = targetBwdOp.call(grads[0], logits, target, weight, rowMax,
                                   logSum, labelSmoothing, softcap, reduction);
    // An absent weight is no input: there is no third gradient to ask for.
    if (weight && ctx->needs_input_grad(2)) {
      static auto weightBwdOp =
          findOp<WeightBwdOp>("tilefuse::cross_entropy_weight_bwd");
      result[2] = weightBwdOp.call(grads[0], logits, target, *weight, rowMax,
                                   logSum, labelSmoothing, softcap, reduction);
    }
    return result;
  }
};

/// PyTorch refuses in-place writes into leaves that require grad and views
/// of them; so does the in-place gradient.
void checkWritable(const Tensor &logits) {
  const char *fix = "; pass the output of an op (e.g. the lm_head's logits) "
                    "or inplace_backward=False";
  TORCH_CHECK_VALUE(!logits.is_leaf(),
                    "tilefuse.cross_entropy: inplace_backward=True writes the "
                    "gradient over 'input', a leaf tensor that requires grad "
                    "(as torch refuses in-place ops on such leaves)",
                    fix);
  TORCH_CHECK_VALUE(!logits.is_view() || !logits._base().is_leaf() ||
                        !logits._base().requires_grad(),
                    "tilefuse.cross_entropy: inplace_backward=True writes the "
                    "gradient over 'input', a view of a leaf tensor that "
                    "requires grad (as torch refuses in-place ops on such "
                    "views)",
                    fix);
}

struct InplaceCrossEntropyFunction
    : torch::autograd::Function<InplaceCrossEntropyFunction> {
  static variable_list
  forward(AutogradContext *ctx, const Tensor &logits, const Tensor &target,
          const std::optional<Tensor> &weight, int64_t ignoreIndex,
          double labelSmoothing, double lseSquareScale,
          std::optional<double> softcap, int64_t reduction) {
    checkWritable(logits);
    Tensor loss, zLoss;
    {
      // ADInplaceOrView bumps the logits' version: anything autograd saved
      // of them before now refuses to unpack.
      at::AutoDispatchBelowAutograd below;
      std::tie(loss, zLoss) =
          fwdGradOp().call(logits, target, weight, ignoreIndex, labelSmoothing,
                           lseSquareScale, softcap, reduction);
    }
    ctx->save_for_backward({logits});
    ctx->mark_non_differentiable({zLoss});
    return {loss, zLoss};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto scaleOp = findOp<ScaleGradOp>("tilefuse::scale_grad_");
    variable_list result(8);
    if (!grads[0].defined())
      return result;
    TORCH_CHECK_NOT_IMPLEMENTED(!grads[0].requires_grad(),
                                "tilefuse.cross_entropy: second-order "
                                "gradients of inplace_backward=True are not "
                                "supported");
    auto &used = ctx->saved_data["used"];
    TORCH_CHECK(used.isNone(),
                "tilefuse.cross_entropy: the backward of inplace_backward=True "
                "scales the gradient it wrote over the logits in place, so it "
                "can run only once (retain_graph=True is not supported)");
    used = true;
    Tensor dlogits = ctx->get_saved_variables()[0].detach();
    scaleOp.call(dlogits, grads[0]);
    result[0] = dlogits;
    return result;
  }
};

//===----------------------------------------------------------------------===//
// The public ops: torch's forms to [..., n] logits with the classes last
//===----------------------------------------------------------------------===//

/// `input` and `target` with the classes last: [N, C] and [C] as they are,
/// [..., V] logits with [...] class indices (language models' [B, T, V])
/// as they are (no copy), and torch's [N, C, d1, ...] with [N, d1, ...]
/// (or probabilities of the input's shape) moved to [N, d1, ..., C] by a
/// copy. Where both readings fit ([B, C, C] with [B, C]), torch's wins.
TensorPair classesLast(const Tensor &input, const Tensor &target) {
  checkFloat(kOp, "input", input);
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.sym_size(-1) >= 1,
                    "tilefuse.cross_entropy: 'input' must have a class "
                    "dimension of at least 1, got shape ",
                    input.sym_sizes());
  int64_t classDim = input.dim() == 1 ? 0 : 1;
  bool lastIsClass = classDim == input.dim() - 1;
  if (at::isFloatingType(target.scalar_type())) {
    TORCH_CHECK_VALUE(target.sym_sizes() == input.sym_sizes(),
                      "tilefuse.cross_entropy: probability targets ('target' "
                      "of a float dtype) must have the shape of 'input' ",
                      input.sym_sizes(), ", got ", target.sym_sizes());
    Tensor probs = target.to(input.scalar_type());
    if (lastIsClass)
      return {input, probs};
    return {input.movedim(classDim, -1).contiguous(),
            probs.movedim(classDim, -1).contiguous()};
  }
  // torch's nll_loss also takes uint8 class indices (CPU and CUDA).
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong ||
                       target.scalar_type() == at::kByte,
                   "tilefuse.cross_entropy: 'target' must hold int64 (or "
                   "uint8) class indices or float probabilities, got ",
                   target.scalar_type());
  Tensor classes = target.to(at::kLong);
  std::vector<c10::SymInt> torchForm;
  for (int64_t d = 0; d < input.dim(); ++d)
    if (d != classDim)
      torchForm.push_back(input.sym_size(d));
  if (classes.sym_sizes() == c10::SymIntArrayRef(torchForm))
    return {lastIsClass ? input : input.movedim(classDim, -1).contiguous(),
            classes};
  TORCH_CHECK_VALUE(input.dim() >= 3 &&
                        classes.sym_sizes() == leadingSymDims(input),
                    "tilefuse.cross_entropy: 'target' must have shape ",
                    c10::SymIntArrayRef(torchForm),
                    " (torch's [N, d1, ...] "
                    "for 'input' [N, C, d1, ...]) or ",
                    leadingSymDims(input),
                    " (classes last, as [B, T] for "
                    "[B, T, V] logits), got ",
                    classes.sym_sizes());
  return {input, classes};
}

TensorPair crossEntropyImpl(const Tensor &input, const Tensor &target,
                            const std::optional<Tensor> &weight,
                            int64_t ignoreIndex, c10::string_view reduction,
                            double labelSmoothing, double lseSquareScale,
                            std::optional<double> softcap, bool inplace) {
  Options options{ignoreIndex, labelSmoothing, lseSquareScale, softcap,
                  parseReduction(kOp, reduction)};
  auto [logits, targets] = classesLast(input, target);
  checkSameDevice(kOp, "target", target, "input", input);
  checkOptions(kOp, options, at::isFloatingType(target.scalar_type()));
  std::optional<Tensor> classWeight;
  if (weight) {
    checkNoWeightGrad(weight, target, inplace);
    classWeight =
        checkColumn(kOp, "weight", *weight, input, logits.sym_size(-1));
  }
  Tensor loss, zLoss;
  if (inplace && needsGraph(kOp, logits)) {
    std::tie(loss, zLoss) = fwdGradOp().call(
        logits, targets, classWeight, ignoreIndex, labelSmoothing,
        lseSquareScale, softcap, options.reduction);
  } else {
    std::tie(loss, zLoss, std::ignore, std::ignore, std::ignore) =
        fwdOp().call(logits, targets, classWeight, ignoreIndex, labelSmoothing,
                     lseSquareScale, softcap, options.reduction);
  }
  // In the logits' dtype, as torch's; under autocast torch's cross_entropy
  // runs in float32 (its logits cast up): the loss as computed, in float32.
  at::ScalarType lossType = input.scalar_type();
  c10::DeviceType device = input.device().type();
  if (at::isReducedFloatingType(lossType) &&
      at::autocast::is_autocast_available(device) && // not meta
      at::autocast::is_autocast_enabled(device))
    lossType = at::kFloat;
  return {loss.to(lossType), zLoss.to(lossType)};
}

Tensor crossEntropy(const Tensor &input, const Tensor &target,
                    const std::optional<Tensor> &weight, int64_t ignoreIndex,
                    c10::string_view reduction, double labelSmoothing,
                    double lseSquareScale, std::optional<double> softcap) {
  return std::get<0>(crossEntropyImpl(input, target, weight, ignoreIndex,
                                      reduction, labelSmoothing, lseSquareScale,
                                      softcap, false));
}

TensorPair crossEntropyWithZLoss(const Tensor &input, const Tensor &target,
                                 const std::optional<Tensor> &weight,
                                 int64_t ignoreIndex,
                                 c10::string_view reduction,
                                 double labelSmoothing, double lseSquareScale,
                                 std::optional<double> softcap) {
  return crossEntropyImpl(input, target, weight, ignoreIndex, reduction,
                          labelSmoothing, lseSquareScale, softcap, false);
}

TensorPair
crossEntropyInplaceBackward(const Tensor &input, const Tensor &target,
                            const std::optional<Tensor> &weight,
                            int64_t ignoreIndex, c10::string_view reduction,
                            double labelSmoothing, double lseSquareScale,
                            std::optional<double> softcap) {
  return crossEntropyImpl(input, target, weight, ignoreIndex, reduction,
                          labelSmoothing, lseSquareScale, softcap, true);
}

} // namespace

//===----------------------------------------------------------------------===//
// The C++ API (Ops.h)
//===----------------------------------------------------------------------===//

at::Tensor tilefuse::ops::cross_entropy(const at::Tensor &input,
                                        const at::Tensor &target,
                                        int64_t ignoreIndex,
                                        std::string_view reduction,
                                        double labelSmoothing) {
  static auto op = findOp<PublicOp>("tilefuse::cross_entropy");
  return op.call(input, target, std::nullopt, ignoreIndex, reduction,
                 labelSmoothing, 0.0, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor>
tilefuse::ops::cross_entropy_with_z_loss(const at::Tensor &input,
                                         const at::Tensor &target,
                                         const CrossEntropyOptions &options) {
  static auto op = findOp<PublicPairOp>("tilefuse::cross_entropy_with_z_loss");
  static auto inplaceOp =
      findOp<PublicPairOp>("tilefuse::cross_entropy_inplace_backward");
  return (options.inplaceBackward ? inplaceOp : op)
      .call(input, target, options.weight, options.ignoreIndex,
            options.reduction, options.labelSmoothing, options.lseSquareScale,
            options.softcap);
}

#define TILEFUSE_CROSS_ENTROPY_OPTIONS                                         \
  "Tensor? weight=None, int ignore_index=-100, str reduction='mean', "         \
  "float label_smoothing=0.0, *, float lse_square_scale=0.0, "                 \
  "float? softcap=None"
#define TILEFUSE_CROSS_ENTROPY_KERNEL_OPTIONS                                  \
  "int ignore_index, float label_smoothing, float lse_square_scale, "          \
  "float? softcap, int reduction"

TORCH_LIBRARY_FRAGMENT(tilefuse, m) {
  m.def("cross_entropy(Tensor input, Tensor "
        "target, " TILEFUSE_CROSS_ENTROPY_OPTIONS ") -> Tensor");
  m.def("cross_entropy_with_z_loss(Tensor input, Tensor "
        "target, " TILEFUSE_CROSS_ENTROPY_OPTIONS ") -> (Tensor, Tensor)");
  m.def("cross_entropy_inplace_backward(Tensor(a!) input, Tensor "
        "target, " TILEFUSE_CROSS_ENTROPY_OPTIONS ") -> (Tensor, Tensor)");
  // reduction: 0 none, 1 mean, 2 sum (at::Reduction). Returns the loss, the
  // z-loss, and what the backward takes: each row's max, log_sum (lse is
  // max + log_sum) and mass (empty without class weights, where it is 1).
  m.def("cross_entropy_fwd(Tensor logits, Tensor target, Tensor? "
        "weight, " TILEFUSE_CROSS_ENTROPY_KERNEL_OPTIONS
        ") -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("cross_entropy_bwd(Tensor grad_loss, Tensor logits, Tensor target, "
        "Tensor? weight, Tensor max, Tensor log_sum, Tensor "
        "mass, " TILEFUSE_CROSS_ENTROPY_KERNEL_OPTIONS ") -> Tensor");
  m.def("cross_entropy_target_bwd(Tensor grad_loss, Tensor logits, "
        "Tensor target, Tensor? weight, Tensor max, Tensor log_sum, "
        "float label_smoothing, float? softcap, int reduction) -> Tensor");
  m.def("cross_entropy_weight_bwd(Tensor grad_loss, Tensor logits, "
        "Tensor target, Tensor weight, Tensor max, Tensor log_sum, "
        "float label_smoothing, float? softcap, int reduction) -> Tensor");
  m.def("cross_entropy_fwd_grad_(Tensor(a!) logits, Tensor target, "
        "Tensor? weight, " TILEFUSE_CROSS_ENTROPY_KERNEL_OPTIONS
        ") -> (Tensor, Tensor)");
  m.def("scale_grad_(Tensor(a!) gradient, Tensor grad_output) -> ()");
}

TORCH_LIBRARY_IMPL(tilefuse, CompositeImplicitAutograd, m) {
  m.impl("cross_entropy", crossEntropy);
  m.impl("cross_entropy_with_z_loss", crossEntropyWithZLoss);
  m.impl("cross_entropy_inplace_backward", crossEntropyInplaceBackward);
}

#define TILEFUSE_CROSS_ENTROPY_DEVICE_KERNELS(key)                             \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("cross_entropy_fwd", crossEntropyFwd);                              \
    m.impl("cross_entropy_bwd", crossEntropyBwd);                              \
    m.impl("cross_entropy_target_bwd", crossEntropyTargetBwd);                 \
    m.impl("cross_entropy_weight_bwd", crossEntropyWeightBwd);                 \
    m.impl("cross_entropy_fwd_grad_", crossEntropyFwdGrad);                    \
    m.impl("scale_grad_", scaleGrad);                                          \
  }
TILEFUSE_CROSS_ENTROPY_DEVICE_KERNELS(CPU)
TILEFUSE_CROSS_ENTROPY_DEVICE_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("cross_entropy_fwd", crossEntropyFwdMeta);
  m.impl("cross_entropy_bwd", crossEntropyBwdMeta);
  m.impl("cross_entropy_target_bwd", crossEntropyTargetBwdMeta);
  m.impl("cross_entropy_weight_bwd", crossEntropyWeightBwdMeta);
  m.impl("cross_entropy_fwd_grad_", crossEntropyFwdGradMeta);
  m.impl("scale_grad_", scaleGradMeta);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  m.impl("cross_entropy_fwd",
         [](const Tensor &logits, const Tensor &target,
            const std::optional<Tensor> &weight, int64_t ignoreIndex,
            double labelSmoothing, double lseSquareScale,
            std::optional<double> softcap, int64_t reduction) {
           checkNoWeightGrad(weight, target);
           if (!(weight ? needsGraph(kOp, logits, target, *weight)
                        : needsGraph(kOp, logits, target))) {
             at::AutoDispatchBelowADInplaceOrView below;
             return fwdOp().call(logits, target, weight, ignoreIndex,
                                 labelSmoothing, lseSquareScale, softcap,
                                 reduction);
           }
           variable_list out = CrossEntropyFunction::apply(
               logits, target, weight, ignoreIndex, labelSmoothing,
               lseSquareScale, softcap, reduction);
           return ForwardRows(out[0], out[1], out[2], out[3], out[4]);
         });
  m.impl("cross_entropy_fwd_grad_",
         [](const Tensor &logits, const Tensor &target,
            const std::optional<Tensor> &weight, int64_t ignoreIndex,
            double labelSmoothing, double lseSquareScale,
            std::optional<double> softcap, int64_t reduction) {
           checkNoWeightGrad(weight, target, /*inplace=*/true);
           TORCH_CHECK_VALUE(!target.requires_grad(),
                             "tilefuse.cross_entropy: inplace_backward=True "
                             "cannot give 'target' a gradient");
           if (!needsGraph(kOp, logits)) {
             at::AutoDispatchBelowAutograd below;
             return fwdGradOp().call(logits, target, weight, ignoreIndex,
                                     labelSmoothing, lseSquareScale, softcap,
                                     reduction);
           }
           variable_list out = InplaceCrossEntropyFunction::apply(
               logits, target, weight, ignoreIndex, labelSmoothing,
               lseSquareScale, softcap, reduction);
           return TensorPair(out[0], out[1]);
         });
  // Backward kernels have no backward: differentiating them raises.
  for (const char *op : {"cross_entropy_bwd", "cross_entropy_target_bwd",
                         "cross_entropy_weight_bwd", "scale_grad_"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}

TORCH_LIBRARY_IMPL(tilefuse, ADInplaceOrView, m) {
  m.impl("cross_entropy_fwd_grad_",
         [](const Tensor &logits, const Tensor &target,
            const std::optional<Tensor> &weight, int64_t ignoreIndex,
            double labelSmoothing, double lseSquareScale,
            std::optional<double> softcap, int64_t reduction) {
           TensorPair result;
           {
             at::AutoDispatchBelowADInplaceOrView below;
             result = fwdGradOp().call(logits, target, weight, ignoreIndex,
                                       labelSmoothing, lseSquareScale, softcap,
                                       reduction);
           }
           torch::autograd::increment_version(logits);
           return result;
         });
  m.impl("scale_grad_", [](const Tensor &gradient, const Tensor &gradOutput) {
    static auto op = findOp<ScaleGradOp>("tilefuse::scale_grad_");
    {
      at::AutoDispatchBelowADInplaceOrView below;
      op.call(gradient, gradOutput);
    }
    torch::autograd::increment_version(gradient);
  });
}
