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

/// The fuse passes and the upstream passes the pipelines use.
void registerAllPasses();

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_REGISTRATION_H
