//===- CrossEntropy.h - the cross-entropy fusions ---------------*- C++ -*-===//
//
// One builder writes every cross-entropy kernel; a kernel is picked by the
// form of its targets (class indices or probabilities), whether class
// indices come with class weights, whether the logits are soft-capped, and
// what it computes: the forward pass, the backward pass
// from the forward's per-row statistics, or both in one pass (the loss and
// its gradient for an upstream gradient known in the forward, which is what
// the in-place option and the fused linear cross-entropy run).
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_KERNELS_CROSSENTROPY_H
#define TILEFUSE_KERNELS_CROSSENTROPY_H

#include "tilefuse/Compiler/Builder.h"

namespace tilefuse::kernels {

enum class CrossEntropyStage { Forward, Backward, ForwardGrad };

struct CrossEntropyKernel {
  bool probs;    // probability targets [rows, n] instead of class indices
  bool weighted; // class weights (probability targets always take them)
  bool capped;   // softcap * tanh(logits / softcap) before the softmax
  CrossEntropyStage stage;
};

void buildCrossEntropy(dsl::FusionBuilder &b, CrossEntropyKernel kernel);

/// buildCrossEntropy for the built-in table (a plain function per kernel).
template <bool Probs, bool Weighted, bool Capped, CrossEntropyStage Stage>
void crossEntropy(dsl::FusionBuilder &b) {
  buildCrossEntropy(b, {Probs, Weighted, Capped, Stage});
}

} // namespace tilefuse::kernels

#endif // TILEFUSE_KERNELS_CROSSENTROPY_H
