//===- Builtins.cpp - the built-in fusions, written in the DSL ------------===//

#include "tilefuse/Kernels/Builtins.h"
#include "CrossEntropy.h"
#include "tilefuse/Compiler/Builder.h"

#include "mlir/IR/Diagnostics.h"

#include <cmath>

using namespace tilefuse::dsl;
using mlir::FailureOr;
using mlir::ModuleOp;
using mlir::OwningOpRef;
using tilefuse::kernels::crossEntropy;
using Stage = tilefuse::kernels::CrossEntropyStage;

namespace {

// RMSNorm, x * rsqrt(mean(x^2) + eps) * (offset + weight), in the casting
// modes of the model families; `offset` is Gemma's (1 with zero-initialized
// weights).
enum class Casting {
  // Everything in the compute type, rounded once to the storage dtype at
  // the end: torch.nn.functional.rms_norm and HF GemmaRMSNorm.
  Gemma,
  // The normalized x is rounded to x's dtype before the weight multiplies
  // it: HF LlamaRMSNorm's `weight * hidden.to(input_dtype)`.
  Llama,
  // x's dtype throughout: each step rounded to it as an op on x's dtype
  // rounds it (x.pow(2), mean, + eps, rsqrt, x * rstd, offset + weight);
  // the mean still accumulates in the compute type, as PyTorch's does.
  None,
};

void rmsNormForward(FusionBuilder &b, Casting casting) {
  Value x = b.input("x", Kind::Full), weight = b.input("weight", Kind::Col);
  Value eps = b.input("eps", Kind::Scalar);
  Value offset = b.input("offset", Kind::Scalar);
  auto stored = [&](Value value) { return roundToStorageOf(value, x); };
  auto step = [&](Value value) {
    return casting == Casting::None ? stored(value) : value;
  };
  Value rstd = step(rsqrt(step(step(b.mean(step(x * x))) + eps)));
  Value xhat = x * rstd;
  if (casting != Casting::Gemma)
    xhat = stored(xhat);
  b.output("y", xhat * step(offset + weight));
  b.output("rstd", rstd);
}

/// From the saved rstd; with the "llama" and "none" castings the weight
/// multiplied xhat rounded to x's dtype, which dweight sums.
void rmsNormBackward(FusionBuilder &b, Casting casting) {
  Value dy = b.input("dy", Kind::Full), x = b.input("x", Kind::Full);
  Value weight = b.input("weight", Kind::Col), rstd = b.input("rstd", Kind::Row);
  Value offset = b.input("offset", Kind::Scalar);
  Value xhat = x * rstd, g = dy * (offset + weight);
  b.output("dx", (g - xhat * b.mean(g * xhat)) * rstd);
  b.output("dweight", b.columnSum(dy * (casting == Casting::Gemma
                                            ? xhat
                                            : roundToStorageOf(xhat, x))));
}

void rmsNormFwd(FusionBuilder &b) { rmsNormForward(b, Casting::Gemma); }
void rmsNormLlamaFwd(FusionBuilder &b) { rmsNormForward(b, Casting::Llama); }
void rmsNormNoneFwd(FusionBuilder &b) { rmsNormForward(b, Casting::None); }
void rmsNormBwd(FusionBuilder &b) { rmsNormBackward(b, Casting::Gemma); }
void rmsNormLlamaBwd(FusionBuilder &b) { rmsNormBackward(b, Casting::Llama); }

void layerNormFwd(FusionBuilder &b) {
  Value x = b.input("x", Kind::Full), weight = b.input("weight", Kind::Col);
  Value bias = b.input("bias", Kind::Col), eps = b.input("eps", Kind::Scalar);
  Value mean = b.mean(x);
  Value xc = x - mean;
  Value rstd = rsqrt(b.mean(xc * xc) + eps);
  b.output("y", xc * rstd * weight + bias);
  b.output("mean", mean);
  b.output("rstd", rstd);
}

/// From the saved mean and rstd. The saved mean of an f32 row is its mean
/// rounded to f32: of a row of mean 1e3 and spread 0.1 it is off by 3e-4
/// of the spread, which x - mean carries into every gradient. `recentered`
/// takes that error off, the row's mean of x - mean (exact where x is
/// within a factor of two of the mean, as in the rows where the error
/// shows), summed beside the other two means: no extra pass, but a third
/// row reduction, which costs 16-bit rows registers and occupancy where
/// the error is below their rounding (2^-16 of the spread in bf16):
///   xc = x - mean,  xhat = (xc - mean(xc)) * rstd,
///   mean(g * xhat) = (mean(g * xc) - mean(xc) * mean(g)) * rstd.
/// (Summing xc * rstd instead spilled 24 bytes at f32 n = 12288 on sm_80;
/// the sums of xc overflow only where the forward's variance has.)
void layerNormBackward(FusionBuilder &b, bool recentered) {
  Value dy = b.input("dy", Kind::Full), x = b.input("x", Kind::Full);
  Value weight = b.input("weight", Kind::Col);
  Value mean = b.input("mean", Kind::Row), rstd = b.input("rstd", Kind::Row);
  Value g = dy * weight, meanG = b.mean(g);
  Value xhat, meanGXhat;
  if (recentered) {
    Value xc = x - mean, meanError = b.mean(xc);
    xhat = (xc - meanError) * rstd;
    meanGXhat = (b.mean(g * xc) - meanError * meanG) * rstd;
  } else {
    xhat = (x - mean) * rstd;
    meanGXhat = b.mean(g * xhat);
  }
  b.output("dx", (g - meanG - xhat * meanGXhat) * rstd);
  b.output("dweight", b.columnSum(dy * xhat));
  b.output("dbias", b.columnSum(dy));
}

void layerNormBwd(FusionBuilder &b) { layerNormBackward(b, false); }
void layerNormRecenteredBwd(FusionBuilder &b) { layerNormBackward(b, true); }

void swigluFwd(FusionBuilder &b) {
  Value a = b.input("a", Kind::Full), gate = b.input("b", Kind::Full);
  b.output("c", silu(a) * gate);
}

void swigluBwd(FusionBuilder &b) {
  Value dc = b.input("dc", Kind::Full), a = b.input("a", Kind::Full);
  Value gate = b.input("b", Kind::Full);
  Value s = sigmoid(a);
  b.output("da", dc * gate * (s * (a * (1.0 - s) + 1.0)));
  b.output("db", dc * (a * s));
}

// GeGLU: gelu(a) * b, with gelu's exact (erf) or tanh form, and the
// derivative of each as PyTorch's gelu_backward writes it.

void gegluFwd(FusionBuilder &b) {
  Value a = b.input("a", Kind::Full), gate = b.input("b", Kind::Full);
  b.output("c", gelu(a) * gate);
}

void gegluBwd(FusionBuilder &b) {
  Value dc = b.input("dc", Kind::Full), a = b.input("a", Kind::Full);
  Value gate = b.input("b", Kind::Full);
  Value cdf = 0.5 * (1.0 + erf(a * M_SQRT1_2));
  Value pdf = exp(-0.5 * (a * a)) * (M_2_SQRTPI * M_SQRT1_2 * 0.5);
  b.output("da", dc * gate * (cdf + a * pdf));
  b.output("db", dc * (a * cdf));
}

// gelu's tanh form without the cancellation of 1 + tanh(u) where tanh
// saturates (a large negative a multiplies it):
//   gelu(a) = 0.5 a (1 + tanh(u)) = a * sigmoid(2u),
//   u = sqrt(2/pi) (a + 0.044715 a^3).
const double kGeluBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kGeluKappa = 0.044715;

Value geluTanhInner(Value a, Value square) {
  return kGeluBeta * (a + kGeluKappa * (square * a));
}

void gegluTanhFwd(FusionBuilder &b) {
  Value a = b.input("a", Kind::Full), gate = b.input("b", Kind::Full);
  b.output("c", a * sigmoid(2.0 * geluTanhInner(a, a * a)) * gate);
}

/// gelu'(a) = 0.5 (1 + t) + 0.5 a (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 a^2),
/// t = tanh(u), as torch's gelu_backward, with 0.5 (1 + t) = sigmoid(2u) and
/// 1 - t^2 = sech^2(u) = 4 e / (1 + e)^2, e = exp(-2|u|), both accurate
/// where t saturates.
void gegluTanhBwd(FusionBuilder &b) {
  Value dc = b.input("dc", Kind::Full), a = b.input("a", Kind::Full);
  Value gate = b.input("b", Kind::Full);
  Value square = a * a, u = geluTanhInner(a, square);
  Value s = sigmoid(2.0 * u), e = exp(-2.0 * abs(u));
  Value onePlusE = 1.0 + e;
  Value sech2 = 4.0 * e / (onePlusE * onePlusE);
  Value slope = s + 0.5 * a * sech2 *
                        (kGeluBeta * (1.0 + 3.0 * kGeluKappa * square));
  b.output("da", dc * gate * slope);
  b.output("db", dc * (a * s));
}

/// One step of torch.optim.AdamW (foreach=False, decoupled weight decay),
/// operation for operation, so that f32 state matches it bit for bit: the
/// host computes the step's scalars in f64 (as Python does), the kernel
/// rounds each in-place update to the storage dtype of the tensor it writes
/// (bf16 state, or f32 state of bf16 parameters), and lerp and addcmul use
/// an FMA as PyTorch's kernels do. With `amsgrad`, the denominator uses the
/// running maximum of exp_avg_sq.
void adamwStepWith(FusionBuilder &b, bool amsgrad) {
  Value param = b.input("param", Kind::Full), grad = b.input("grad", Kind::Full);
  Value expAvg = b.input("exp_avg", Kind::Full);
  Value expAvgSq = b.input("exp_avg_sq", Kind::Full);
  Value maxExpAvgSq = amsgrad ? b.input("max_exp_avg_sq", Kind::Full) : Value();
  // -1 with maximize, else 1.
  Value gradSign = b.input("grad_sign", Kind::Scalar);
  // 1 - lr * weight_decay.
  Value decay = b.input("decay", Kind::Scalar);
  // 1 - beta1, exp_avg's lerp weight.
  Value lerpWeight = b.input("lerp_weight", Kind::Scalar);
  Value beta2 = b.input("beta2", Kind::Scalar);
  Value oneMinusBeta2 = b.input("one_minus_beta2", Kind::Scalar);
  Value biasCorrection2Sqrt = b.input("bias_correction2_sqrt", Kind::Scalar);
  Value eps = b.input("eps", Kind::Scalar);
  // -lr / (1 - beta1^step).
  Value negStepSize = b.input("neg_step_size", Kind::Scalar);

  Value g = grad * gradSign;
  Value p = roundToStorageOf(param * decay, param);
  // exp_avg.lerp_(g, w): w * (g - m) + m for |w| < 0.5, else
  // (w - 1) * (g - m) + g, one FMA.
  Value small = abs(lerpWeight) < b.constant(0.5);
  Value m = roundToStorageOf(fma(where(small, lerpWeight, lerpWeight - 1.0),
                                 g - expAvg, where(small, expAvg, g)),
                             expAvg);
  // exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2).
  Value v = roundToStorageOf(
      fma(oneMinusBeta2 * g, g, roundToStorageOf(expAvgSq * beta2, expAvgSq)),
      expAvgSq);
  Value second = amsgrad ? maximum(maxExpAvgSq, v) : v;
  auto stored = [&](Value value) {
    return roundToStorageOf(value, amsgrad ? maxExpAvgSq : expAvgSq);
  };
  // (second.sqrt() / bias_correction2_sqrt).add_(eps), a tensor of its dtype.
  Value denom = stored(stored(stored(sqrt(second)) / biasCorrection2Sqrt) + eps);
  // param.addcdiv_(m, denom, value=-step_size).
  b.output("param_out", p + negStepSize * m / denom);
  b.output("exp_avg_out", m);
  b.output("exp_avg_sq_out", v);
  if (amsgrad)
    b.output("max_exp_avg_sq_out", second);
}

void adamwStep(FusionBuilder &b) { adamwStepWith(b, /*amsgrad=*/false); }
void adamwAmsgradStep(FusionBuilder &b) { adamwStepWith(b, /*amsgrad=*/true); }

struct Builtin {
  llvm::StringRef name;
  void (*build)(FusionBuilder &);
};

constexpr Builtin kBuiltins[] = {
    {"rms_norm_fwd", rmsNormFwd},           {"rms_norm_bwd", rmsNormBwd},
    {"rms_norm_llama_fwd", rmsNormLlamaFwd}, {"rms_norm_llama_bwd", rmsNormLlamaBwd},
    {"rms_norm_none_fwd", rmsNormNoneFwd},
    {"layer_norm_fwd", layerNormFwd},       {"layer_norm_bwd", layerNormBwd},
    {"layer_norm_bwd_recentered", layerNormRecenteredBwd},
    {"swiglu_fwd", swigluFwd},              {"swiglu_bwd", swigluBwd},
    {"geglu_fwd", gegluFwd},                {"geglu_bwd", gegluBwd},
    {"geglu_tanh_fwd", gegluTanhFwd},       {"geglu_tanh_bwd", gegluTanhBwd},
    {"adamw_step", adamwStep},              {"adamw_amsgrad_step", adamwAmsgradStep},
    // Cross-entropy (CrossEntropy.cpp): class indices (without or with
    // class weights) or probabilities, plain or soft-capped logits;
    // forward, backward, or both.
    {"cross_entropy_fwd",
     crossEntropy<false, false, false, Stage::Forward>},
    {"cross_entropy_bwd",
     crossEntropy<false, false, false, Stage::Backward>},
    {"cross_entropy_fwd_grad",
     crossEntropy<false, false, false, Stage::ForwardGrad>},
    {"cross_entropy_capped_fwd",
     crossEntropy<false, false, true, Stage::Forward>},
    {"cross_entropy_capped_bwd",
     crossEntropy<false, false, true, Stage::Backward>},
    {"cross_entropy_capped_fwd_grad",
     crossEntropy<false, false, true, Stage::ForwardGrad>},
    {"cross_entropy_weighted_fwd",
     crossEntropy<false, true, false, Stage::Forward>},
    {"cross_entropy_weighted_bwd",
     crossEntropy<false, true, false, Stage::Backward>},
    {"cross_entropy_weighted_fwd_grad",
     crossEntropy<false, true, false, Stage::ForwardGrad>},
    {"cross_entropy_weighted_capped_fwd",
     crossEntropy<false, true, true, Stage::Forward>},
    {"cross_entropy_weighted_capped_bwd",
     crossEntropy<false, true, true, Stage::Backward>},
    {"cross_entropy_weighted_capped_fwd_grad",
     crossEntropy<false, true, true, Stage::ForwardGrad>},
    {"cross_entropy_probs_fwd",
     crossEntropy<true, true, false, Stage::Forward>},
    {"cross_entropy_probs_bwd",
     crossEntropy<true, true, false, Stage::Backward>},
    {"cross_entropy_probs_fwd_grad",
     crossEntropy<true, true, false, Stage::ForwardGrad>},
    {"cross_entropy_probs_capped_fwd",
     crossEntropy<true, true, true, Stage::Forward>},
    {"cross_entropy_probs_capped_bwd",
     crossEntropy<true, true, true, Stage::Backward>},
    {"cross_entropy_probs_capped_fwd_grad",
     crossEntropy<true, true, true, Stage::ForwardGrad>},
};

} // namespace

llvm::ArrayRef<llvm::StringRef> tilefuse::kernels::builtinNames() {
  static const llvm::SmallVector<llvm::StringRef> names = [] {
    llvm::SmallVector<llvm::StringRef> result;
    for (const Builtin &builtin : kBuiltins)
      result.push_back(builtin.name);
    return result;
  }();
  return names;
}

FailureOr<OwningOpRef<ModuleOp>>
tilefuse::kernels::buildBuiltin(mlir::MLIRContext &context,
                                llvm::StringRef name, DType compute) {
  for (const Builtin &builtin : kBuiltins) {
    if (builtin.name != name)
      continue;
    FusionBuilder builder(context, name, compute);
    builtin.build(builder);
    return builder.finish();
  }
  return mlir::emitError(mlir::UnknownLoc::get(&context), "unknown built-in fusion '")
         << name << "'";
}

llvm::Expected<std::shared_ptr<tilefuse::Fusion>>
tilefuse::kernels::builtinFusion(llvm::StringRef name, DType compute) {
  static std::mutex mutex;
  static llvm::StringMap<std::shared_ptr<tilefuse::Fusion>> *built =
      new llvm::StringMap<std::shared_ptr<tilefuse::Fusion>>();
  std::string key = (name + (compute == DType::F64 ? ":f64" : ":f32")).str();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = built->find(key); it != built->end())
    return it->second;
  mlir::MLIRContext &context = Runtime::global().context();
  std::string messages;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    messages += (messages.empty() ? "" : "\n") + d.str();
    return mlir::success();
  });
  auto module = buildBuiltin(context, name, compute);
  if (mlir::failed(module))
    return llvm::createStringError(messages);
  return built->try_emplace(key, std::make_shared<tilefuse::Fusion>(std::move(*module)))
      .first->second;
}
