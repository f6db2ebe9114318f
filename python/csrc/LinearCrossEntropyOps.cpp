//===- LinearCrossEntropyOps.cpp - the fused linear cross-entropy ---------===//
//
// The cross-entropy of input @ weight.T (+ bias), the language-model head
// and its loss, without ever holding the [tokens, vocab] logits: tokens go
// in chunks of chunk_rows rows (the public op sizes them from the vocabulary
// and a memory budget). Each chunk's logits come from PyTorch's matmul
// (cuBLAS on a GPU) into one reused buffer; the fused cross-entropy kernel
// turns them into the chunk's losses and, in place, their gradient; and
// matmuls turn that into the chunk's rows of dinput and its share of
// dweight and dbias. With 'mean' or 'sum' this happens in the forward (as
// Liger-Kernel does) and the backward only scales the gradients by the
// incoming one, in place; with 'none' the incoming gradient differs per row
// and the backward recomputes the chunks.
//   - linear_cross_entropy (CompositeImplicitAutograd): the public op;
//   - linear_cross_entropy_fwd: the loss (Autograd kernel: the above);
//   - linear_cross_entropy_fwd_grad / _bwd: the loss with the gradients,
//     and the gradients for per-row upstream gradients.
//
//===----------------------------------------------------------------------===//

#include "CrossEntropyKernels.h"
#include "TorchOpSupport.h"

#include "tilefuse/Torch/Ops.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

using at::Tensor;
using namespace tilefuse::torch_ops;
using namespace tilefuse::torch_ops::cross_entropy;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char *kOp = "linear_cross_entropy";

/// The logits of one chunk take at most this many bytes unless the caller
/// says otherwise: big enough for efficient matmuls, a fraction of the
/// [tokens, vocab] logits at language-model sizes.
constexpr int64_t kDefaultChunkBytes = int64_t(256) << 20;

using GradMask = std::array<bool, 3>; // input, weight, bias
using TensorFive = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

using FwdOp = TensorPair(const Tensor &, const Tensor &,
                         const std::optional<Tensor> &, const Tensor &,
                         const std::optional<Tensor> &, int64_t, double, double,
                         std::optional<double>, int64_t, int64_t);
using FwdGradOp = TensorFive(const Tensor &, const Tensor &,
                             const std::optional<Tensor> &, const Tensor &,
                             const std::optional<Tensor> &, int64_t, double,
                             double, std::optional<double>, int64_t, int64_t,
                             GradMask);
using BwdOp = TensorTriple(const Tensor &, const Tensor &, const Tensor &,
                           const std::optional<Tensor> &, const Tensor &,
                           const std::optional<Tensor> &, int64_t, double,
                           double, std::optional<double>, int64_t, int64_t,
                           GradMask);
using ScaleGradOp = void(const Tensor &, const Tensor &);
using PublicOp = TensorPair(const Tensor &, const Tensor &, const Tensor &,
                            const std::optional<Tensor> &,
                            const std::optional<Tensor> &, int64_t,
                            c10::string_view, double, double,
                            std::optional<double>, std::optional<int64_t>);

const c10::TypedOperatorHandle<FwdOp> &fwdOp() {
  static auto op = findOp<FwdOp>("tilefuse::linear_cross_entropy_fwd");
  return op;
}

/// One call's problem: [rows, hidden] input, [vocab, hidden] weight, and
/// flat targets ([rows] class indices or [rows, vocab] probabilities).
struct Problem {
  Tensor input, weight;
  std::optional<Tensor> bias;
  Tensor target;
  Targets targets;
  Options options;
  int64_t chunkRows;

  int64_t rows() const { return input.size(0); }
  int64_t vocab() const { return weight.size(0); }
};

Problem problemOf(const Tensor &input, const Tensor &weight,
                  const std::optional<Tensor> &bias, const Tensor &target,
                  const std::optional<Tensor> &classWeight, int64_t ignoreIndex,
                  double labelSmoothing, double lseSquareScale,
                  std::optional<double> softcap, int64_t reduction,
                  int64_t chunkRows, bool checkTargets) {
  TORCH_CHECK_VALUE(input.dim() == 2 && weight.dim() == 2 &&
                        input.size(1) == weight.size(1) && chunkRows >= 1,
                    "tilefuse.linear_cross_entropy: expected [rows, hidden] "
                    "input, [vocab, hidden] weight and chunk_rows >= 1, got ",
                    input.sizes(), ", ", weight.sizes(), " and ", chunkRows);
  Options options{ignoreIndex, labelSmoothing, lseSquareScale, softcap,
                  checkReduction(kOp, reduction)};
  Targets targets =
      prepareTargets(kOp, target, classWeight, ignoreIndex, weight.size(0),
                     input.options(), checkTargets);
  return {input.contiguous(), weight,  bias,     target.contiguous(),
          std::move(targets), options, chunkRows};
}

/// Where the chunks put their results; undefined tensors are not computed.
struct Results {
  Tensor loss, zLoss;            // [rows], compute dtype
  Tensor dinput, dweight, dbias; // dweight and dbias accumulate
  Tensor weightPartial;          // a chunk's 16-bit dweight, on the CPU
};

/// The accumulator of a gradient summed over chunks: f32 for 16-bit
/// parameters when there is more than one chunk (rounding the running sum
/// to 16 bits after every chunk would lose what each chunk adds).
at::ScalarType accumulatorDtype(const Problem &problem) {
  at::ScalarType dtype = problem.weight.scalar_type();
  bool wide = dtype == at::kFloat || dtype == at::kDouble;
  return wide || problem.rows() <= problem.chunkRows ? dtype : at::kFloat;
}

/// dweight (+)= dlogits.T @ input for one chunk.
void accumulateWeightGrad(Results &results, const Tensor &dlogits,
                          const Tensor &input, bool first) {
  Tensor &dweight = results.dweight;
  if (dweight.scalar_type() == dlogits.scalar_type()) {
    if (first)
      at::mm_out(dweight, dlogits.t(), input);
    else
      dweight.addmm_(dlogits.t(), input);
  } else if (dweight.is_cuda()) {
    // 16-bit operands, f32 accumulator: cuBLAS takes them as they are.
    at::addmm_out(dweight, dweight, dlogits.t(), input, at::kFloat,
                  /*beta=*/first ? 0 : 1);
  } else {
    // ATen's CPU matmul has no f32 output for 16-bit operands: the chunk's
    // product (accumulated in f32 inside the matmul) rounds once to 16 bits,
    // then adds up in f32.
    at::mm_out(results.weightPartial, dlogits.t(), input);
    dweight.add_(results.weightPartial);
  }
}

/// Runs every chunk. Without `dloss` only the losses; with it (per-row
/// upstream gradients of the loss and of the z-loss) also the gradients
/// `results` has room for.
void runChunks(const Problem &problem, const Tensor &dloss,
               const Tensor &dzLoss, Results &results) {
  int64_t rows = problem.rows();
  int64_t chunk = std::min(problem.chunkRows, std::max<int64_t>(rows, 1));
  Tensor buffer = at::empty({chunk, problem.vocab()}, problem.input.options());
  Tensor weightT = problem.weight.t();
  for (int64_t start = 0; start < rows; start += chunk) {
    int64_t length = std::min(chunk, rows - start);
    Tensor input = problem.input.narrow(0, start, length);
    Tensor logits = buffer.narrow(0, 0, length);
    if (problem.bias)
      at::addmm_out(logits, *problem.bias, input, weightT);
    else
      at::mm_out(logits, input, weightT);
    Targets targets = problem.targets.rows(start, length);
    Tensor target = problem.target.narrow(0, start, length);
    std::vector<Tensor> losses = {results.loss.narrow(0, start, length),
                                  results.zLoss.narrow(0, start, length)};
    if (!dloss.defined()) {
      runForward(kOp, logits, target, targets, problem.options, losses);
      continue;
    }
    runForwardGrad(kOp, logits, target, targets, problem.options,
                   dloss.narrow(0, start, length),
                   dzLoss.narrow(0, start, length), losses);
    // `logits` now holds the chunk's dlogits.
    if (results.dinput.defined()) {
      Tensor rows = results.dinput.narrow(0, start, length);
      at::mm_out(rows, logits, problem.weight);
    }
    if (results.dweight.defined())
      accumulateWeightGrad(results, logits, input, start == 0);
    if (results.dbias.defined()) {
      Tensor sum = logits.sum(0, false, results.dbias.scalar_type());
      if (start == 0)
        results.dbias.copy_(sum);
      else
        results.dbias.add_(sum);
    }
  }
}

/// Room for the per-row losses.
Results lossRows(const Problem &problem) {
  auto rowOptions = problem.input.options().dtype(rowDtype(problem.input));
  Results results;
  results.loss = at::empty({problem.rows()}, rowOptions);
  results.zLoss = at::empty({problem.rows()}, rowOptions);
  return results;
}

/// Every chunk with the gradients `mask` asks for, for `grad`, the upstream
/// gradient of the reduced loss.
Results runWithGradients(const Problem &problem, const Tensor &grad,
                         GradMask mask) {
  Results results = lossRows(problem);
  auto options = problem.input.options();
  auto accumulator = options.dtype(accumulatorDtype(problem));
  if (mask[0])
    results.dinput = at::empty(problem.input.sizes(), options);
  // Zeros where no chunk may write (no rows).
  if (mask[1]) {
    results.dweight = at::zeros(problem.weight.sizes(), accumulator);
    if (accumulator.dtype() != options.dtype() && !options.device().is_cuda())
      results.weightPartial = at::empty(problem.weight.sizes(), options);
  }
  if (mask[2] && problem.bias)
    results.dbias = at::zeros({problem.vocab()}, accumulator);
  auto [dloss, dzLoss] =
      rowGradients(grad, problem.targets, problem.options.reduction,
                   {problem.rows()}, results.loss.scalar_type());
  runChunks(problem, dloss, dzLoss, results);
  return results;
}

/// The gradients in their parameters' dtypes; an empty tensor for each
/// one not computed.
TensorTriple finishGradients(const Problem &problem, const Results &results) {
  auto finish = [&](const Tensor &gradient) {
    return gradient.defined() ? gradient.to(problem.weight.scalar_type())
                              : problem.input.new_empty({0});
  };
  return {finish(results.dinput), finish(results.dweight),
          finish(results.dbias)};
}

//===----------------------------------------------------------------------===//
// Kernels (CPU and CUDA) and their shapes
//===----------------------------------------------------------------------===//

TensorPair linearCrossEntropyFwd(const Tensor &input, const Tensor &weight,
                                 const std::optional<Tensor> &bias,
                                 const Tensor &target,
                                 const std::optional<Tensor> &classWeight,
                                 int64_t ignoreIndex, double labelSmoothing,
                                 double lseSquareScale,
                                 std::optional<double> softcap,
                                 int64_t reduction, int64_t chunkRows) {
  Problem problem = problemOf(input, weight, bias, target, classWeight,
                              ignoreIndex, labelSmoothing, lseSquareScale,
                              softcap, reduction, chunkRows, true);
  Results results = lossRows(problem);
  runChunks(problem, Tensor(), Tensor(), results);
  auto [loss, zLoss] =
      reduceLoss(results.loss, results.zLoss, problem.targets, problem.options);
  return {loss, zLoss};
}

TensorFive linearCrossEntropyFwdGrad(
    const Tensor &input, const Tensor &weight,
    const std::optional<Tensor> &bias, const Tensor &target,
    const std::optional<Tensor> &classWeight, int64_t ignoreIndex,
    double labelSmoothing, double lseSquareScale, std::optional<double> softcap,
    int64_t reduction, int64_t chunkRows, GradMask mask) {
  Problem problem = problemOf(input, weight, bias, target, classWeight,
                              ignoreIndex, labelSmoothing, lseSquareScale,
                              softcap, reduction, chunkRows, true);
  Results results = runWithGradients(
      problem, at::ones({}, input.options().dtype(rowDtype(input))), mask);
  auto [loss, zLoss] =
      reduceLoss(results.loss, results.zLoss, problem.targets, problem.options);
  auto [dinput, dweight, dbias] = finishGradients(problem, results);
  return {loss, zLoss, dinput, dweight, dbias};
}

TensorTriple linearCrossEntropyBwd(
    const Tensor &gradLoss, const Tensor &input, const Tensor &weight,
    const std::optional<Tensor> &bias, const Tensor &target,
    const std::optional<Tensor> &classWeight, int64_t ignoreIndex,
    double labelSmoothing, double lseSquareScale, std::optional<double> softcap,
    int64_t reduction, int64_t chunkRows, GradMask mask) {
  Problem problem = problemOf(input, weight, bias, target, classWeight,
                              ignoreIndex, labelSmoothing, lseSquareScale,
                              softcap, reduction, chunkRows, false);
  return finishGradients(problem, runWithGradients(problem, gradLoss, mask));
}

TensorPair linearCrossEntropyFwdMeta(const Tensor &input, const Tensor &,
                                     const std::optional<Tensor> &,
                                     const Tensor &,
                                     const std::optional<Tensor> &, int64_t,
                                     double, double, std::optional<double>,
                                     int64_t reduction, int64_t) {
  Reduction mode = checkReduction(kOp, reduction);
  return {emptyLoss(input, mode), emptyLoss(input, mode)};
}

TensorTriple gradientsMeta(const Tensor &input, const Tensor &weight,
                           const std::optional<Tensor> &bias, GradMask mask) {
  auto shaped = [&](const Tensor &like, bool wanted) {
    return wanted ? emptyLike(like) : like.new_empty({0});
  };
  return {shaped(input, mask[0]), shaped(weight, mask[1]),
          bias ? shaped(*bias, mask[2]) : input.new_empty({0})};
}

TensorFive linearCrossEntropyFwdGradMeta(
    const Tensor &input, const Tensor &weight,
    const std::optional<Tensor> &bias, const Tensor &target,
    const std::optional<Tensor> &classWeight, int64_t ignoreIndex,
    double labelSmoothing, double lseSquareScale, std::optional<double> softcap,
    int64_t reduction, int64_t chunkRows, GradMask mask) {
  auto [loss, zLoss] = linearCrossEntropyFwdMeta(
      input, weight, bias, target, classWeight, ignoreIndex, labelSmoothing,
      lseSquareScale, softcap, reduction, chunkRows);
  auto [dinput, dweight, dbias] = gradientsMeta(input, weight, bias, mask);
  return {loss, zLoss, dinput, dweight, dbias};
}

TensorTriple linearCrossEntropyBwdMeta(const Tensor &, const Tensor &input,
                                       const Tensor &weight,
                                       const std::optional<Tensor> &bias,
                                       const Tensor &,
                                       const std::optional<Tensor> &, int64_t,
                                       double, double, std::optional<double>,
                                       int64_t, int64_t, GradMask mask) {
  return gradientsMeta(input, weight, bias, mask);
}

//===----------------------------------------------------------------------===//
// Autograd
//===----------------------------------------------------------------------===//

struct LinearCrossEntropyFunction
    : torch::autograd::Function<LinearCrossEntropyFunction> {
  static variable_list
  forward(AutogradContext *ctx, const Tensor &input, const Tensor &weight,
          const std::optional<Tensor> &bias, const Tensor &target,
          const std::optional<Tensor> &classWeight, int64_t ignoreIndex,
          double labelSmoothing, double lseSquareScale,
          std::optional<double> softcap, int64_t reduction, int64_t chunkRows) {
    static auto fwdGradOp =
        findOp<FwdGradOp>("tilefuse::linear_cross_entropy_fwd_grad");
    GradMask mask = {input.requires_grad(), weight.requires_grad(),
                     bias && bias->requires_grad()};
    at::AutoDispatchBelowADInplaceOrView below;
    Tensor loss, zLoss;
    if (reduction == None) {
      // Each row's upstream gradient is known only in the backward.
      std::tie(loss, zLoss) = fwdOp().call(
          input, weight, bias, target, classWeight, ignoreIndex, labelSmoothing,
          lseSquareScale, softcap, reduction, chunkRows);
      ctx->save_for_backward({input, weight, bias.value_or(Tensor()), target,
                              classWeight.value_or(Tensor())});
      ctx->saved_data["ignore_index"] = ignoreIndex;
      ctx->saved_data["label_smoothing"] = labelSmoothing;
      ctx->saved_data["lse_square_scale"] = lseSquareScale;
      ctx->saved_data["softcap"] = softcap;
      ctx->saved_data["chunk_rows"] = chunkRows;
    } else {
      auto [total, z, dinput, dweight, dbias] = fwdGradOp.call(
          input, weight, bias, target, classWeight, ignoreIndex, labelSmoothing,
          lseSquareScale, softcap, reduction, chunkRows, mask);
      loss = total;
      zLoss = z;
      ctx->save_for_backward({dinput, dweight, dbias});
    }
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["mask"] = mask[0] | mask[1] << 1 | mask[2] << 2;
    ctx->mark_non_differentiable({zLoss});
    return {loss, zLoss};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto bwdOp = findOp<BwdOp>("tilefuse::linear_cross_entropy_bwd");
    static auto scaleOp = findOp<ScaleGradOp>("tilefuse::scale_grad_");
    variable_list result(11);
    if (!grads[0].defined())
      return result;
    auto &data = ctx->saved_data;
    int64_t bits = data["mask"].toInt();
    GradMask mask = {(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0};
    variable_list saved = ctx->get_saved_variables();
    Tensor gradients[3];
    if (data["reduction"].toInt() == None) {
      auto optional = [](const Tensor &t) {
        return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
      };
      std::tie(gradients[0], gradients[1], gradients[2]) =
          bwdOp.call(grads[0], saved[0], saved[1], optional(saved[2]), saved[3],
                     optional(saved[4]), data["ignore_index"].toInt(),
                     data["label_smoothing"].toDouble(),
                     data["lse_square_scale"].toDouble(),
                     data["softcap"].toOptional<double>(), None,
                     data["chunk_rows"].toInt(), mask);
    } else {
      // The forward computed the gradients for an upstream gradient of 1;
      // scaling them in place keeps no second copy, so it happens once.
      TORCH_CHECK_NOT_IMPLEMENTED(!grads[0].requires_grad(),
                                  "tilefuse.linear_cross_entropy: "
                                  "second-order gradients are not supported");
      auto &used = data["used"];
      TORCH_CHECK(used.isNone(),
                  "tilefuse.linear_cross_entropy: with reduction 'mean' or "
                  "'sum' the backward scales the gradients the forward "
                  "computed in place, so it can run only once "
                  "(retain_graph=True is not supported)");
      used = true;
      for (int i = 0; i < 3; ++i) {
        gradients[i] = saved[i];
        if (mask[i])
          scaleOp.call(gradients[i], grads[0]);
      }
    }
    result[0] = mask[0] ? gradients[0] : Tensor();
    result[1] = mask[1] ? gradients[1] : Tensor();
    result[2] = mask[2] ? gradients[2] : Tensor();
    return result;
  }
};

//===----------------------------------------------------------------------===//
// The public op
//===----------------------------------------------------------------------===//

/// linearCrossEntropy after autocast's casts, its loss in `lossType`.
TensorPair linearCrossEntropyIn(
    const Tensor &input, const Tensor &weight, const Tensor &target,
    const std::optional<Tensor> &bias, const std::optional<Tensor> &classWeight,
    int64_t ignoreIndex, c10::string_view reduction, double labelSmoothing,
    double lseSquareScale, std::optional<double> softcap,
    std::optional<int64_t> chunkBytes, at::ScalarType lossType) {
  checkFloat(kOp, "input", input);
  TORCH_CHECK_VALUE(input.dim() >= 1, "tilefuse.linear_cross_entropy: "
                                      "'input' must be [..., hidden], got a "
                                      "0-d tensor");
  TORCH_CHECK_VALUE(
      weight.dim() == 2 && weight.sym_size(1) == input.sym_size(-1) &&
          weight.sym_size(0) >= 1,
      "tilefuse.linear_cross_entropy: 'weight' must be [vocab, ",
      input.sym_size(-1), "] ([vocab, hidden]), got ", weight.sym_sizes());
  TORCH_CHECK_TYPE(weight.scalar_type() == input.scalar_type(),
                   "tilefuse.linear_cross_entropy: 'weight' is ",
                   weight.scalar_type(), ", 'input' is ", input.scalar_type());
  checkSameDevice(kOp, "weight", weight, "input", input);
  c10::SymInt vocab = weight.sym_size(0);
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == input.scalar_type(),
                     "tilefuse.linear_cross_entropy: 'bias' is ",
                     bias->scalar_type(), ", 'input' is ", input.scalar_type());
    checkColumn(kOp, "bias", *bias, input, vocab);
  }
  bool probs = at::isFloatingType(target.scalar_type());
  std::optional<Tensor> ceWeight;
  if (classWeight) {
    TORCH_CHECK_VALUE(
        !classWeight->requires_grad() || !at::GradMode::is_enabled(),
        "tilefuse.linear_cross_entropy: 'ce_weight' (the class weights) "
        "requires grad, but ",
        probs ? "linear_cross_entropy gives it no gradient (torch's "
                "cross_entropy gives one with probability targets: use "
                "tilefuse.functional.cross_entropy on the logits there)"
              : "the loss is not differentiable with respect to it with "
                "class-index targets (as torch's nll_loss)",
        ": detach it");
    ceWeight = checkColumn(kOp, "ce_weight", *classWeight, input, vocab);
  }
  c10::SymIntArrayRef rows = leadingSymDims(input);
  Tensor flatTarget;
  if (probs) {
    std::vector<c10::SymInt> shape(rows.begin(), rows.end());
    shape.push_back(vocab);
    TORCH_CHECK_VALUE(target.sym_sizes() == c10::SymIntArrayRef(shape),
                      "tilefuse.linear_cross_entropy: probability targets "
                      "must have shape ",
                      c10::SymIntArrayRef(shape), ", got ", target.sym_sizes());
    TORCH_CHECK_VALUE(!target.requires_grad(),
                      "tilefuse.linear_cross_entropy: 'target' requires "
                      "grad, which is not supported");
    flatTarget = target.to(input.scalar_type()).reshape_symint({-1, vocab});
  } else {
    TORCH_CHECK_TYPE(target.scalar_type() == at::kLong ||
                         target.scalar_type() == at::kByte,
                     "tilefuse.linear_cross_entropy: 'target' must hold int64 "
                     "(or uint8) class indices or float probabilities, got ",
                     target.scalar_type());
    TORCH_CHECK_VALUE(
        target.sym_sizes() == rows,
        "tilefuse.linear_cross_entropy: 'target' must have shape ", rows,
        ", got ", target.sym_sizes());
    flatTarget = target.to(at::kLong).reshape({-1});
  }
  checkSameDevice(kOp, "target", target, "input", input);
  Options options{ignoreIndex, labelSmoothing, lseSquareScale, softcap,
                  parseReduction(kOp, reduction)};
  checkOptions(kOp, options, probs);
  int64_t budget = chunkBytes.value_or(kDefaultChunkBytes);
  TORCH_CHECK_VALUE(budget > 0,
                    "tilefuse.linear_cross_entropy: chunk_bytes "
                    "must be positive, got ",
                    budget);
  int64_t rowBytes = vocab.guard_int(__FILE__, __LINE__) * input.element_size();
  int64_t chunkRows = std::max<int64_t>(1, budget / rowBytes);
  auto [loss, zLoss] =
      fwdOp().call(input.reshape_symint({-1, input.sym_size(-1)}), weight, bias,
                   flatTarget, ceWeight, ignoreIndex, labelSmoothing,
                   lseSquareScale, softcap, options.reduction, chunkRows);
  if (options.reduction == None) {
    loss = loss.view_symint(rows);
    zLoss = zLoss.view_symint(rows);
  }
  return {loss.to(lossType), zLoss.to(lossType)};
}

/// The public op. Under autocast the matmul runs in autocast's dtype, as
/// torch's linear (float64 kept), and the loss is float32, as torch's
/// cross_entropy; otherwise both are in the input's dtype.
TensorPair linearCrossEntropy(const Tensor &input, const Tensor &weight,
                              const Tensor &target,
                              const std::optional<Tensor> &bias,
                              const std::optional<Tensor> &classWeight,
                              int64_t ignoreIndex, c10::string_view reduction,
                              double labelSmoothing, double lseSquareScale,
                              std::optional<double> softcap,
                              std::optional<int64_t> chunkBytes) {
  c10::DeviceType device = input.device().type();
  if (!at::autocast::is_autocast_available(device) || // meta
      !at::autocast::is_autocast_enabled(device))
    return linearCrossEntropyIn(input, weight, target, bias, classWeight,
                                ignoreIndex, reduction, labelSmoothing,
                                lseSquareScale, softcap, chunkBytes,
                                input.scalar_type());
  at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
  Tensor castInput = at::autocast::cached_cast(dtype, input, device);
  at::ScalarType lossType = at::isReducedFloatingType(castInput.scalar_type())
                                ? at::kFloat
                                : castInput.scalar_type();
  return linearCrossEntropyIn(
      castInput, at::autocast::cached_cast(dtype, weight, device), target,
      at::autocast::cached_cast(dtype, bias, device), classWeight, ignoreIndex,
      reduction, labelSmoothing, lseSquareScale, softcap, chunkBytes, lossType);
}

} // namespace

std::tuple<at::Tensor, at::Tensor> tilefuse::ops::linear_cross_entropy(
    const at::Tensor &input, const at::Tensor &weight, const at::Tensor &target,
    const std::optional<at::Tensor> &bias, const CrossEntropyOptions &options,
    std::optional<int64_t> chunkBytes) {
  static auto op = findOp<PublicOp>("tilefuse::linear_cross_entropy");
  TORCH_CHECK_VALUE(!options.inplaceBackward,
                    "tilefuse.linear_cross_entropy: inplaceBackward does not "
                    "apply (the logits are chunks the op owns)");
  return op.call(input, weight, target, bias, options.weight,
                 options.ignoreIndex, options.reduction, options.labelSmoothing,
                 options.lseSquareScale, options.softcap, chunkBytes);
}

#define TILEFUSE_LINEAR_CE_KERNEL_ARGUMENTS                                    \
  "Tensor input, Tensor weight, Tensor? bias, Tensor target, "                 \
  "Tensor? ce_weight, int ignore_index, float label_smoothing, "               \
  "float lse_square_scale, float? softcap, int reduction, int chunk_rows"

TORCH_LIBRARY_FRAGMENT(tilefuse, m) {
  m.def("linear_cross_entropy(Tensor input, Tensor weight, Tensor target, "
        "Tensor? bias=None, Tensor? ce_weight=None, int ignore_index=-100, "
        "str reduction='mean', float label_smoothing=0.0, *, "
        "float lse_square_scale=0.0, float? softcap=None, "
        "int? chunk_bytes=None) -> (Tensor, Tensor)");
  m.def("linear_cross_entropy_fwd(" TILEFUSE_LINEAR_CE_KERNEL_ARGUMENTS
        ") -> (Tensor, Tensor)");
  // grad_mask: which of dinput, dweight, dbias to compute (the others are
  // empty).
  m.def("linear_cross_entropy_fwd_grad(" TILEFUSE_LINEAR_CE_KERNEL_ARGUMENTS
        ", bool[3] grad_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("linear_cross_entropy_bwd(Tensor "
        "grad_loss, " TILEFUSE_LINEAR_CE_KERNEL_ARGUMENTS
        ", bool[3] grad_mask) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tilefuse, CompositeImplicitAutograd, m) {
  m.impl("linear_cross_entropy", linearCrossEntropy);
}

#define TILEFUSE_LINEAR_CE_DEVICE_KERNELS(key)                                 \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("linear_cross_entropy_fwd", linearCrossEntropyFwd);                 \
    m.impl("linear_cross_entropy_fwd_grad", linearCrossEntropyFwdGrad);        \
    m.impl("linear_cross_entropy_bwd", linearCrossEntropyBwd);                 \
  }
TILEFUSE_LINEAR_CE_DEVICE_KERNELS(CPU)
TILEFUSE_LINEAR_CE_DEVICE_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("linear_cross_entropy_fwd", linearCrossEntropyFwdMeta);
  m.impl("linear_cross_entropy_fwd_grad", linearCrossEntropyFwdGradMeta);
  m.impl("linear_cross_entropy_bwd", linearCrossEntropyBwdMeta);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  m.impl("linear_cross_entropy_fwd",
         [](const Tensor &input, const Tensor &weight,
            const std::optional<Tensor> &bias, const Tensor &target,
            const std::optional<Tensor> &classWeight, int64_t ignoreIndex,
            double labelSmoothing, double lseSquareScale,
            std::optional<double> softcap, int64_t reduction,
            int64_t chunkRows) {
           bool needed = bias ? needsGraph(kOp, input, weight, *bias)
                              : needsGraph(kOp, input, weight);
           if (!needed) {
             at::AutoDispatchBelowADInplaceOrView below;
             return fwdOp().call(input, weight, bias, target, classWeight,
                                 ignoreIndex, labelSmoothing, lseSquareScale,
                                 softcap, reduction, chunkRows);
           }
           variable_list out = LinearCrossEntropyFunction::apply(
               input, weight, bias, target, classWeight, ignoreIndex,
               labelSmoothing, lseSquareScale, softcap, reduction, chunkRows);
           return TensorPair(out[0], out[1]);
         });
  // The gradient kernels have no backward: differentiating them raises.
  for (const char *op :
       {"linear_cross_entropy_fwd_grad", "linear_cross_entropy_bwd"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
