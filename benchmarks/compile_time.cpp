//===- compile_time.cpp - cold compile time of each reference fusion ------===//
//
// For each reference fusion: parse the fuse IR and compile it to PTX text
// (sm_90, bf16, n = 4096) and to a JIT-compiled CPU function (f32,
// n = 4096), `--runs` times each with no kernel cache, in one MLIRContext
// as the runtime holds one. What a process keeps across compiles stays
// warm, as it does in the runtime: the NVPTX target machine, libdevice and
// its slices (only the first compile declaring a set of libdevice functions
// cuts one; the median leaves that compile out). Prints the median of each
// stage and writes JSON (`--json=FILE`). Target: <= 30 ms median from fuse
// IR to PTX text.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/Registration.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

using namespace mlir;
namespace cl = llvm::cl;

static cl::opt<int> runs("runs", cl::desc("Compiles per fusion and target"),
                         cl::init(7));
static cl::opt<std::string> jsonPath("json", cl::desc("Write results as JSON"),
                                     cl::init(""));
static cl::list<std::string> fusionNames(
    "fusions", cl::CommaSeparated,
    cl::desc("Fusions to compile (default: all ten)"));
static cl::list<std::string> targetNames(
    "targets", cl::CommaSeparated,
    cl::desc("Targets to compile: ptx, cpu (default: both)"));

static const char *const kFusions[] = {
    "rms_norm_fwd",      "rms_norm_bwd",      "layer_norm_fwd",
    "layer_norm_bwd",    "layer_norm_bwd_recentered",
    "swiglu_fwd",        "swiglu_bwd",        "cross_entropy_fwd",
    "cross_entropy_bwd", "adamw_step"};

static double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int main(int argc, char **argv) {
  cl::ParseCommandLineOptions(argc, argv, "tilefuse compile-time benchmark\n");
  DialectRegistry registry;
  tilefuse::registerAllDialects(registry);
  tilefuse::registerAllPasses();
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  context.disableMultithreading();

  struct Row {
    std::string fusion, target;
    std::map<std::string, double> stages; // median ms
    double total;
  };
  std::vector<Row> rows;
  auto chosen = [](const cl::list<std::string> &names, llvm::StringRef name) {
    return names.empty() || llvm::is_contained(names, name);
  };
  for (llvm::StringRef name : fusionNames)
    if (!llvm::is_contained(kFusions, name)) {
      llvm::errs() << "unknown fusion: " << name << " (one of "
                   << llvm::join(std::begin(kFusions), std::end(kFusions), ", ")
                   << ")\n";
      return 1;
    }
  for (llvm::StringRef name : targetNames)
    if (name != "ptx" && name != "cpu") {
      llvm::errs() << "unknown target: " << name << " (ptx or cpu)\n";
      return 1;
    }
  for (const char *fusion : kFusions) {
    if (!chosen(fusionNames, fusion))
      continue;
    std::string path = std::string(TILEFUSE_FUSIONS_DIR) + "/" + fusion + ".mlir";
    for (bool gpu : {true, false}) {
      if (!chosen(targetNames, gpu ? "ptx" : "cpu"))
        continue;
      tilefuse::CompileOptions options;
      options.n = 4096;
      options.dtype = gpu ? "bf16" : "f32";
      options.target = gpu ? "sm_90" : "cpu";
      std::map<std::string, std::vector<double>> samples;
      std::vector<double> totals;
      for (int run = 0; run < runs; ++run) {
        auto start = std::chrono::steady_clock::now();
        OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(path, &context);
        auto parsed = std::chrono::steady_clock::now();
        samples["parse"].push_back(
            std::chrono::duration<double, std::milli>(parsed - start).count());
        auto result = tilefuse::compile(
            *module, options, gpu ? tilefuse::Stage::PTX : tilefuse::Stage::LLVM);
        if (failed(result)) {
          llvm::errs() << "compile failed: " << fusion << "\n";
          return 1;
        }
        for (const tilefuse::StageTime &time : result->times)
          samples[time.stage].push_back(time.milliseconds);
        if (!gpu) {
          auto jitStart = std::chrono::steady_clock::now();
          auto engine = tilefuse::jitCompile(*module);
          if (failed(engine) || !(*engine)->lookupPacked(fusion)) {
            llvm::errs() << "JIT failed: " << fusion << "\n";
            return 1;
          }
          samples["jit"].push_back(std::chrono::duration<double, std::milli>(
                                       std::chrono::steady_clock::now() - jitStart)
                                       .count());
        }
        totals.push_back(std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start)
                             .count());
      }
      Row row{fusion, gpu ? "sm_90 ptx" : "cpu jit", {}, median(totals)};
      for (auto &[stage, values] : samples)
        row.stages[stage] = median(values);
      rows.push_back(row);
    }
  }

  const char *stages[] = {"parse", "specialize", "tile", "loops", "nvvm",
                          "llvm-dialect", "llvm-ir", "ptx", "jit"};
  llvm::outs() << llvm::formatv("{0,-18} {1,-10}", "fusion", "target");
  for (const char *stage : stages)
    llvm::outs() << llvm::formatv(" {0,8}", stage);
  llvm::outs() << llvm::formatv(" {0,8}\n", "total");
  for (const Row &row : rows) {
    llvm::outs() << llvm::formatv("{0,-18} {1,-10}", row.fusion, row.target);
    for (const char *stage : stages) {
      auto it = row.stages.find(stage);
      if (it == row.stages.end())
        llvm::outs() << llvm::formatv(" {0,8}", "-");
      else
        llvm::outs() << llvm::formatv(" {0,8:F1}", it->second);
    }
    llvm::outs() << llvm::formatv(" {0,8:F1}\n", row.total);
  }
  llvm::outs() << "median of " << runs << " cold compiles, milliseconds; "
               << "PTX: bf16 n=4096 sm_90; CPU: f32 n=4096\n";

  if (!jsonPath.empty()) {
    std::error_code error;
    llvm::raw_fd_ostream json(jsonPath, error);
    if (error) {
      llvm::errs() << "cannot write " << jsonPath << ": " << error.message() << "\n";
      return 1;
    }
    json << "[\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      json << llvm::formatv("  {{\"fusion\": \"{0}\", \"target\": \"{1}\", "
                            "\"total_ms\": {2:F3}, \"stages_ms\": {{",
                            rows[i].fusion, rows[i].target, rows[i].total);
      bool first = true;
      for (auto &[stage, value] : rows[i].stages) {
        json << llvm::formatv("{0}\"{1}\": {2:F3}", first ? "" : ", ", stage, value);
        first = false;
      }
      json << "}}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    json << "]\n";
  }
  return 0;
}
