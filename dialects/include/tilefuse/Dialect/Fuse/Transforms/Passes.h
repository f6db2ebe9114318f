//===- Passes.h - fuse-to-fuse passes ---------------------------*- C++ -*-===//

#ifndef TILEFUSE_DIALECT_FUSE_TRANSFORMS_PASSES_H
#define TILEFUSE_DIALECT_FUSE_TRANSFORMS_PASSES_H

#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/Pass/Pass.h"

namespace tilefuse::fuse {

#define GEN_PASS_DECL
#include "tilefuse/Dialect/Fuse/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "tilefuse/Dialect/Fuse/Transforms/Passes.h.inc"

} // namespace tilefuse::fuse

#endif // TILEFUSE_DIALECT_FUSE_TRANSFORMS_PASSES_H
