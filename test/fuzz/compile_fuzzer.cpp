//===- compile_fuzzer.cpp - libFuzzer target: fuse text to PTX and CPU code -===//
//
// Parses the input as a module of fuse kernels (only the fuse dialect is
// known to that parser), checks that it prints back to text that parses to
// the same text, then compiles it as the runtime does: to PTX, and to LLVM
// IR that the CPU JIT turns into machine code (nothing runs). Options come
// from `key=value` words anywhere in the input, as lit RUN lines write them
// (n=, dtype=, target=, row-on-chip=, threads-per-row=, rows-per-block=,
// vector-width=, aligned=); without target= it compiles for cpu and sm_90.
// An input that says "differentiate" (as fuse-differentiate's RUN lines do)
// also goes through fuse-differentiate, whose derived forward and backward
// kernels must verify and compile the same way.
//
// Every input must end in success or a diagnostic: an abort, an LLVM ERROR
// (which exits), a sanitizer report or a timeout is a finding.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/Registration.h"
#include "tilefuse/Dialect/Fuse/IR/Fuse.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace mlir;

namespace {

/// The value of the first `key=value` word in `text` ("" when there is
/// none); a word starts the text or follows a space, '-', '{' or a newline.
llvm::StringRef optionValue(llvm::StringRef text, llvm::StringRef key) {
  std::string needle = (key + "=").str();
  for (size_t at = text.find(needle); at != llvm::StringRef::npos;
       at = text.find(needle, at + 1)) {
    if (at != 0 && !llvm::StringRef(" \t\n-{").contains(text[at - 1]))
      continue;
    llvm::StringRef value = text.drop_front(at + needle.size());
    return value.take_until([](char c) {
      return llvm::StringRef(" \t\n},'\"").contains(c);
    });
  }
  return "";
}

void setInteger(llvm::StringRef text, llvm::StringRef key, int64_t &field) {
  int64_t value;
  if (!optionValue(text, key).getAsInteger(10, value))
    field = value;
}

std::string print(ModuleOp module) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module.print(os);
  return text;
}

/// A context that drops diagnostics (an error is an ordinary outcome).
std::unique_ptr<MLIRContext> quietContext(const DialectRegistry &registry) {
  auto context = std::make_unique<MLIRContext>(registry);
  context->disableMultithreading();
  context->getDiagEngine().registerHandler(
      [](Diagnostic &) { return success(); });
  return context;
}

MLIRContext *fuseOnly;  // parses the input: no other dialect can be reached
MLIRContext *pipeline;  // every dialect the pipelines produce

[[noreturn]] void finding(const char *what, llvm::StringRef detail) {
  llvm::errs() << "compile_fuzzer: " << what << "\n" << detail << "\n";
  std::abort();
}

void compileFor(ModuleOp parsed, tilefuse::CompileOptions options) {
  OwningOpRef<ModuleOp> module = parsed.clone();
  bool cpu = options.target == "cpu";
  FailureOr<tilefuse::CompileResult> result = tilefuse::compile(
      *module, options, cpu ? tilefuse::Stage::LLVM : tilefuse::Stage::PTX);
  if (failed(result) || !cpu)
    return;
  // Machine code for every kernel, as the runtime loads it from the cache.
  OwningOpRef<ModuleOp> anchor = ModuleOp::create(UnknownLoc::get(pipeline));
  auto engine = tilefuse::jitCompileLLVMIR(*anchor, result->text);
  if (failed(engine))
    return;
  for (const tilefuse::KernelInfo &kernel : result->kernels) {
    auto function = (*engine)->lookupPacked(kernel.name);
    if (!function)
      finding("a compiled kernel is missing from the JIT",
              llvm::toString(function.takeError()));
  }
}

/// `module` through fuse-differentiate (every kernel's derived forward and
/// backward), or null where the pass reports an error.
OwningOpRef<ModuleOp> differentiated(ModuleOp module) {
  OwningOpRef<ModuleOp> derived = module.clone();
  PassManager passes(pipeline);
  passes.enableVerifier(false);  // checked below, to tell a bug from an error
  if (failed(parsePassPipeline("fuse-differentiate", passes)))
    finding("fuse-differentiate is not registered", "");
  if (failed(passes.run(*derived)))
    return nullptr;
  if (failed(verify(*derived)))
    finding("fuse-differentiate produced invalid IR", print(*derived));
  return derived;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  DialectRegistry fuse;
  fuse.insert<tilefuse::fuse::FuseDialect>();
  fuseOnly = quietContext(fuse).release();
  DialectRegistry all;
  tilefuse::registerAllDialects(all);
  tilefuse::registerAllPasses();
  pipeline = quietContext(all).release();
  pipeline->loadAllAvailableDialects();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // MLIR's lexer reads up to a NUL, as files and strings end.
  std::string copy(reinterpret_cast<const char *>(data), size);
  llvm::StringRef text(copy.c_str(), size);
  OwningOpRef<ModuleOp> input = parseSourceString<ModuleOp>(text, fuseOnly);
  if (!input)
    return 0;
  // The printed form is what lit tests, dumps and errors show: it must
  // parse back to itself.
  std::string printed = print(*input);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(printed, pipeline);
  if (!module)
    finding("the printed module does not parse", printed);
  if (print(*module) != printed)
    finding("the printed module does not print back the same", printed);

  tilefuse::CompileOptions options;
  options.n = 64;
  setInteger(text, "n", options.n);
  if (llvm::StringRef dtype = optionValue(text, "dtype"); !dtype.empty())
    options.dtype = dtype.str();
  if (optionValue(text, "aligned") == "false" || optionValue(text, "aligned") == "0")
    options.aligned = false;
  setInteger(text, "threads-per-row", options.threadsPerRow);
  setInteger(text, "rows-per-block", options.rowsPerBlock);
  setInteger(text, "vector-width", options.vectorWidth);
  if (llvm::StringRef onChip = optionValue(text, "row-on-chip"); !onChip.empty())
    options.rowOnChip = onChip.str();
  OwningOpRef<ModuleOp> derived;
  if (text.contains("differentiate"))
    derived = differentiated(*module);
  llvm::StringRef target = optionValue(text, "target");
  for (llvm::StringRef each : {llvm::StringRef("cpu"), llvm::StringRef("sm_90")}) {
    options.target = target.empty() ? each.str() : target.str();
    compileFor(*module, options);
    if (derived)
      compileFor(*derived, options);
    if (!target.empty())
      break;
  }
  return 0;
}
