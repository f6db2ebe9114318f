//===- tilefuse-compile.cpp - print any stage of a fusion's compilation ---===//
//
//   tilefuse-compile rms_norm_fwd.mlir --dtype=bf16 --n=4096 --target=sm_90
//       --emit=ptx [--threads-per-row=..] [--time]
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/Registration.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
namespace cl = llvm::cl;

static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<fusion.mlir>"),
                                      cl::init("-"));
static cl::opt<std::string> outputFile("o", cl::desc("Output file"),
                                       cl::value_desc("file"), cl::init("-"));
static cl::opt<std::string> dtype("dtype", cl::desc("Storage dtype: f32, f16, bf16 (f64 on cpu), or declared (each port keeps its type), then optional per-port overrides: bf16,exp_avg=f32"),
                                  cl::init("f32"));
static cl::opt<int64_t> rowLength("n", cl::desc("Row length n"), cl::init(0));
static cl::opt<std::string> abi(
    "abi",
    cl::desc("Kernel ABI (KernelABI.h): e.g. multi-tensor,pointer:lr:f32 "
             "(multi-tensor kernels take no --n)"),
    cl::init(""));
static cl::opt<bool> aligned("aligned", cl::desc("16-byte aligned pointers (default true)"),
                             cl::init(true));
static cl::opt<std::string> target("target", cl::desc("sm_80, sm_86, sm_89, sm_90 or cpu"),
                                   cl::init("sm_90"));
static cl::opt<std::string> emit(
    "emit", cl::desc("Stage to print: fuse, specialized, tiled, loops, llvm, ptx"),
    cl::init("ptx"));
static cl::opt<int64_t> threadsPerRow("threads-per-row", cl::desc("Tile override"),
                                      cl::init(0));
static cl::opt<int64_t> rowsPerBlock("rows-per-block", cl::desc("Tile override"),
                                     cl::init(0));
static cl::opt<int64_t> vectorWidth("vector-width", cl::desc("Tile override"),
                                    cl::init(0));
static cl::opt<std::string> rowOnChip("row-on-chip",
                                      cl::desc("Tile override: true, false or auto"),
                                      cl::init("auto"));
static cl::opt<std::string> cudaPath(
    "cuda-path",
    cl::desc("CUDA toolkit whose libdevice to link (default: $CUDA_HOME, "
             "$CUDA_PATH, /usr/local/cuda, then beside the compiler)"),
    cl::init(""));
static cl::opt<int64_t> foldBlocks(
    "fold-blocks",
    cl::desc("PTX as the runtime loads a folded grid's kernel with this many "
             "of the tile's blocks in one (.maxntid; TileConfig.h, "
             "foldsResidentBlocks; 1: bounded to the tile's own block, as "
             "where the plain PTX fits no block on an SM)"),
    cl::init(0));
static cl::opt<bool> printTimes("time", cl::desc("Print the time of each stage to stderr"),
                                cl::init(false));

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(argc, argv, "tilefuse compiler driver\n");

  std::optional<tilefuse::Stage> stop = tilefuse::parseStage(emit);
  if (!stop) {
    llvm::errs() << "error: unknown --emit='" << emit
                 << "': expected fuse, specialized, tiled, loops, llvm or ptx\n";
    return 1;
  }

  DialectRegistry registry;
  tilefuse::registerAllDialects(registry);
  tilefuse::registerAllPasses();
  MLIRContext context(registry);
  context.loadAllAvailableDialects();

  std::string error;
  auto input = openInputFile(inputFile, &error);
  if (!input) {
    llvm::errs() << "error: " << error << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return 1;

  tilefuse::CompileOptions options;
  options.dtype = dtype;
  std::optional<tilefuse::KernelAbi> parsedAbi =
      tilefuse::KernelAbi::parse(abi);
  if (!parsedAbi) {
    llvm::errs() << "tilefuse-compile: malformed --abi '" << abi << "'\n";
    return 1;
  }
  options.abi = *parsedAbi;
  options.n = rowLength;
  options.aligned = aligned;
  options.target = target;
  options.threadsPerRow = threadsPerRow;
  options.rowsPerBlock = rowsPerBlock;
  options.vectorWidth = vectorWidth;
  options.rowOnChip = rowOnChip;
  options.cudaPath = cudaPath;
  FailureOr<tilefuse::CompileResult> result =
      tilefuse::compile(*module, options, *stop);
  if (failed(result))
    return 1;

  if (foldBlocks) {
    for (const tilefuse::KernelInfo &kernel : result->kernels) {
      if (*stop != tilefuse::Stage::PTX ||
          !tilefuse::foldsResidentBlocks(kernel.tile) || foldBlocks < 1 ||
          foldBlocks > tilefuse::maxFoldedBlocks(kernel.tile)) {
        llvm::errs() << "tilefuse-compile: --fold-blocks needs --emit=ptx and "
                        "a kernel whose blocks fold, 1 to "
                        "maxFoldedBlocks of its tile ('"
                     << kernel.name << "': "
                     << (tilefuse::foldsResidentBlocks(kernel.tile)
                             ? tilefuse::maxFoldedBlocks(kernel.tile)
                             : 0)
                     << ")\n";
        return 1;
      }
      llvm::Expected<std::string> folded =
          tilefuse::withMaxThreads(result->text, kernel.name,
                                   kernel.tile.threadsPerBlock() * foldBlocks);
      if (!folded) {
        llvm::errs() << "tilefuse-compile: " << toString(folded.takeError())
                     << "\n";
        return 1;
      }
      result->text = std::move(*folded);
    }
  }

  auto output = openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << "error: " << error << "\n";
    return 1;
  }
  output->os() << result->text;
  output->keep();
  if (printTimes) {
    double total = 0;
    for (const tilefuse::StageTime &time : result->times) {
      llvm::errs() << llvm::formatv("{0,-14} {1,8:F2} ms\n", time.stage,
                                    time.milliseconds);
      total += time.milliseconds;
    }
    llvm::errs() << llvm::formatv("{0,-14} {1,8:F2} ms\n", "total", total);
  }
  return 0;
}
