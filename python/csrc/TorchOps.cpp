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
//     register_fusion parsed from fuse IR text, and launch_fusion_, which
//     runs one writing outputs in place (its schema names what it writes);
//   - compile_count: compilations so far (not counting cache hits).
// This file holds the fusion ops and the library's TORCH_LIBRARY;
// NormOps.cpp (rms_norm, layer_norm), GluOps.cpp (swiglu, geglu),
// AdamWOps.cpp (adamw_step_), CrossEntropyOps.cpp (cross_entropy) and
// LinearCrossEntropyOps.cpp (linear_cross_entropy) add theirs as fragments.
// Errors are TypeError / ValueError / IndexError naming the op and argument.
//
//===----------------------------------------------------------------------===//

#include "TorchOpSupport.h"
#include "TorchRunner.h"

#include "tilefuse/Runtime/Fusion.h"
#include "tilefuse/Torch/Ops.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <map>
#include <mutex>

using at::Tensor;
using tilefuse::torch_ops::BuiltinFusion;
using tilefuse::torch_ops::emptyLike;
using tilefuse::torch_ops::findOp;
using tilefuse::torch_ops::needsGraph;
using tilefuse::torch_ops::runFusion;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

//===----------------------------------------------------------------------===//
// DSL fusions: launch_fusion runs one (launch_fusion_ one writing in
// place); under autograd it runs the fusion's derived forward (which also
// outputs the per-row statistics the backward reads) and records
// launch_fusion_backward, the derived backward kernel for the inputs that
// need gradients. The four have Meta kernels, so torch.compile traces them.
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

/// A slot per scalar input of `registered`: the tensor of `scalarTensors`
/// (in order) that a scalar read through a pointer takes, none for the
/// others; no slots where it reads none through pointers.
std::vector<std::optional<Tensor>>
scalarSlots(const RegisteredFusion &registered,
            std::optional<at::TensorList> scalarTensorList) {
  Fusion &fusion = registered.fusion;
  at::TensorList scalarTensors = scalarTensorList.value_or(at::TensorList());
  std::vector<std::optional<Tensor>> slots;
  if (registered.pointerScalars.empty())
    return slots;
  const Tensor *scalarTensor = scalarTensors.begin();
  for (auto [i, port] : llvm::enumerate(fusion.inputs())) {
    if (port.kind != PortInfo::Kind::Scalar)
      continue;
    bool pointer = registered.pointerScalars[i];
    TORCH_CHECK_VALUE(!pointer || scalarTensor < scalarTensors.end(),
                      "tilefuse.", fusion.name(), ": scalar '", port.name,
                      "' expects a tensor");
    slots.push_back(pointer ? std::optional<Tensor>(*scalarTensor++)
                            : std::nullopt);
  }
  return slots;
}

/// Runs `registered` over `tensors` (its tensor inputs in order): outputs
/// defined in `out` are written there, the others to new tensors.
/// `scalarTensors` are the scalars it reads through pointers, in order.
std::vector<Tensor> runLaunch(const RegisteredFusion &registered,
                              at::TensorList tensors,
                              c10::ArrayRef<c10::Scalar> scalars,
                              std::optional<at::TensorList> scalarTensors,
                              at::TensorList out) {
  Fusion &fusion = registered.fusion;
  return runFusion(fusion.name(), fusion, tensors, scalars, registered.storage,
                   iterationTensor(fusion, tensors).sizes(), out,
                   /*storagePerTensor=*/false,
                   scalarSlots(registered, scalarTensors));
}

/// What runLaunch checks before it compiles, for the Meta kernels.
void checkLaunch(const RegisteredFusion &registered, at::TensorList tensors,
                 c10::ArrayRef<c10::Scalar> scalars,
                 std::optional<at::TensorList> scalarTensors,
                 at::TensorList out = {}) {
  std::vector<std::optional<Tensor>> slots =
      scalarSlots(registered, scalarTensors);
  size_t byPointer =
      llvm::count_if(slots, [](const std::optional<Tensor> &slot) {
        return slot.has_value();
      });
  tilefuse::torch_ops::checkFusionInputs(
      registered.fusion.name(), registered, tensors, scalars.size() + byPointer,
      iterationTensor(registered.fusion, tensors).sym_sizes(), out);
  // The scalars by value, in port order (the counts match: checked above).
  const c10::Scalar *scalar = scalars.begin();
  size_t scalarIndex = 0;
  for (const PortInfo &port : registered.fusion.inputs()) {
    if (port.kind != PortInfo::Kind::Scalar)
      continue;
    bool byPointer = !slots.empty() && slots[scalarIndex].has_value();
    ++scalarIndex;
    if (!byPointer)
      tilefuse::torch_ops::checkScalar(registered.fusion.name(), port,
                                       *scalar++);
  }
}

/// Runs a fusion the DSL traced or register_fusion parsed, every output to
/// a new tensor (a handle's in-place pairs are launch_fusion_'s).
std::vector<Tensor> launchFusion(int64_t handle, at::TensorList tensors,
                                 c10::ArrayRef<c10::Scalar> scalars,
                                 std::optional<at::TensorList> scalarTensors) {
  return runLaunch(registeredFusion("launch_fusion", handle), tensors, scalars,
                   scalarTensors, {});
}

std::vector<Tensor>
launchFusionMeta(int64_t handle, at::TensorList tensors,
                 c10::ArrayRef<c10::Scalar> scalars,
                 std::optional<at::TensorList> scalarTensors) {
  RegisteredFusion registered = registeredFusion("launch_fusion", handle);
  checkLaunch(registered, tensors, scalars, scalarTensors);
  return emptyOutputs(registered, registered.fusion,
                      iterationTensor(registered.fusion, tensors).sym_sizes(),
                      tensors.front().options());
}

/// The fusion's tensor inputs in order, those it writes in place taken from
/// `written` and the others from `tensors` (launch_fusion_'s arguments).
std::vector<Tensor> mergedInputs(const RegisteredFusion &registered,
                                 at::TensorList written,
                                 at::TensorList tensors) {
  const Fusion &fusion = registered.fusion;
  llvm::SmallVector<bool> isWritten(fusion.inputs().size());
  for (auto [output, input] : registered.inplace)
    isWritten[input] = true;
  TORCH_CHECK_VALUE(
      written.size() == registered.inplace.size(), "tilefuse.", fusion.name(),
      ": argument 'written' expected ", registered.inplace.size(),
      " tensors (the inputs written in place), got ", written.size());
  std::vector<Tensor> merged;
  const Tensor *nextWritten = written.begin(), *next = tensors.begin();
  for (auto [index, port] : llvm::enumerate(fusion.inputs())) {
    if (port.kind == PortInfo::Kind::Scalar)
      continue;
    if (isWritten[index]) {
      merged.push_back(*nextWritten++);
      continue;
    }
    TORCH_CHECK_VALUE(next < tensors.end(), "tilefuse.", fusion.name(),
                      ": argument 'tensors' has too few tensors (",
                      tensors.size(), ") for the inputs not written in place");
    merged.push_back(*next++);
  }
  TORCH_CHECK_VALUE(next == tensors.end(), "tilefuse.", fusion.name(),
                    ": argument 'tensors' has ", tensors.size(),
                    " tensors; the inputs not written in place are ",
                    next - tensors.begin());
  return merged;
}

/// Where each output of the fusion goes: over its input where it writes one
/// in place (`inputs`: the tensor inputs in order), else the next of `out`.
std::vector<Tensor> outputSlots(const RegisteredFusion &registered,
                                at::TensorList inputs, at::TensorList out) {
  const Fusion &fusion = registered.fusion;
  size_t fresh = fusion.outputs().size() - registered.inplace.size();
  TORCH_CHECK_VALUE(out.size() == fresh, "tilefuse.", fusion.name(),
                    ": argument 'out' expected ", fresh,
                    " tensors (the outputs not written in place), got ",
                    out.size());
  // Each input's position among the tensors (scalars have none).
  std::vector<size_t> tensorIndex;
  size_t tensors = 0;
  for (const PortInfo &port : fusion.inputs())
    tensorIndex.push_back(port.kind == PortInfo::Kind::Scalar ? SIZE_MAX
                                                              : tensors++);
  std::vector<Tensor> slots(fusion.outputs().size());
  for (auto [output, input] : registered.inplace) {
    TORCH_CHECK_VALUE(tensorIndex[input] < inputs.size(), "tilefuse.",
                      fusion.name(), ": input ", input, " is not a tensor");
    slots[output] = inputs[tensorIndex[input]];
  }
  const Tensor *next = out.begin();
  for (Tensor &slot : slots)
    if (!slot.defined())
      slot = *next++;
  return slots;
}

/// A tensor `registered` writes in place must not overlap itself, nor
/// another of its tensors but as `mayAliasWritten` allows: one read through
/// another argument would see some updates and miss others, and two written
/// at once would take whichever landed last.
void checkInPlaceOverlap(const RegisteredFusion &registered,
                         at::TensorList inputs) {
  const Fusion &fusion = registered.fusion;
  std::vector<const PortInfo *> ports; // the tensor inputs', in order
  std::vector<size_t> positions;       // each fusion input's among them
  for (const PortInfo &port : fusion.inputs()) {
    positions.push_back(ports.size());
    if (port.kind != PortInfo::Kind::Scalar)
      ports.push_back(&port);
  }
  std::vector<bool> written(ports.size());
  for (auto [output, input] : registered.inplace)
    written[positions[input]] = true;
  for (size_t i = 0; i < ports.size(); ++i) {
    if (!written[i])
      continue;
    TORCH_CHECK_VALUE(
        at::has_internal_overlap(inputs[i]) != at::MemOverlap::Yes, "tilefuse.",
        fusion.name(), ": argument '", ports[i]->name,
        "' is updated in place and must not overlap itself");
    for (size_t j = 0; j < ports.size(); ++j)
      TORCH_CHECK_VALUE(j == i || tilefuse::torch_ops::mayAliasWritten(
                                      inputs[i], inputs[j], written[j]),
                        "tilefuse.", fusion.name(), ": argument '",
                        ports[i]->name, "' is updated in place and overlaps '",
                        ports[j]->name, "'");
  }
}

/// Runs a fusion writing the handle's in-place outputs into `written` (the
/// inputs it writes, in input order) and its other outputs into `out`.
void launchFusionInPlace(int64_t handle, at::TensorList written,
                         at::TensorList out, at::TensorList tensors,
                         c10::ArrayRef<c10::Scalar> scalars,
                         std::optional<at::TensorList> scalarTensors) {
  RegisteredFusion registered = registeredFusion("launch_fusion_", handle);
  std::vector<Tensor> inputs = mergedInputs(registered, written, tensors);
  checkInPlaceOverlap(registered, inputs);
  runLaunch(registered, inputs, scalars, scalarTensors,
            outputSlots(registered, inputs, out));
}

void launchFusionInPlaceMeta(int64_t handle, at::TensorList written,
                             at::TensorList out, at::TensorList tensors,
                             c10::ArrayRef<c10::Scalar> scalars,
                             std::optional<at::TensorList> scalarTensors) {
  RegisteredFusion registered = registeredFusion("launch_fusion_", handle);
  std::vector<Tensor> inputs = mergedInputs(registered, written, tensors);
  checkLaunch(registered, inputs, scalars, scalarTensors,
              outputSlots(registered, inputs, out));
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

bool hasFloatOutput(const Fusion &fusion) {
  return llvm::any_of(fusion.outputs(), [](const PortInfo &port) {
    return at::isFloatingType(tilefuse::torch_ops::scalarType(port.dtype));
  });
}

std::vector<Tensor>
launchFusionAutograd(int64_t handle, at::TensorList tensors,
                     c10::ArrayRef<c10::Scalar> scalars,
                     std::optional<at::TensorList> scalarTensors) {
  static auto op = findOp<std::vector<Tensor>(
      int64_t, at::TensorList, c10::ArrayRef<c10::Scalar>,
      std::optional<at::TensorList>)>("tilefuse::launch_fusion");
  Fusion &fusion = registeredFusion("launch_fusion", handle).fusion;
  bool graph = needsGraph("launch_fusion", tensors) && hasFloatOutput(fusion);
  if (!graph) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(handle, tensors, scalars, scalarTensors);
  }
  TORCH_CHECK_VALUE(!scalarTensors || scalarTensors->empty(), "tilefuse.",
                    fusion.name(),
                    ": a differentiated call takes its scalars as numbers");
  return FusionFunction::apply(handle, tensors, scalars);
}

using LaunchInPlaceOp = void(int64_t, at::TensorList, at::TensorList,
                             at::TensorList, c10::ArrayRef<c10::Scalar>,
                             std::optional<at::TensorList>);

/// Tensors written: a new version, as torch's in-place ops.
void launchFusionInPlaceVersioned(int64_t handle, at::TensorList written,
                                  at::TensorList out, at::TensorList tensors,
                                  c10::ArrayRef<c10::Scalar> scalars,
                                  std::optional<at::TensorList> scalarTensors) {
  static auto op = findOp<LaunchInPlaceOp>("tilefuse::launch_fusion_");
  {
    at::AutoDispatchBelowADInplaceOrView below;
    op.call(handle, written, out, tensors, scalars, scalarTensors);
  }
  for (at::TensorList list : {written, out})
    for (const Tensor &tensor : list)
      torch::autograd::increment_version(tensor);
}

/// A fusion writing in place is not differentiable: it overwrites what a
/// graph would need (as torch refuses in-place ops on leaves that need a
/// gradient).
void launchFusionInPlaceAutograd(int64_t handle, at::TensorList written,
                                 at::TensorList out, at::TensorList tensors,
                                 c10::ArrayRef<c10::Scalar> scalars,
                                 std::optional<at::TensorList> scalarTensors) {
  static auto op = findOp<LaunchInPlaceOp>("tilefuse::launch_fusion_");
  Fusion &fusion = registeredFusion("launch_fusion_", handle).fusion;
  TORCH_CHECK(!(needsGraph("launch_fusion_", written, out, tensors) &&
                hasFloatOutput(fusion)),
              "tilefuse.", fusion.name(),
              ": writes in place and is not differentiable; call it under "
              "torch.no_grad() or on tensors that do not require grad");
  at::AutoDispatchBelowAutograd below;
  op.call(handle, written, out, tensors, scalars, scalarTensors);
}

/// A fusion written as fuse IR text (Fusion::ir(), test/lit/fusions), for
/// processes without the Python extension: the self-contained library on a
/// machine that has only PyTorch. Returns a handle for launch_fusion; the
/// same text and storage dtype give the same handle, so a traced graph that
/// holds the handle its tracing got runs what eager calls run.
int64_t registerFusion(c10::string_view ir, c10::string_view storage) {
  std::string name(storage.data(), storage.size());
  bool isStorage = llvm::is_contained({"f32", "f16", "bf16", "f64"}, name);
  TORCH_CHECK_TYPE(isStorage,
                   "tilefuse.register_fusion: storage dtype must be f32, f16, "
                   "bf16 or f64, got ",
                   name);
  static std::mutex mutex;
  static auto *handles =
      new std::map<std::pair<std::string, std::string>, int64_t>();
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(std::string(ir.data(), ir.size()), name);
  if (auto known = handles->find(key); known != handles->end())
    return known->second;
  auto fusion = tilefuse::Fusion::parse(key.first);
  TORCH_CHECK_VALUE(static_cast<bool>(fusion),
                    "tilefuse.register_fusion: argument 'ir': ",
                    llvm::toString(fusion.takeError()));
  int64_t handle = tilefuse::torch_ops::registerFusion(
      std::move(*fusion), tilefuse::torch_ops::scalarType(name));
  handles->emplace(std::move(key), handle);
  return handle;
}

} // namespace

TORCH_LIBRARY(tilefuse, m) {
  m.def("launch_fusion(int fusion, Tensor[] tensors, Scalar[] scalars, "
        "Tensor[]? scalar_tensors=None) -> Tensor[]");
  m.def("launch_fusion_(int fusion, Tensor(a!)[] written, Tensor(b!)[] out, "
        "Tensor[] tensors, Scalar[] scalars, Tensor[]? scalar_tensors=None) "
        "-> ()");
  m.def("launch_fusion_forward(int fusion, Tensor[] tensors, Scalar[] scalars) "
        "-> Tensor[]");
  m.def("launch_fusion_backward(int fusion, int wanted, Tensor[] gradients, "
        "Tensor[] tensors, Tensor?[] forward_outputs, Scalar[] scalars) -> "
        "Tensor[]");
  m.def("register_fusion(str ir, str storage) -> int", registerFusion);
  m.def("compile_count() -> int",
        [] { return tilefuse::Runtime::global().compileCount(); });
}

// One implementation serves both devices: TorchRunner picks the target.
#define TILEFUSE_DEVICE_KERNELS(key)                                           \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("launch_fusion", launchFusion);                                     \
    m.impl("launch_fusion_", launchFusionInPlace);                             \
    m.impl("launch_fusion_forward", launchFusionForward);                      \
    m.impl("launch_fusion_backward", launchFusionBackward);                    \
  }
TILEFUSE_DEVICE_KERNELS(CPU)
TILEFUSE_DEVICE_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("launch_fusion", launchFusionMeta);
  m.impl("launch_fusion_", launchFusionInPlaceMeta);
  m.impl("launch_fusion_forward", launchFusionForwardMeta);
  m.impl("launch_fusion_backward", launchFusionBackwardMeta);
}

TORCH_LIBRARY_IMPL(tilefuse, ADInplaceOrView, m) {
  m.impl("launch_fusion_", launchFusionInPlaceVersioned);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  m.impl("launch_fusion", launchFusionAutograd);
  m.impl("launch_fusion_", launchFusionInPlaceAutograd);
  // Backward kernels have no backward: differentiating them raises.
  for (const char *op : {"launch_fusion_forward", "launch_fusion_backward"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
