//===- Libdevice.h - libdevice's math functions, sliced per call set -----===//
//
// Private to the compiler library: the PTX pipeline links the libdevice
// functions a kernel calls through this.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_LIB_LIBDEVICE_H
#define TILEFUSE_COMPILER_LIB_LIBDEVICE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <memory>
#include <string>

namespace llvm {
class Module;
} // namespace llvm

namespace tilefuse {

/// libdevice.10.bc in the CUDA toolkit at `cudaPath`, or where
/// findLibdevice() finds it when that is empty.
llvm::Expected<std::string> libdevicePath(llvm::StringRef cudaPath);

/// libdevice's bitcode and, for each set of `__nv_` functions a module has
/// declared so far, those functions cut out of it (with what they use) as a
/// small bitcode module. Reading libdevice, even lazily, costs 8 M
/// instructions a compile (its symbol table and function index: an eighth
/// of swiglu_fwd's whole compile); parsing a slice, under 1 M. The first
/// module to declare a set pays that read once, plus writing its slice. Not
/// thread-safe: one per thread, like the target machine.
class Libdevice {
public:
  explicit Libdevice(std::unique_ptr<llvm::MemoryBuffer> bitcode)
      : bitcode(std::move(bitcode)) {}

  /// Links into `module` the libdevice definition of every `__nv_` function
  /// it declares, as linking all of libdevice with `LinkOnlyNeeded` would,
  /// and makes every function but the kernels internal (libdevice's or
  /// not), so that they are inlined and dropped.
  llvm::Error linkInto(llvm::Module &module);

private:
  /// Links the definitions of the `__nv_` functions `module` declares.
  llvm::Error linkDeclared(llvm::Module &module);
  /// The slice defining `names` (sorted, `,`-joined in `key`).
  llvm::Expected<llvm::StringRef> slice(llvm::StringRef key,
                                        llvm::ArrayRef<std::string> names);

  std::unique_ptr<llvm::MemoryBuffer> bitcode;
  llvm::StringMap<llvm::SmallVector<char, 0>> slices;
};

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_LIB_LIBDEVICE_H
