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
// DSL fusions
//===----------------------------------------------------------------------===//

/// Runs a fusion the DSL traced; its first full input gives the shape.
std::vector<Tensor> launchFusion(int64_t handle, at::TensorList tensors,
                                 c10::ArrayRef<c10::Scalar> scalars) {
  auto [fusion, storage] =
      tilefuse::torch_ops::registeredFusion("launch_fusion", handle);
  const Tensor *full = tensors.begin();
  for (const tilefuse::PortInfo &port : fusion.inputs()) {
    if (port.kind == tilefuse::PortInfo::Kind::Full)
      break;
    if (port.kind != tilefuse::PortInfo::Kind::Scalar)
      ++full;
  }
  TORCH_CHECK_VALUE(full < tensors.end(), "tilefuse.", fusion.name(),
                    ": expected a full [..., n] tensor input");
  return runFusion(fusion.name(), fusion, tensors, scalars, storage,
                   full->sizes());
}

/// DSL fusions have no backward yet: outputs of inputs that need a gradient
/// get a grad_fn that raises when differentiated.
std::vector<Tensor> launchFusionAutograd(int64_t handle, at::TensorList tensors,
                                         c10::ArrayRef<c10::Scalar> scalars) {
  static auto op = findOp<std::vector<Tensor>(int64_t, at::TensorList,
                                              c10::ArrayRef<c10::Scalar>)>(
      "tilefuse::launch_fusion");
  std::vector<Tensor> outputs;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    outputs = op.call(handle, tensors, scalars);
  }
  bool dual = llvm::any_of(tensors, [](const Tensor &tensor) {
    return tensor._fw_grad(/*level=*/0).defined();
  });
  TORCH_CHECK_NOT_IMPLEMENTED(!dual, "tilefuse.launch_fusion: forward-mode AD "
                                     "is not supported");
  if (torch::autograd::compute_requires_grad(tensors)) {
    auto node = std::make_shared<torch::autograd::NotImplemented>(
        "tilefuse::launch_fusion (" +
        tilefuse::torch_ops::registeredFusion("launch_fusion", handle)
            .fusion.name() +
        ")");
    node->set_next_edges(torch::autograd::collect_next_edges(tensors));
    for (Tensor &output : outputs)
      if (at::isFloatingType(output.scalar_type()))
        torch::autograd::set_history(output, node);
  }
  return outputs;
}

/// A fusion written as fuse IR text (Fusion::ir(), test/lit/fusions), for
/// processes without the Python extension: the self-contained library on a
/// machine that has only PyTorch. Returns a handle for launch_fusion.
int64_t registerFusion(c10::string_view ir, c10::string_view storage) {
  auto fusion = tilefuse::Fusion::parse(llvm::StringRef(ir.data(), ir.size()));
  TORCH_CHECK_VALUE(static_cast<bool>(fusion),
                    "tilefuse.register_fusion: argument 'ir': ",
                    llvm::toString(fusion.takeError()));
  return tilefuse::torch_ops::registerFusion(
      std::move(*fusion), std::string_view(storage.data(), storage.size()));
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
  m.def("launch_fusion(int fusion, Tensor[] tensors, Scalar[] scalars) -> "
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
  }
TILEFUSE_DEVICE_KERNELS(CPU)
TILEFUSE_DEVICE_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("cross_entropy_fwd", crossEntropyFwdMeta);
  m.impl("cross_entropy_bwd", crossEntropyBwdMeta);
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
  m.impl("cross_entropy_bwd",
         torch::autograd::autogradNotImplementedFallback());
}
