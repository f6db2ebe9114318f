//===- CrossEntropy.cpp - the cross-entropy fusions -----------------------===//
//
// Per row, with z the logits (soft-capped: z = softcap * tanh(x / softcap)),
// class weights w (1 in the kernels without them), label smoothing eps over n
// classes and the target distribution q (hard: (1 - eps) * onehot(target) + eps
// / n; probabilities P: (1 - eps) * P + eps / n), the loss is torch's
//   -sum_c w_c q_c log_softmax(z)_c
// computed as torch composes it: for class indices, (1 - eps) times the
// weighted NLL plus, only when eps != 0, eps / n times -sum_c w_c
// log_softmax(z)_c (so a -inf logit gives inf there, and nothing when eps is
// 0); rows whose target is ignore_index give 0. The z-loss is
// lse_square_scale * lse^2 (0 on ignored rows). With mass = sum_c w_c q_c,
//   dloss/dz_c = dloss * (mass * softmax(z)_c - w_c q_c)
//              + dz_loss * 2 * lse_square_scale * lse * softmax(z)_c
// and soft-capping multiplies it by 1 - tanh(x / softcap)^2. The forward
// saves each row's max and log_sum = log(sum(exp(z - max))) for the
// backward, which takes softmax(z) as exp(z - max) / exp(log_sum), as the
// forward with gradient takes exp((z - max) - log_sum): lse = max + log_sum
// rounds to the max in rows of huge logits (to 1e-3 near 1e4 in float32),
// and exp(z - lse) with it.
//
//===----------------------------------------------------------------------===//

#include "CrossEntropy.h"

using namespace tilefuse::dsl;
using tilefuse::kernels::CrossEntropyKernel;
using Stage = tilefuse::kernels::CrossEntropyStage;

void tilefuse::kernels::buildCrossEntropy(FusionBuilder &b,
                                          CrossEntropyKernel kernel) {
  bool hard = !kernel.probs;
  // Without class weights (class indices only) w is 1: no weight inputs,
  // and mass is 1 (0 on ignored rows, which the gradient masks anyway).
  bool weighted = kernel.probs || kernel.weighted;
  Value logits = b.input("logits", Kind::Full);
  Value target = hard ? b.input("target", Kind::Row, DType::I64)
                      : b.input("target", Kind::Full);
  Value weight = weighted ? b.input("weight", Kind::Col) : Value();
  // The class weight of each row's target (0 where ignored), from the host.
  Value targetWeight =
      hard && weighted ? b.input("target_weight", Kind::Row) : Value();
  Value max, logSum, mass, dloss, dzLoss;
  if (kernel.stage == Stage::Backward) {
    max = b.input("max", Kind::Row);
    logSum = b.input("log_sum", Kind::Row);
    if (weighted)
      mass = b.input("mass", Kind::Row);
  }
  if (kernel.stage != Stage::Forward) {
    dloss = b.input("dloss", Kind::Row);
    dzLoss = b.input("dz_loss", Kind::Row);
  }
  Value ignoreIndex =
      hard ? b.input("ignore_index", Kind::Scalar, DType::I64) : Value();
  Value smoothing = b.input("label_smoothing", Kind::Scalar);
  Value zScale = b.input("lse_square_scale", Kind::Scalar);
  Value softcap = kernel.capped ? b.input("softcap", Kind::Scalar) : Value();
  // x / softcap as x times 1 / softcap from the host: an IEEE division per
  // element is an SFU seed and eight refining instructions, and a kernel
  // parameter takes no register where a reciprocal computed in the kernel
  // does (ptxas spilled it in a kernel it held at 40 registers).
  Value capScale =
      kernel.capped ? b.input("softcap_reciprocal", Kind::Scalar) : Value();

  Value z = kernel.capped ? softcap * tanh(logits * capScale) : logits;
  Value keep = 1.0 - smoothing;
  Value uniform = smoothing / b.rowLength();
  Value valid = hard ? target != ignoreIndex : Value();
  Value zero = b.constant(0.0);
  // w_c q_c; for class indices only the gradient needs it whole.
  Value weightedTarget = hard ? Value() : weight * (keep * target + uniform);

  if (kernel.stage != Stage::Backward)
    max = b.max(z);
  Value shifted = z - max;
  if (kernel.stage != Stage::Backward)
    logSum = log(b.sum(exp(shifted)));
  Value lse = max + logSum;
  if (kernel.stage != Stage::Backward) {
    Value loss;
    if (hard) {
      // An ignored row gathers column 0: no index leaves [0, n).
      Value index = where(valid, target, b.constant(0, DType::I64));
      Value picked = b.gather(logits, index);
      if (kernel.capped)
        picked = softcap * tanh(picked * capScale);
      Value nll = logSum - (picked - max);
      // -sum_c w_c log_softmax(z)_c / n, its sums about the max as torch's
      // log_softmax takes them (sum(z) overflows in rows of huge logits);
      // fuse-merge-reductions computes them in the max's pass.
      Value smooth;
      if (weighted) {
        Value weightSum = b.sum(b.broadcastTo(weight, Kind::Full));
        smooth = (weightSum * logSum - b.sum(weight * shifted)) / b.rowLength();
        nll = targetWeight * nll;
        mass = keep * targetWeight + uniform * weightSum;
      } else {
        smooth = logSum - b.sum(shifted) / b.rowLength();
      }
      Value smoothed = where(smoothing != zero, smoothing * smooth, zero);
      loss = where(valid, keep * nll + smoothed, zero);
    } else {
      mass = b.sum(weightedTarget);
      loss = mass * logSum - b.sum(weightedTarget * shifted);
    }
    Value zLoss = zScale * lse * lse;
    b.output("loss", loss);
    b.output("z_loss", hard ? where(valid, zLoss, zero) : zLoss);
    if (kernel.stage == Stage::Forward) {
      b.output("max", max);
      b.output("log_sum", logSum);
      if (weighted)
        b.output("mass", mass);
      return;
    }
  }

  // softmax(z), in the backward without its 1 / exp(log_sum), which the
  // row's factor takes: one instruction less per element. The forward
  // with gradient keeps the subtraction: there exp(z - max) is the sum's
  // own, which a row kept on chip would hold in registers from the sum to
  // the gradient (traffic model: float32 rows up to 15 points faster, bf16
  // n = 1000 with class weights 89% -> 64%).
  Value p =
      kernel.stage == Stage::Backward ? exp(shifted) : exp(shifted - logSum);
  if (hard) {
    Value onehot = cast(b.iota() == target, b.computeType());
    weightedTarget = weighted ? keep * targetWeight * onehot + uniform * weight
                              : keep * onehot + uniform;
    dloss = where(valid, dloss, zero);
    dzLoss = where(valid, dzLoss, zero);
  }
  Value zTerm = 2.0 * zScale * dzLoss * lse;
  Value rowScale = weighted ? dloss * mass + zTerm : dloss + zTerm;
  if (kernel.stage == Stage::Backward)
    rowScale = exp(-logSum) * rowScale;
  Value grad = p * rowScale - dloss * weightedTarget;
  if (kernel.capped) {
    // tanh'(x / softcap) from z itself: one value per element stays live.
    Value capTanh = z * capScale;
    grad = grad * (1.0 - capTanh * capTanh);
  }
  b.output("dlogits", grad);
}
