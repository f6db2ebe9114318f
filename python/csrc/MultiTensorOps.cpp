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

/// Runs fusion `handle` over the row sets the lists make: `updated` holds
/// the lists of the 'u' inputs, `tensors` those of the 'f' and 't' inputs,
/// each list's tensors in turn, in input order. Returns the tensors of the
/// outputs not written in place, output by output.
std::vector<Tensor> launchMultiTensor(int64_t handle, c10::string_view layout,
                                      at::TensorList updated,
                                      at::TensorList tensors,
                                      c10::ArrayRef<c10::Scalar> scalars,
                                      at::TensorList scalarTensors,
                                      const std::optional<Tensor> &skipIf) {
  auto registered = registeredFusion("launch_multi_tensor", handle);
  tilefuse::Fusion &fusion = registered.fusion;
  std::string op = fusion.name() + ".multi_tensor";
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
  std::vector<Tensor> flat;
  for (std::vector<Tensor> &output :
       runMultiTensor(op, fusion, inputs, registered.inplace, skipIf))
    flat.insert(flat.end(), output.begin(), output.end());
  return flat;
}

using LaunchMultiTensor = decltype(launchMultiTensor);

/// Written in place: new versions, as torch's in-place ops.
std::vector<Tensor> launchMultiTensorInPlace(
    int64_t handle, c10::string_view layout, at::TensorList updated,
    at::TensorList tensors, c10::ArrayRef<c10::Scalar> scalars,
    at::TensorList scalarTensors, const std::optional<Tensor> &skipIf) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tilefuse::launch_multi_tensor", "")
                       .typed<LaunchMultiTensor>();
  std::vector<Tensor> outputs;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    outputs = op.call(handle, layout, updated, tensors, scalars, scalarTensors,
                      skipIf);
  }
  for (const Tensor &tensor : updated)
    torch::autograd::increment_version(tensor);
  return outputs;
}

/// Not differentiable (an optimizer step runs under no_grad): tensors that
/// need a gradient are refused rather than updated behind autograd's back.
std::vector<Tensor> launchMultiTensorAutograd(
    int64_t handle, c10::string_view layout, at::TensorList updated,
    at::TensorList tensors, c10::ArrayRef<c10::Scalar> scalars,
    at::TensorList scalarTensors, const std::optional<Tensor> &skipIf) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tilefuse::launch_multi_tensor", "")
                       .typed<LaunchMultiTensor>();
  TORCH_CHECK(!torch::autograd::compute_requires_grad(updated, tensors),
              "tilefuse.",
              registeredFusion("launch_multi_tensor", handle).fusion.name(),
              ".multi_tensor is not differentiable; call it under "
              "torch.no_grad() or on tensors that do not require grad");
  at::AutoDispatchBelowAutograd below;
  return op.call(handle, layout, updated, tensors, scalars, scalarTensors,
                 skipIf);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(tilefuse, m) {
  m.def("launch_multi_tensor(int fusion, str layout, Tensor(a!)[] updated, "
        "Tensor[] tensors, Scalar[] scalars, Tensor[] scalar_tensors, "
        "Tensor? skip_if) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(tilefuse, CPU, m) {
  m.impl("launch_multi_tensor", launchMultiTensor);
}
TORCH_LIBRARY_IMPL(tilefuse, CUDA, m) {
  m.impl("launch_multi_tensor", launchMultiTensor);
}
TORCH_LIBRARY_IMPL(tilefuse, ADInplaceOrView, m) {
  m.impl("launch_multi_tensor", launchMultiTensorInPlace);
}
TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  m.impl("launch_multi_tensor", launchMultiTensorAutograd);
}
