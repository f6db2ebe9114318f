//===- Libdevice.cpp - libdevice's math functions, sliced per call set ---===//

#include "Libdevice.h"
#include "tilefuse/Compiler/Pipeline.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Linker/Linker.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <cstdlib>
#include <dlfcn.h>

using namespace tilefuse;

static constexpr llvm::StringLiteral kLibdeviceInToolkit =
    "/nvvm/libdevice/libdevice.10.bc";

llvm::Expected<std::string> tilefuse::findLibdevice() {
  std::vector<std::string> candidates;
  for (const char *variable : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *toolkit = std::getenv(variable); toolkit && *toolkit)
      candidates.push_back(toolkit + kLibdeviceInToolkit.str());
  candidates.push_back("/usr/local/cuda" + kLibdeviceInToolkit.str());
  Dl_info self;
  if (dladdr(reinterpret_cast<void *>(&tilefuse::findLibdevice), &self) &&
      self.dli_fname) {
    llvm::SmallString<256> beside(llvm::sys::path::parent_path(self.dli_fname));
    llvm::sys::path::append(beside, "libdevice.10.bc");
    candidates.push_back(beside.str().str());
  }
  for (const std::string &candidate : candidates)
    if (llvm::sys::fs::is_regular_file(candidate))
      return candidate;
  return llvm::createStringError("libdevice.10.bc was not found; tried " +
                                 llvm::join(candidates, ", "));
}

llvm::Expected<std::string> tilefuse::libdevicePath(llvm::StringRef cudaPath) {
  if (cudaPath.empty())
    return findLibdevice();
  return (cudaPath + kLibdeviceInToolkit).str();
}

llvm::Expected<llvm::StringRef>
Libdevice::slice(llvm::StringRef key, llvm::ArrayRef<std::string> names) {
  auto found = slices.find(key);
  if (found != slices.end())
    return llvm::StringRef(found->second.data(), found->second.size());

  llvm::LLVMContext context;
  llvm::Expected<std::unique_ptr<llvm::Module>> library =
      llvm::getLazyBitcodeModule(bitcode->getMemBufferRef(), context);
  if (!library)
    return library.takeError();
  llvm::Module sliced("libdevice", context);
  sliced.setTargetTriple((*library)->getTargetTriple());
  sliced.setDataLayout((*library)->getDataLayout());
  for (const std::string &name : names) {
    llvm::Function *function = (*library)->getFunction(name);
    if (!function)
      return llvm::createStringError("libdevice has no function " + name);
    sliced.getOrInsertFunction(name, function->getFunctionType());
  }
  if (llvm::Linker::linkModules(sliced, std::move(*library),
                                llvm::Linker::Flags::LinkOnlyNeeded))
    return llvm::createStringError("cutting " + key + " out of libdevice failed");
  llvm::SmallVector<char, 0> &buffer = slices[key];
  llvm::raw_svector_ostream os(buffer);
  // With the order of each value's uses, which the optimizer can see (the
  // inlined functions' blocks list their predecessors in it).
  llvm::WriteBitcodeToFile(sliced, os, /*ShouldPreserveUseListOrder=*/true);
  return llvm::StringRef(buffer.data(), buffer.size());
}

llvm::Error Libdevice::linkInto(llvm::Module &module) {
  if (llvm::Error error = linkDeclared(module))
    return error;
  // Only the kernels are entry points.
  for (llvm::Function &function : module)
    if (!function.isDeclaration() &&
        function.getCallingConv() != llvm::CallingConv::PTX_Kernel)
      function.setLinkage(llvm::GlobalValue::InternalLinkage);
  return llvm::Error::success();
}

llvm::Error Libdevice::linkDeclared(llvm::Module &module) {
  std::vector<std::string> names;
  for (llvm::Function &function : module)
    if (function.isDeclaration() && function.getName().starts_with("__nv_"))
      names.push_back(function.getName().str());
  if (names.empty())
    return llvm::Error::success();
  llvm::sort(names);
  std::string key = llvm::join(names, ",");
  llvm::Expected<llvm::StringRef> bytes = slice(key, names);
  if (!bytes)
    return bytes.takeError();
  llvm::Expected<std::unique_ptr<llvm::Module>> sliced = llvm::parseBitcodeFile(
      llvm::MemoryBufferRef(*bytes, "libdevice"), module.getContext());
  if (!sliced)
    return sliced.takeError();
  (*sliced)->setTargetTriple(module.getTargetTriple());
  (*sliced)->setDataLayout(module.getDataLayout());
  if (llvm::Linker::linkModules(module, std::move(*sliced),
                                llvm::Linker::Flags::LinkOnlyNeeded))
    return llvm::createStringError("linking libdevice's " + key + " failed");
  return llvm::Error::success();
}
