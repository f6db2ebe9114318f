//===- MultiTensorOps.cpp - launch_multi_tensor as a tilefuse:: op --------===//
//
// tilefuse::launch_multi_tensor runs a fusion the DSL traced over lists of
// tensors (TorchRunner's runMultiTensor; KernelABI.h's multi-tensor
// kernels): the tensors it writes in place are its mutable argument, so
// the dispatcher, autograd's version counters and torch.compile know.
//
//===----------------------------------------------------------------------===//

#include "TorchRunner.h"

#include "tilefuse/Runtime/Fusion.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

using at::Tensor;
using namespace tilefuse::torch_ops;

namespace {

using Kind = MultiTensorInput::Kind;

/// The input kind of a layout character: 'u' a list of tensors written in
/// place, 'f' a list of tensors, 'v' a number, 'p' a one-element tensor,
/// 't' a list of one-element tensors.
std::optional<Kind> kindOf(char code) {
  switch (code) {
  case 'u':
  case 'f': return Kind::Tensors;
  case 'v': return Kind::Value;
  case 'p': return Kind::Pointer;
  case 't': return Kind::PerTensor;
  default: return std::nullopt;
  }
}

/// The inputs `layout` describes (one code per fusion input): `updated`
/// holds the lists of the 'u' inputs, `tensors` those of the 'f' and 't'
/// inputs, each list's tensors in turn, in input order.
std::vector<MultiTensorInput> multiTensorInputs(
    const std::string &op, const RegisteredFusion &registered,
    c10::string_view layout, at::TensorList updated, at::TensorList tensors,
    c10::ArrayRef<c10::Scalar> scalars, at::TensorList scalarTensors) {
  tilefuse::Fusion &fusion = registered.fusion;
  size_t ports = fusion.inputs().size();
  TORCH_CHECK_VALUE(layout.size() == ports, "tilefuse.", op, ": layout '",
                    layout, "' must have one code per input (", ports, ")");
  size_t lists = 0, updatedLists = 0;
  for (char code : layout) {
    TORCH_CHECK_VALUE(kindOf(code), "tilefuse.", op,
                      ": unknown layout code '", code, "'");
    lists += code == 'u' || code == 'f' || code == 't';
    updatedLists += code == 'u';
  }
  for (auto [output, input] : registered.inplace)
    TORCH_CHECK_VALUE(layout[input] == 'u', "tilefuse.", op, ": input ",
                      input, " is written in place and must be in 'updated'");
  TORCH_CHECK_VALUE(updatedLists == registered.inplace.size(), "tilefuse.",
                    op, ": ", updatedLists,
                    " lists are marked as updated, the fusion updates ",
                    registered.inplace.size());
  size_t total = updated.size() + tensors.size();
  TORCH_CHECK_VALUE(lists > 0 && total % lists == 0 &&
                        updated.size() % std::max<size_t>(updatedLists, 1) ==
                            0,
                    "tilefuse.", op, ": ", total,
                    " tensors do not make ", lists, " lists of one length");
  size_t count = total / lists;
  std::vector<MultiTensorInput> inputs;
  const Tensor *nextUpdated = updated.begin(), *nextTensor = tensors.begin();
  const c10::Scalar *nextScalar = scalars.begin();
  const Tensor *nextScalarTensor = scalarTensors.begin();
  for (char code : layout) {
    MultiTensorInput input{*kindOf(code), {}, {}};
    if (code == 'u') {
      input.tensors = at::TensorList(nextUpdated, count);
      nextUpdated += count;
    } else if (code == 'f' || code == 't') {
      input.tensors = at::TensorList(nextTensor, count);
      nextTensor += count;
    } else if (code == 'v') {
      TORCH_CHECK_VALUE(nextScalar < scalars.end(), "tilefuse.", op,
                        ": too few scalars");
      input.value = *nextScalar++;
    } else {
      TORCH_CHECK_VALUE(nextScalarTensor < scalarTensors.end(), "tilefuse.",
                        op, ": too few scalar tensors");
      input.tensors = at::TensorList(nextScalarTensor++, 1);
    }
    inputs.push_back(input);
  }
  TORCH_CHECK_VALUE(nextScalar == scalars.end() &&
                        nextScalarTensor == scalarTensors.end(),
                    "tilefuse.", op, ": too many scalars");
  return inputs;
}

/// Runs fusion `handle` over the row sets the lists make
/// (multiTensorInputs), writing the outputs not written in place into
/// `out` (their lists in turn, output by output).
void launchMultiTensor(int64_t handle, c10::string_view layout,
                       at::TensorList updated, at::TensorList out,
                       at::TensorList tensors,
                       c10::ArrayRef<c10::Scalar> scalars,
                       at::TensorList scalarTensors,
                       const std::optional<Tensor> &skipIf) {
  auto registered = registeredFusion("launch_multi_tensor", handle);
  std::string op = registered.fusion.name() + ".multi_tensor";
  std::vector<MultiTensorInput> inputs = multiTensorInputs(
      op, registered, layout, updated, tensors, scalars, scalarTensors);
  size_t outputs =
      registered.fusion.outputs().size() - registered.inplace.size();
  size_t count = 0;
  for (const MultiTensorInput &input : inputs)
    if (input.kind == Kind::Tensors)
      count = input.tensors.size();
  TORCH_CHECK_VALUE(out.size() == outputs * count, "tilefuse.", op,
                    ": expected ", outputs * count, " output tensors, got ",
                    out.size());
  std::vector<at::TensorList> lists;
  for (size_t o = 0; o < outputs; ++o)
    lists.push_back(out.slice(o * count, count));
  runMultiTensor(op, registered.fusion, inputs, registered.inplace, skipIf,
                 lists);
}

using LaunchMultiTensor = decltype(launchMultiTensor);

const c10::TypedOperatorHandle<LaunchMultiTensor> &launchMultiTensorOp() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tilefuse::launch_multi_tensor", "")
                       .typed<LaunchMultiTensor>();
  return op;
}

/// torch.compile traces with metadata alone: the arguments are checked,
/// nothing is written.
void launchMultiTensorMeta(int64_t handle, c10::string_view layout,
                           at::TensorList updated, at::TensorList,
                           at::TensorList tensors,
                           c10::ArrayRef<c10::Scalar> scalars,
                           at::TensorList scalarTensors,
                           const std::optional<Tensor> &) {
  auto registered = registeredFusion("launch_multi_tensor", handle);
  multiTensorInputs(registered.fusion.name() + ".multi_tensor", registered,
                    layout, updated, tensors, scalars, scalarTensors);
}

/// Written in place: new versions, as torch's in-place ops.
void launchMultiTensorInPlace(int64_t handle, c10::string_view layout,
                              at::TensorList updated, at::TensorList out,
                              at::TensorList tensors,
                              c10::ArrayRef<c10::Scalar> scalars,
                              at::TensorList scalarTensors,
                              const std::optional<Tensor> &skipIf) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    launchMultiTensorOp().call(handle, layout, updated, out, tensors, scalars,
                               scalarTensors, skipIf);
  }
  for (at::TensorList written : {updated, out})
    for (const Tensor &tensor : written)
      torch::autograd::increment_version(tensor);
}

/// Not differentiable (an optimizer step runs under no_grad): tensors that
/// need a gradient are refused rather than updated behind autograd's back.
void launchMultiTensorAutograd(int64_t handle, c10::string_view layout,
                               at::TensorList updated, at::TensorList out,
                               at::TensorList tensors,
                               c10::ArrayRef<c10::Scalar> scalars,
                               at::TensorList scalarTensors,
                               const std::optional<Tensor> &skipIf) {
  TORCH_CHECK(!torch::autograd::compute_requires_grad(updated, tensors),
              "tilefuse.",
              registeredFusion("launch_multi_tensor", handle).fusion.name(),
              ".multi_tensor is not differentiable; call it under "
              "torch.no_grad() or on tensors that do not require grad");
  at::AutoDispatchBelowAutograd below;
  launchMultiTensorOp().call(handle, layout, updated, out, tensors, scalars,
                             scalarTensors, skipIf);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(tilefuse, m) {
  m.def("launch_multi_tensor(int fusion, str layout, Tensor(a!)[] updated, "
        "Tensor(b!)[] out, Tensor[] tensors, Scalar[] scalars, "
        "Tensor[] scalar_tensors, Tensor? skip_if) -> ()");
}

TORCH_LIBRARY_IMPL(tilefuse, CPU, m) {
  m.impl("launch_multi_tensor", launchMultiTensor);
}
TORCH_LIBRARY_IMPL(tilefuse, CUDA, m) {
  m.impl("launch_multi_tensor", launchMultiTensor);
}
TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("launch_multi_tensor", launchMultiTensorMeta);
}
TORCH_LIBRARY_IMPL(tilefuse, ADInplaceOrView, m) {
  m.impl("launch_multi_tensor", launchMultiTensorInPlace);
}
TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  m.impl("launch_multi_tensor", launchMultiTensorAutograd);
}
