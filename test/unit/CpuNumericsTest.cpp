//===- CpuNumericsTest.cpp - reference fusions JIT-compiled for the CPU ----===//
//
// Each reference fusion (test/lit/fusions) is compiled for the CPU target,
// JIT-compiled, run through the runtime's CPU executor (rows split across
// four threads), and compared with the scalar references of
// ScalarReference.h (tolerances there).
//
//===----------------------------------------------------------------------===//

#include "ScalarReference.h"

#include "tilefuse/Compiler/Differentiate.h"
#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/Registration.h"
#include "tilefuse/Kernels/Builtins.h"
#include "tilefuse/Runtime/Runtime.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/Error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace mlir;
using namespace tilefuse::testing;

namespace {

using tilefuse::KernelInfo;
using tilefuse::PortInfo;
using Kind = PortInfo::Kind;

struct CompiledFusion {
  KernelInfo info;
  std::shared_ptr<const tilefuse::CpuKernel> kernel;
};

std::string fusionPath(const std::string &name) {
  return std::string(TILEFUSE_FUSIONS_DIR) + "/" + name + ".mlir";
}

class CpuNumerics : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    DialectRegistry registry;
    tilefuse::registerAllDialects(registry);
    tilefuse::registerAllPasses();
    context = new MLIRContext(registry);
    context->loadAllAvailableDialects();
    executor = new tilefuse::CpuExecutor(4);
  }
  static void TearDownTestSuite() {
    delete executor;
    delete context;
  }

  /// Compiles the reference fusion `name` (test/lit/fusions) for the CPU.
  std::unique_ptr<CompiledFusion> compile(const std::string &name, Dtype dtype,
                                          int64_t n, bool aligned) {
    return compile(name, dtypeName(dtype), n, aligned);
  }
  /// ... with a storage spec ("bf16,exp_avg=f32": per-port dtypes).
  std::unique_ptr<CompiledFusion> compile(const std::string &name,
                                          const std::string &storage, int64_t n,
                                          bool aligned) {
    return compileModule(
        [&] { return parseSourceFile<ModuleOp>(fusionPath(name), context); },
        storage, n, aligned);
  }

  /// Compiles the built-in fusion `name` (kernels_dsl) for the CPU.
  std::unique_ptr<CompiledFusion> compileBuiltin(const std::string &name,
                                                 Dtype dtype, int64_t n,
                                                 bool aligned) {
    return compileModule(
        [&]() -> OwningOpRef<ModuleOp> {
          auto module = tilefuse::kernels::buildBuiltin(*context, name);
          return succeeded(module) ? std::move(*module) : nullptr;
        },
        dtypeName(dtype), n, aligned);
  }

  /// Compiles what `load` returns for the CPU; fails the test with the
  /// diagnostics.
  std::unique_ptr<CompiledFusion>
  compileModule(llvm::function_ref<OwningOpRef<ModuleOp>()> load,
                const std::string &storage, int64_t n, bool aligned) {
    std::string diagnostics;
    ScopedDiagnosticHandler handler(context, [&](Diagnostic &diagnostic) {
      diagnostics += diagnostic.str() + "\n";
      return success();
    });
    OwningOpRef<ModuleOp> module = load();
    EXPECT_TRUE(module) << diagnostics;
    if (!module)
      return nullptr;
    tilefuse::CompileOptions options;
    options.dtype = storage;
    options.n = n;
    options.aligned = aligned;
    options.target = "cpu";
    FailureOr<tilefuse::CompileResult> lowered =
        tilefuse::compile(*module, options, tilefuse::Stage::LLVM);
    EXPECT_TRUE(succeeded(lowered)) << diagnostics;
    if (failed(lowered))
      return nullptr;
    auto engine = tilefuse::jitCompile(*module);
    EXPECT_TRUE(succeeded(engine)) << diagnostics;
    if (failed(engine))
      return nullptr;
    auto kernel = tilefuse::CpuKernel::create(lowered->kernels.front(),
                                              std::move(*engine));
    EXPECT_TRUE(static_cast<bool>(kernel));
    if (!kernel) {
      llvm::consumeError(kernel.takeError());
      return nullptr;
    }
    auto result = std::make_unique<CompiledFusion>();
    result->info = lowered->kernels.front();
    result->kernel = std::move(*kernel);
    return result;
  }

  static MLIRContext *context;
  static tilefuse::CpuExecutor *executor;
};

MLIRContext *CpuNumerics::context = nullptr;
tilefuse::CpuExecutor *CpuNumerics::executor = nullptr;

/// Runs `fusion` on `in` over `rows` rows through the runtime's CPU
/// executor (rows split over four threads). Returns the outputs.
Values run(CompiledFusion &fusion, tilefuse::CpuExecutor &executor,
           const Values &in, int64_t rows, bool aligned) {
  Arguments arguments =
      makeArguments(fusion.info, in, rows, aligned);
  llvm::Error error = fusion.kernel->run(executor, arguments.pointers, rows);
  EXPECT_FALSE(static_cast<bool>(error)) << llvm::toString(std::move(error));
  return readOutputs(fusion.info, arguments, rows);
}

/// Runs `fusion` on random inputs and compares every output with
/// `reference`, rounded to the output's storage type.
void expectMatchesReference(CompiledFusion &fusion, const Reference &reference,
                            int64_t rows, bool aligned, uint32_t seed,
                            tilefuse::CpuExecutor &executor) {
  Values in = makeInputs(fusion.info, rows, seed);
  Values actual = run(fusion, executor, in, rows, aligned);
  tilefuse::testing::expectMatchesReference(fusion.info, reference, in, actual,
                                            rows);
}

class CpuNumericsSweep : public CpuNumerics {};

TEST_F(CpuNumericsSweep, ReferenceFusionsMatchScalarReference) {
  const std::vector<int64_t> rowLengths = {1, 3, 64, 1000, 4096, 32000};
  // Variants (ScalarReference.h), aligned, at the row lengths that pick
  // each path on the CPU: scalar lanes, vectors on chip, streamed.
  const std::vector<int64_t> variantRowLengths = {3, 64, 1000};
  const std::vector<int64_t> rowCounts = {1, 7, 256};
  int checked = 0;
  for (const auto &[name, reference] : references()) {
    for (Dtype dtype : {Dtype::F32, Dtype::F16, Dtype::BF16}) {
      for (int64_t n : isVariant(name) ? variantRowLengths : rowLengths) {
        for (bool aligned : {true, false}) {
          if (!aligned && isVariant(name))
            continue;
          std::unique_ptr<CompiledFusion> fusion = compile(name, dtype, n, aligned);
          ASSERT_TRUE(fusion) << name;
          for (int64_t rows : rowCounts) {
            SCOPED_TRACE(caseName({name, dtype, n, rows, aligned}));
            expectMatchesReference(*fusion, reference, rows, aligned,
                                   /*seed=*/n * 31 + rows, *executor);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
  std::printf("checked %d (fusion, dtype, n, rows, alignment) cases\n", checked);
}

/// The built-ins written in the DSL (kernels_dsl) compute what the
/// reference fusions do.
TEST_F(CpuNumerics, BuiltinsMatchScalarReference) {
  ASSERT_EQ(tilefuse::kernels::builtinNames().size(), references().size());
  for (llvm::StringRef builtin : tilefuse::kernels::builtinNames()) {
    std::string name = builtin.str();
    auto reference = references().find(name);
    ASSERT_NE(reference, references().end()) << name;
    for (Dtype dtype : {Dtype::F32, Dtype::BF16}) {
      for (int64_t n : {3, 1000, 4096}) {
        std::unique_ptr<CompiledFusion> fusion =
            compileBuiltin(name, dtype, n, /*aligned=*/true);
        ASSERT_TRUE(fusion) << name;
        for (int64_t rows : {1, 7, 256}) {
          SCOPED_TRACE(caseName({name + " (builtin)", dtype, n, rows, true}));
          expectMatchesReference(*fusion, reference->second, rows,
                                 /*aligned=*/true, /*seed=*/n + rows, *executor);
        }
      }
    }
  }
}

/// One kernel with tensors in two dtypes (per-port storage): bf16
/// parameters with f32 optimizer state, a bf16 input with an f32 weight and
/// output; each port is stored, and rounded to, its own dtype.
TEST_F(CpuNumerics, MixedStorageMatchesScalarReference) {
  const std::string state = "exp_avg=f32,exp_avg_sq=f32,exp_avg_out=f32,"
                            "exp_avg_sq_out=f32";
  const std::pair<std::string, std::string> cases[] = {
      {"adamw_step", "bf16," + state},
      {"adamw_amsgrad_step",
       "f16," + state + ",max_exp_avg_sq=f32,max_exp_avg_sq_out=f32"},
      {"rms_norm_llama_fwd", "bf16,weight=f32,y=f32"},
      {"rms_norm_llama_bwd", "bf16,dy=f32,weight=f32,dweight=f32"},
      {"rms_norm_fwd", "f16,weight=f32"},
  };
  for (const auto &[name, storage] : cases) {
    for (int64_t n : {3, 1000}) {
      SCOPED_TRACE(name + " " + storage + " n=" + std::to_string(n));
      std::unique_ptr<CompiledFusion> fusion = compile(name, storage, n, true);
      ASSERT_TRUE(fusion);
      expectMatchesReference(*fusion, references().at(name), /*rows=*/7,
                             /*aligned=*/true, /*seed=*/n, *executor);
    }
  }
}

/// NaN and Inf propagate as in PyTorch: a NaN in a row poisons that row's
/// reductions and outputs and nothing else; an infinite logit makes that
/// row's loss NaN or Inf as torch's does.
TEST_F(CpuNumerics, NaNAndInfPropagate) {
  for (const auto &[name, reference] : references()) {
    SCOPED_TRACE(name);
    int64_t n = 64, rows = 7;
    std::unique_ptr<CompiledFusion> fusion = compile(name, Dtype::F32, n, true);
    ASSERT_TRUE(fusion);
    Values in = makeInputs(fusion->info, rows, /*seed=*/3);
    addNaNAndInf(fusion->info, in);
    Values actual = run(*fusion, *executor, in, rows, true);
    tilefuse::testing::expectMatchesReference(fusion->info, reference, in,
                                              actual, rows);
  }
}

/// rows == 0 runs nothing and leaves outputs untouched; a column reduction
/// over no rows is its identity.
TEST_F(CpuNumerics, ZeroRows) {
  std::unique_ptr<CompiledFusion> fusion =
      compile("rms_norm_bwd", Dtype::F32, 64, true);
  ASSERT_TRUE(fusion);
  Values in = makeInputs(fusion->info, 0, 1);
  Values actual = run(*fusion, *executor, in, 0, true);
  EXPECT_TRUE(actual.floats.at("dx").empty());
  for (double value : actual.floats.at("dweight"))
    EXPECT_EQ(value, 0.0);
}

//===----------------------------------------------------------------------===//
// Derived backward kernels (fuse-differentiate)
//===----------------------------------------------------------------------===//

/// The reference forward fusion `name` differentiated for a gradient of
/// `output`: its derived forward or its backward kernel, alone in a module.
OwningOpRef<ModuleOp> derivedKernel(MLIRContext *context,
                                    const std::string &name,
                                    const std::string &output, bool backward) {
  OwningOpRef<ModuleOp> source =
      parseSourceFile<ModuleOp>(fusionPath(name), context);
  if (!source)
    return nullptr;
  OwningOpRef<ModuleOp> result = ModuleOp::create(UnknownLoc::get(context));
  OpBuilder builder = OpBuilder::atBlockEnd(result->getBody());
  tilefuse::DifferentiateOptions options;
  options.outputs = {output};
  FailureOr<tilefuse::Derivative> derivative = tilefuse::differentiate(
      *source->getOps<tilefuse::fuse::KernelOp>().begin(), options, builder);
  if (failed(derivative))
    return nullptr;
  (backward ? derivative->forward : derivative->backward).erase();
  return result;
}

/// The full [rows, n] tensors a kernel reads and writes, which make its
/// memory traffic (per-row and per-column tensors are n or rows times
/// smaller).
std::pair<size_t, size_t> fullTensors(const KernelInfo &info) {
  auto full = [](const PortInfo &port) { return port.kind == Kind::Full; };
  return {llvm::count_if(info.inputs, full), llvm::count_if(info.outputs, full)};
}

/// The backward derived from each reference forward fusion computes what
/// the hand-written backward fusion does (both within tolerance of its
/// scalar reference, from the statistics the derived forward saves), and
/// reads and writes as many full tensors.
TEST_F(CpuNumerics, DerivedBackwardMatchesHandWritten) {
  struct Pair {
    const char *forward, *output, *backward;
  };
  const Pair pairs[] = {{"rms_norm_fwd", "y", "rms_norm_bwd"},
                        {"layer_norm_fwd", "y", "layer_norm_bwd"},
                        {"swiglu_fwd", "c", "swiglu_bwd"},
                        {"cross_entropy_fwd", "loss", "cross_entropy_bwd"}};
  // n = 32000 streams the row on the CPU (more than 8 chunks).
  const std::pair<Dtype, int64_t> shapes[] = {
      {Dtype::F32, 3}, {Dtype::F32, 1000}, {Dtype::F32, 32000}, {Dtype::BF16, 1000}};
  for (const Pair &pair : pairs) {
    for (auto [dtype, n] : shapes) {
      {
        auto derived = [&](bool backward) {
          return compileModule(
              [&] {
                return derivedKernel(context, pair.forward, pair.output,
                                     backward);
              },
              dtypeName(dtype), n, /*aligned=*/true);
        };
        std::unique_ptr<CompiledFusion> forward = derived(false);
        std::unique_ptr<CompiledFusion> backward = derived(true);
        std::unique_ptr<CompiledFusion> handWritten =
            compile(pair.backward, dtype, n, /*aligned=*/true);
        ASSERT_TRUE(forward && backward && handWritten) << pair.forward;
        EXPECT_EQ(fullTensors(backward->info), fullTensors(handWritten->info))
            << pair.forward << ": full tensors read, written";
        for (int64_t rows : {7, 256}) {
          SCOPED_TRACE(caseName({std::string(pair.forward) + " (derived)",
                                 dtype, n, rows, true}));
          Values in = makeInputs(forward->info, rows, /*seed=*/n + rows);
          Values saved = run(*forward, *executor, in, rows, true);
          in.floats.insert(saved.floats.begin(), saved.floats.end());
          in.ints.insert(saved.ints.begin(), saved.ints.end());
          // The output's gradient.
          std::mt19937 rng(rows);
          std::normal_distribution<double> normal(0.0, 1.0);
          for (const PortInfo &port : backward->info.inputs) {
            if (port.kind == Kind::Scalar || in.floats.count(port.name) ||
                in.ints.count(port.name))
              continue;
            auto &values = in.floats[port.name];
            for (size_t i = 0; i < elementCount(port.kind, rows, n); ++i)
              values.push_back(
                  roundTo(static_cast<float>(normal(rng)), dtypeOf(port.dtype)));
          }
          Values want;
          references().at(pair.backward)(in, rows, n, want);
          for (CompiledFusion *kernel : {backward.get(), handWritten.get()}) {
            Values got = run(*kernel, *executor, in, rows, true);
            for (const PortInfo &port : handWritten->info.outputs) {
              std::vector<double> expected = want.floats.at(port.name);
              for (double &value : expected)
                value = roundTo(static_cast<float>(value), dtypeOf(port.dtype));
              expectClose(kernel->info.name + " " + port.name,
                          got.floats.at(port.name), expected,
                          toleranceFor(port.dtype), columnScale(port, rows));
            }
          }
        }
      }
    }
  }
}

} // namespace
