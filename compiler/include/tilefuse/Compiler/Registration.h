//===- Registration.h - what tilefuse's tools register ----------*- C++ -*-===//
//
// One place that names the dialects and passes tilefuse uses, shared by
// tilefuse-opt, tilefuse-compile and the runtime.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_REGISTRATION_H
#define TILEFUSE_COMPILER_REGISTRATION_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace tilefuse {

/// The fuse dialect and the upstream dialects its pipelines produce.
void registerAllDialects(mlir::DialectRegistry &registry);

/// The passes compile()'s pipelines name, and no others: what the runtime
/// registers (the self-contained library links only these).
void registerPipelinePasses();

/// The pipeline passes and every upstream transform, conversion and GPU
/// pass, for tilefuse-opt and tilefuse-compile (AllPasses.cpp, a separate
/// object so that the runtime does not link them).
void registerAllPasses();

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_REGISTRATION_H
