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

/// torch.nn.functional.cross_entropy: logits [N, C], [C], [N, C, d1, ...]
/// or [..., V] with int64 class indices [N], [], [N, d1, ...] or [...];
/// reduction "none", "mean" or "sum".
at::Tensor cross_entropy(const at::Tensor &input, const at::Tensor &target,
                         int64_t ignoreIndex = -100,
                         std::string_view reduction = "mean",
                         double labelSmoothing = 0.0);

/// The options of cross_entropy_with_z_loss and linear_cross_entropy
/// (tilefuse.functional documents them).
struct CrossEntropyOptions {
  std::optional<at::Tensor> weight; // class weights [C]
  int64_t ignoreIndex = -100;
  std::string_view reduction = "mean";
  double labelSmoothing = 0.0;
  double lseSquareScale = 0.0;   // the z-loss: lse_square_scale * lse^2
  std::optional<double> softcap; // softcap * tanh(logits / softcap)
  /// Writes the gradient over the logits in the forward (cross_entropy
  /// only): legal when nothing reads the logits afterwards.
  bool inplaceBackward = false;
};

/// cross_entropy with every option (class-index or probability targets);
/// returns (loss, z-loss), the loss including the z-loss.
std::tuple<at::Tensor, at::Tensor>
cross_entropy_with_z_loss(const at::Tensor &input, const at::Tensor &target,
                          const CrossEntropyOptions &options = {});

/// The cross-entropy of input @ weight.T (+ bias) without the [tokens,
/// vocab] logits: tokens in chunks whose logits take at most `chunkBytes`
/// (default 256 MiB); `options.weight` are class weights. Returns (loss,
/// z-loss).
std::tuple<at::Tensor, at::Tensor>
linear_cross_entropy(const at::Tensor &input, const at::Tensor &weight,
                     const at::Tensor &target,
                     const std::optional<at::Tensor> &bias = std::nullopt,
                     const CrossEntropyOptions &options = {},
                     std::optional<int64_t> chunkBytes = std::nullopt);

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
