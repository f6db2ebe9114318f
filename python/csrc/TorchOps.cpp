//===- TorchOps.cpp - the tilefuse:: ops in PyTorch's dispatcher ----------===//
//
// The built-ins as LibTorch ops, so a call costs one dispatch and no Python:
//   - public ops with the signatures of torch.nn.functional,
//     CompositeImplicitAutograd: they check their arguments, fill in
//     defaults and call
//   - *_fwd / *_bwd ops: CPU and CUDA kernels (TorchRunner), Meta kernels
//     (torch.compile traces with them), and for *_fwd an Autograd kernel
//     whose backward is the fused *_bwd kernel;
//   - launch_fusion, which runs a fusion the Python DSL traced or
//     register_fusion parsed from fuse IR text;
//   - compile_count: compilations so far (not counting cache hits).
// This file holds cross_entropy, the fusion ops and the library's
// TORCH_LIBRARY; NormOps.cpp (rms_norm, layer_norm), GluOps.cpp (swiglu,
// geglu) and AdamWOps.cpp (adamw_step_) add theirs as fragments.
// Errors are TypeError / ValueError / IndexError naming the op and argument.
//
//===----------------------------------------------------------------------===//

#include "TorchOpSupport.h"
#include "TorchRunner.h"

#include "tilefuse/Runtime/Fusion.h"
#include "tilefuse/Torch/Ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
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
using tilefuse::torch_ops::TensorPair;
using tilefuse::torch_ops::checkFloat;
using tilefuse::torch_ops::checkSameDevice;
using tilefuse::torch_ops::rowDtype;
using tilefuse::torch_ops::emptyRows;
using tilefuse::torch_ops::emptyLike;
using tilefuse::torch_ops::needsGraph;
using tilefuse::torch_ops::findOp;
using tilefuse::torch_ops::BuiltinFusion;
using tilefuse::torch_ops::runFusion;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

/// The built-in fusions the kernels run.
BuiltinFusion crossEntropyFwdFusion("cross_entropy_fwd");
BuiltinFusion crossEntropyBwdFusion("cross_entropy_bwd");

/// The typed handles the public ops and autograd kernels call through.
using CrossEntropyFwdOp = TensorPair(const Tensor &, const Tensor &, int64_t,
                                     double, int64_t);

const c10::TypedOperatorHandle<CrossEntropyFwdOp> &crossEntropyFwdOp() {
  static auto op = findOp<CrossEntropyFwdOp>("tilefuse::cross_entropy_fwd");
  return op;
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
                   iterationTensor(fusion, tensors).sizes(), out,
                   /*storagePerTensor=*/false, scalarSlots);
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

TORCH_LIBRARY(tilefuse, m) {
  m.def("cross_entropy(Tensor input, Tensor target, Tensor? weight=None, "
        "int ignore_index=-100, str reduction='mean', "
        "float label_smoothing=0.0) -> Tensor");
  // reduction: 0 none, 1 mean, 2 sum (at::Reduction).
  m.def("cross_entropy_fwd(Tensor logits, Tensor target, int ignore_index, "
        "float label_smoothing, int reduction) -> (Tensor, Tensor)");
  m.def("cross_entropy_bwd(Tensor logits, Tensor target, Tensor lse, "
        "Tensor dloss, int ignore_index, float label_smoothing) -> Tensor");
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
  m.impl("cross_entropy", crossEntropy);
}

// One implementation serves both devices: TorchRunner picks the target.
#define TILEFUSE_DEVICE_KERNELS(key)                                           \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("cross_entropy_fwd", crossEntropyFwd);                              \
    m.impl("cross_entropy_bwd", crossEntropyBwd);                              \
    m.impl("launch_fusion", launchFusion);                                     \
    m.impl("launch_fusion_forward", launchFusionForward);                      \
    m.impl("launch_fusion_backward", launchFusionBackward);                    \
  }
TILEFUSE_DEVICE_KERNELS(CPU)
TILEFUSE_DEVICE_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("cross_entropy_fwd", crossEntropyFwdMeta);
  m.impl("cross_entropy_bwd", crossEntropyBwdMeta);
  m.impl("launch_fusion_forward", launchFusionForwardMeta);
  m.impl("launch_fusion_backward", launchFusionBackwardMeta);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  // Function::apply only when a gradient is needed: the rest go straight
  // below autograd.
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
  m.impl("launch_fusion", launchFusionAutograd);
  // Backward kernels have no backward: differentiating them raises.
  for (const char *op :
       {"cross_entropy_bwd", "launch_fusion_forward", "launch_fusion_backward"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
