//===- RuntimeTest.cpp - compile on first use, then memory and disk -------===//

#include "tilefuse/Kernels/Builtins.h"
#include "tilefuse/Runtime/Runtime.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/TargetParser/Host.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace tilefuse;

namespace {

class TempDir {
public:
  TempDir() {
    llvm::SmallString<128> path;
    EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("tilefuse-runtime", path));
    dir = std::string(path);
  }
  ~TempDir() { llvm::sys::fs::remove_directories(dir); }
  std::string dir;
};

CompileOptions cpuOptions(int64_t n) {
  CompileOptions options;
  options.target = "cpu";
  options.dtype = "f32";
  options.n = n;
  return options;
}

/// Runs the rms_norm_fwd built-in on `rows` rows of 1, 2, 3, ... and checks
/// it against the formula (Gemma's offset 0).
void expectRmsNormWorks(const CpuKernel &kernel, Runtime &runtime, int64_t rows,
                        float eps) {
  int64_t n = kernel.info().n;
  std::vector<float> x(rows * n), weight(n, 2.0f), y(rows * n), rstd(rows);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i % 7) - 3.0f;
  float offset = 0.0f;
  std::vector<void *> arguments = {x.data(), weight.data(), &eps, &offset,
                                   y.data(), rstd.data()};
  ASSERT_FALSE(static_cast<bool>(kernel.run(runtime.executor(), arguments, rows)));
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < n; ++c)
      sum += x[r * n + c] * x[r * n + c];
    double want = 1.0 / std::sqrt(sum / n + eps);
    EXPECT_NEAR(rstd[r], want, 1e-5 * want) << r;
    EXPECT_NEAR(y[r * n + 1], x[r * n + 1] * want * 2.0, 1e-5) << r;
  }
}

TEST(Runtime, CompilesOnceThenServesFromMemory) {
  Runtime runtime(std::nullopt);
  auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_fwd");
  ASSERT_TRUE(mlir::succeeded(module));
  auto first = runtime.getCpuKernel(**module, cpuOptions(64));
  ASSERT_TRUE(static_cast<bool>(first)) << llvm::toString(first.takeError());
  auto second = runtime.getCpuKernel(**module, cpuOptions(64));
  ASSERT_TRUE(static_cast<bool>(second));
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(runtime.compileCount(), 1);
  // New row counts and scalars run the same kernel.
  expectRmsNormWorks(**first, runtime, 3, 1e-5f);
  expectRmsNormWorks(**first, runtime, 100, 0.5f);
  EXPECT_EQ(runtime.compileCount(), 1);
  // Another n is another kernel.
  ASSERT_TRUE(static_cast<bool>(runtime.getCpuKernel(**module, cpuOptions(128))));
  EXPECT_EQ(runtime.compileCount(), 2);
}

TEST(Runtime, FreshRuntimeLoadsFromDiskWithoutCompiling) {
  TempDir temp;
  {
    Runtime runtime(temp.dir);
    auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_fwd");
    ASSERT_TRUE(mlir::succeeded(module));
    ASSERT_TRUE(static_cast<bool>(runtime.getCpuKernel(**module, cpuOptions(64))));
    EXPECT_EQ(runtime.compileCount(), 1);
  }
  Runtime runtime(temp.dir);
  auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_fwd");
  ASSERT_TRUE(mlir::succeeded(module));
  auto kernel = runtime.getCpuKernel(**module, cpuOptions(64));
  ASSERT_TRUE(static_cast<bool>(kernel)) << llvm::toString(kernel.takeError());
  EXPECT_EQ(runtime.compileCount(), 0);
  EXPECT_EQ(runtime.cache().stats().diskHits, 1);
  expectRmsNormWorks(**kernel, runtime, 5, 1e-6f);
}

TEST(Runtime, CompileErrorsNameTheProblem) {
  Runtime runtime(std::nullopt);
  auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_fwd");
  ASSERT_TRUE(mlir::succeeded(module));
  auto kernel = runtime.getCpuKernel(**module, cpuOptions(0));
  ASSERT_FALSE(static_cast<bool>(kernel));
  std::string message = llvm::toString(kernel.takeError());
  EXPECT_NE(message.find("n must be positive, got 0"), std::string::npos) << message;
}

TEST(Runtime, ArtifactRoundTrips) {
  KernelInfo info;
  info.name = "k";
  info.n = 96;
  info.tile.target = "sm_90";
  info.tile.threadsPerRow = 128;
  info.tile.rowsPerBlock = 2;
  info.tile.rowOnChip = true;
  info.tile.blocksPerSM = 4;
  info.tile.rowsPerTask = 12;
  info.tile.vectorWidth = 8;
  info.tile.chunks = 3;
  info.tile.stageBytes = 98304;
  info.tile.partialChunks = 3;
  info.inputs = {{"x", PortInfo::Kind::Full, "bf16", ""},
                 {"eps", PortInfo::Kind::Scalar, "f32", ""}};
  info.outputs = {{"dw", PortInfo::Kind::Col, "bf16", "f32"}};
  auto parsed = deserializeArtifact(serializeArtifact(info, "; IR\n"));
  ASSERT_TRUE(static_cast<bool>(parsed));
  EXPECT_EQ(parsed->first.name, "k");
  EXPECT_EQ(parsed->first.n, 96);
  EXPECT_EQ(parsed->first.tile.rowsPerTask, 12);
  EXPECT_EQ(parsed->first.tile.target, "sm_90");
  EXPECT_EQ(parsed->first.tile.threadsPerRow, 128);
  EXPECT_EQ(parsed->first.tile.rowsPerBlock, 2);
  EXPECT_TRUE(parsed->first.tile.rowOnChip);
  EXPECT_EQ(parsed->first.tile.blocksPerSM, 4);
  EXPECT_EQ(parsed->first.tile.chunks, 3);
  EXPECT_EQ(parsed->first.tile.stageBytes, 98304);
  EXPECT_EQ(parsed->first.tile.partialChunks, 3);
  ASSERT_EQ(parsed->first.inputs.size(), 2u);
  EXPECT_EQ(parsed->first.inputs[1].kind, PortInfo::Kind::Scalar);
  ASSERT_EQ(parsed->first.outputs.size(), 1u);
  EXPECT_EQ(parsed->first.outputs[0].accumulatorDtype, "f32");
  EXPECT_EQ(parsed->second, "; IR\n");
  auto broken = deserializeArtifact("k 96 12\n---\n");
  EXPECT_FALSE(static_cast<bool>(broken));
  llvm::consumeError(broken.takeError());
}

} // namespace

namespace {

TEST(Runtime, GpuKernelsCompileToPtxAndCacheOnDisk) {
  TempDir temp;
  CompileOptions options;
  options.target = "sm_90";
  options.dtype = "bf16";
  options.n = 4096;
  {
    Runtime runtime(temp.dir);
    auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_bwd");
    ASSERT_TRUE(mlir::succeeded(module));
    auto kernel = runtime.getGpuKernel(**module, options);
    ASSERT_TRUE(static_cast<bool>(kernel)) << llvm::toString(kernel.takeError());
    EXPECT_NE((*kernel)->ptx.find(".visible .entry rms_norm_bwd("), std::string::npos);
    EXPECT_NE((*kernel)->ptx.find(".visible .entry rms_norm_bwd_finalize("), std::string::npos);
    EXPECT_EQ((*kernel)->info.tile.target, "sm_90");
    EXPECT_EQ((*kernel)->info.tile.threadsPerRow, 256);
    EXPECT_EQ((*kernel)->info.tile.blocksPerSM, 4);
    EXPECT_EQ(runtime.compileCount(), 1);
  }
  Runtime runtime(temp.dir);
  auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_bwd");
  ASSERT_TRUE(mlir::succeeded(module));
  auto kernel = runtime.getGpuKernel(**module, options);
  ASSERT_TRUE(static_cast<bool>(kernel));
  EXPECT_EQ(runtime.compileCount(), 0);
  // The tile as compiled, from the cache entry.
  EXPECT_EQ((*kernel)->info.tile.threadsPerRow, 256);
  EXPECT_EQ((*kernel)->info.tile.rowsPerBlock, 1);
  EXPECT_EQ((*kernel)->info.tile.stageBytes, 256 * 2 * 8 * 4);
  options.target = "sm_75";
  auto unknown = runtime.getGpuKernel(**module, options);
  ASSERT_FALSE(static_cast<bool>(unknown));
  EXPECT_NE(llvm::toString(unknown.takeError()).find("sm_75"), std::string::npos);
}

} // namespace

namespace {

TEST(Runtime, UnreadableEntryIsReplaced) {
  TempDir temp;
  CompileOptions options = cpuOptions(64);
  {
    Runtime runtime(temp.dir);
    auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_fwd");
    ASSERT_TRUE(mlir::succeeded(module));
    // A whole, checksummed entry whose artifact this runtime cannot parse.
    CacheKey key;
    key.fingerprint = fingerprint(**module);
    key.dtype = options.dtype;
    key.n = options.n;
    key.aligned = options.aligned;
    key.target = "cpu-" + llvm::sys::getHostCPUName().str();
    key.tileConfig = "0 0 0 auto";
    key.compilerVersion = compilerVersion();
    ASSERT_TRUE(static_cast<bool>(runtime.cache().getOrCompile(
        key, []() -> llvm::Expected<std::string> { return std::string("old format"); })));
  }
  Runtime runtime(temp.dir);
  auto module = kernels::buildBuiltin(runtime.context(), "rms_norm_fwd");
  ASSERT_TRUE(mlir::succeeded(module));
  auto kernel = runtime.getCpuKernel(**module, options);
  ASSERT_TRUE(static_cast<bool>(kernel)) << llvm::toString(kernel.takeError());
  // The unreadable entry was found on disk, then replaced by a compile.
  EXPECT_EQ(runtime.cache().stats().diskHits, 1);
  EXPECT_EQ(runtime.compileCount(), 1);
  expectRmsNormWorks(**kernel, runtime, 2, 1e-5f);
}

} // namespace
