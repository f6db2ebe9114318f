//===- Builtins.cpp - the built-in fusions, written in the DSL ------------===//

#include "tilefuse/Kernels/Builtins.h"
#include "CrossEntropy.h"
#include "tilefuse/Compiler/Builder.h"

#include "mlir/IR/Diagnostics.h"

using namespace tilefuse::dsl;
using mlir::FailureOr;
using mlir::ModuleOp;
using mlir::OwningOpRef;
using tilefuse::kernels::crossEntropy;
using Stage = tilefuse::kernels::CrossEntropyStage;

namespace {

void rmsNormFwd(FusionBuilder &b) {
  Value x = b.input("x", Kind::Full), weight = b.input("weight", Kind::Col);
  Value eps = b.input("eps", Kind::Scalar);
  Value rstd = rsqrt(b.mean(x * x) + eps);
  b.output("y", x * rstd * weight);
  b.output("rstd", rstd);
}

void rmsNormBwd(FusionBuilder &b) {
  Value dy = b.input("dy", Kind::Full), x = b.input("x", Kind::Full);
  Value weight = b.input("weight", Kind::Col), rstd = b.input("rstd", Kind::Row);
  Value xhat = x * rstd, g = dy * weight;
  b.output("dx", (g - xhat * b.mean(g * xhat)) * rstd);
  b.output("dweight", b.columnSum(dy * xhat));
}

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

void layerNormBwd(FusionBuilder &b) {
  Value dy = b.input("dy", Kind::Full), x = b.input("x", Kind::Full);
  Value weight = b.input("weight", Kind::Col);
  Value mean = b.input("mean", Kind::Row), rstd = b.input("rstd", Kind::Row);
  Value xhat = (x - mean) * rstd, g = dy * weight;
  b.output("dx", (g - b.mean(g) - xhat * b.mean(g * xhat)) * rstd);
  b.output("dweight", b.columnSum(dy * xhat));
  b.output("dbias", b.columnSum(dy));
}

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

void adamwStep(FusionBuilder &b) {
  Value param = b.input("param", Kind::Full), grad = b.input("grad", Kind::Full);
  Value expAvg = b.input("exp_avg", Kind::Full);
  Value expAvgSq = b.input("exp_avg_sq", Kind::Full);
  Value lr = b.input("lr", Kind::Scalar), beta1 = b.input("beta1", Kind::Scalar);
  Value beta2 = b.input("beta2", Kind::Scalar), eps = b.input("eps", Kind::Scalar);
  Value weightDecay = b.input("weight_decay", Kind::Scalar);
  Value step = b.input("step", Kind::Scalar);
  Value m = beta1 * expAvg + (1.0 - beta1) * grad;
  Value v = beta2 * expAvgSq + (1.0 - beta2) * (grad * grad);
  Value stepSize = lr / (1.0 - pow(beta1, step));
  Value denom = sqrt(v) / sqrt(1.0 - pow(beta2, step)) + eps;
  b.output("param_out", param * (1.0 - lr * weightDecay) - stepSize * (m / denom));
  b.output("exp_avg_out", m);
  b.output("exp_avg_sq_out", v);
}

struct Builtin {
  llvm::StringRef name;
  void (*build)(FusionBuilder &);
};

constexpr Builtin kBuiltins[] = {
    {"rms_norm_fwd", rmsNormFwd},           {"rms_norm_bwd", rmsNormBwd},
    {"layer_norm_fwd", layerNormFwd},       {"layer_norm_bwd", layerNormBwd},
    {"swiglu_fwd", swigluFwd},              {"swiglu_bwd", swigluBwd},
    {"adamw_step", adamwStep},
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
