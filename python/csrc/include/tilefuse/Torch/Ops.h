//===- Ops.h - the fused ops for C++ (LibTorch) callers ---------*- C++ -*-===//
//
// libtilefuse_torch registers the tilefuse:: ops with PyTorch's dispatcher;
// Python reaches them as torch.ops.tilefuse.* (through tilefuse._C, which
// links this library), C++ programs through these functions. They have the
// semantics of torch.nn.functional (autograd included) and compile on first
// use per dtype and row length, as from Python.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_TORCH_OPS_H
#define TILEFUSE_TORCH_OPS_H

#include <ATen/core/Tensor.h>

#include <optional>
#include <string_view>

namespace tilefuse::ops {

/// torch.nn.functional.rms_norm, with Gemma's `offset` (x * (offset +
/// weight)) and the casting modes "gemma" (the default: f32 throughout,
/// one rounding, as F.rms_norm), "llama" and "none".
at::Tensor rms_norm(const at::Tensor &input, at::IntArrayRef normalizedShape,
                    const std::optional<at::Tensor> &weight = std::nullopt,
                    std::optional<double> eps = std::nullopt,
                    double offset = 0.0,
                    std::string_view castingMode = "gemma");

at::Tensor layer_norm(const at::Tensor &input, at::IntArrayRef normalizedShape,
                      const std::optional<at::Tensor> &weight = std::nullopt,
                      const std::optional<at::Tensor> &bias = std::nullopt,
                      double eps = 1e-5);

/// silu(a) * b.
at::Tensor swiglu(const at::Tensor &a, const at::Tensor &b);

/// gelu(a, approximate) * b; approximate "none" or "tanh".
at::Tensor geglu(const at::Tensor &a, const at::Tensor &b,
                 std::string_view approximate = "none");

/// [N, C] logits and int64 class indices; reduction "none", "mean" or "sum".
at::Tensor cross_entropy(const at::Tensor &input, const at::Tensor &target,
                         int64_t ignoreIndex = -100,
                         std::string_view reduction = "mean",
                         double labelSmoothing = 0.0);

/// One torch.optim.AdamW step on `param` and its state, in place; amsgrad
/// when `maxExpAvgSq` is given. The state may be f32 for a bf16/f16 param.
void adamw_step_(const at::Tensor &param, const at::Tensor &grad,
                 const at::Tensor &expAvg, const at::Tensor &expAvgSq,
                 double lr, double beta1, double beta2, double eps,
                 double weightDecay, int64_t step,
                 const std::optional<at::Tensor> &maxExpAvgSq = std::nullopt,
                 bool maximize = false);

} // namespace tilefuse::ops

#endif // TILEFUSE_TORCH_OPS_H
