//===- EmulatedNumericsTest.cpp - the reference fusions' PTX, run ---------===//
//
// Each reference fusion (test/lit/fusions) is compiled to PTX for sm_80 and
// sm_90 by the runtime, launched through the real CudaDriver (parameter
// packing, grid, finalize launch) into the PTX emulator, which checks every
// access, and compared with the scalar references of ScalarReference.h,
// every output included (the finalize kernel's column results too).
//
//===----------------------------------------------------------------------===//

#include "ScalarReference.h"

#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Emulator/Emulator.h"
#include "tilefuse/Runtime/CudaDriver.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

using namespace tilefuse;
using namespace tilefuse::testing;
using Kind = PortInfo::Kind;

namespace {

std::string fusionPath(const std::string &name) {
  return std::string(TILEFUSE_FUSIONS_DIR) + "/" + name + ".mlir";
}

class EmulatedNumerics : public ::testing::Test {
protected:
  void TearDown() override { emulator::setDevice("sm_90"); }

  /// A driver for the emulated `chip` with `multiprocessors` SMs (0: the
  /// chip's own count). CudaDriver caches device attributes, so each
  /// device gets its own driver.
  std::unique_ptr<CudaDriver> driverFor(const std::string &chip,
                                        int multiprocessors = 0) {
    EXPECT_TRUE(emulator::setDevice(chip, multiprocessors));
    auto driver = CudaDriver::load(TILEFUSE_EMULATOR_LIBRARY);
    EXPECT_TRUE(static_cast<bool>(driver))
        << llvm::toString(driver.takeError());
    if (!driver)
      return nullptr;
    EXPECT_TRUE((*driver)->emulated());
    auto target = (*driver)->target(0);
    EXPECT_TRUE(static_cast<bool>(target) && *target == chip);
    if (!target)
      llvm::consumeError(target.takeError());
    return std::move(*driver);
  }

  /// The PTX of reference fusion `name` for `chip`.
  std::shared_ptr<const GpuKernel> compile(const std::string &name, Dtype dtype,
                                           int64_t n, bool aligned,
                                           const std::string &chip) {
    std::string diagnostics;
    mlir::ScopedDiagnosticHandler handler(
        &runtime.context(), [&](mlir::Diagnostic &diagnostic) {
          diagnostics += diagnostic.str() + "\n";
          return mlir::success();
        });
    auto module = mlir::parseSourceFile<mlir::ModuleOp>(fusionPath(name),
                                                        &runtime.context());
    EXPECT_TRUE(module) << diagnostics;
    if (!module)
      return nullptr;
    CompileOptions options;
    options.dtype = dtypeName(dtype);
    options.n = n;
    options.aligned = aligned;
    options.target = chip;
    auto kernel = runtime.getGpuKernel(*module, options);
    EXPECT_TRUE(static_cast<bool>(kernel))
        << llvm::toString(kernel.takeError()) << diagnostics;
    return kernel ? *kernel : nullptr;
  }

  /// Runs `kernel` on `in` over `rows` rows through `driver`, every buffer
  /// described to the emulator. Returns the outputs.
  Values run(CudaDriver &driver, const std::shared_ptr<const GpuKernel> &kernel,
             const Values &in, int64_t rows, bool aligned) {
    const KernelInfo &info = kernel->info;
    Arguments arguments = makeArguments(info, in, rows, aligned);
    std::vector<CudaDriver::Buffer> extents;
    size_t buffer = 0;
    for (const PortInfo &port : info.inputs) {
      if (port.kind == Kind::Scalar) {
        extents.push_back({port.name.c_str(), nullptr, 0});
        continue;
      }
      HostBuffer &host = arguments.buffers[buffer++];
      extents.push_back({port.name.c_str(), host.data(), host.size});
    }
    for (const PortInfo &port : info.outputs) {
      HostBuffer &host = arguments.buffers[buffer++];
      extents.push_back({port.name.c_str(), host.data(), host.size});
    }
    // Column reductions: partials in the accumulator's dtype, one row per
    // row group.
    llvm::Expected<int64_t> groups = driver.partialRows(kernel, rows, 0);
    EXPECT_TRUE(static_cast<bool>(groups));
    std::vector<HostBuffer> partials;
    std::vector<std::string> names;
    for (const PortInfo &port : info.outputs)
      if (port.kind == Kind::Col) {
        partials.push_back(makeBuffer(std::max<int64_t>(*groups, 1) * info.n *
                                          elementBytes(port.accumulatorDtype),
                                      0));
        names.push_back(port.name + " partials");
      }
    std::vector<void *> workspaces;
    for (size_t i = 0; i < partials.size(); ++i) {
      workspaces.push_back(partials[i].data());
      extents.push_back(
          {names[i].c_str(), partials[i].data(), partials[i].size});
    }
    llvm::Error error = driver.launch(kernel, arguments.pointers, workspaces,
                                      rows, 0, nullptr, extents);
    EXPECT_FALSE(static_cast<bool>(error)) << llvm::toString(std::move(error));
    return readOutputs(info, arguments, rows);
  }

  /// Runs reference fusion `name` on random inputs and compares every
  /// output with its scalar reference.
  void check(CudaDriver &driver, const std::string &chip, const Case &c) {
    SCOPED_TRACE(chip + "/" + caseName(c));
    auto kernel = compile(c.fusion, c.dtype, c.n, c.aligned, chip);
    ASSERT_TRUE(kernel);
    Values in = makeInputs(kernel->info, c.rows, /*seed=*/c.n * 31 + c.rows);
    Values actual = run(driver, kernel, in, c.rows, c.aligned);
    expectMatchesReference(kernel->info, references().at(c.fusion), in, actual,
                           c.rows);
  }

  Runtime runtime{std::nullopt};
};

/// Rows per case: enough for several blocks (and row groups of the column
/// reductions) at small n, a few rows of the long ones.
int64_t rowsFor(int64_t n) { return n <= 7 ? 300 : n <= 1000 ? 9 : 3; }

TEST_F(EmulatedNumerics, ReferenceFusionsMatchScalarReference) {
  int checked = 0;
  auto start = std::chrono::steady_clock::now();
  uint64_t instructions = 0;
  double emulated = 0;
  for (const char *chip : {"sm_90", "sm_80"}) {
    auto driver = driverFor(chip);
    ASSERT_TRUE(driver);
    emulator::takeLaunches();
    for (const auto &entry : references()) {
      // Variants (ScalarReference.h): one short and one long row, aligned.
      bool variant = isVariant(entry.first);
      for (Dtype dtype : {Dtype::F32, Dtype::F16, Dtype::BF16})
        for (int64_t n : {1, 7, 1000, 4096, 8192})
          for (bool aligned : {true, false}) {
            // Cross-entropy variants: f32 and bf16, aligned, on sm_90.
            if ((variant && (n == 1 || n > 1000 || !aligned)) ||
                (isCrossEntropyVariant(entry.first) &&
                 (dtype == Dtype::F16 || n == 1 || n == 8192 || !aligned ||
                  std::string(chip) != "sm_90")))
              continue;
            check(*driver, chip, {entry.first, dtype, n, rowsFor(n), aligned});
            ++checked;
          }
    }
    for (const emulator::LaunchRecord &record : emulator::takeLaunches()) {
      instructions += record.totalInstructions();
      emulated += record.seconds;
    }
  }
  double seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  std::printf("checked %d (chip, fusion, dtype, n, alignment) cases in %.1f s; "
              "the emulator ran %.3g thread-instructions in %.1f s (%.3g per "
              "second)\n",
              checked, seconds, double(instructions), emulated,
              instructions / std::max(emulated, 1e-9));
}

/// Vocabulary-sized rows, a few of them. The cross-entropy variants at bf16
/// n = 32000 and 128256: at 32000 the losses alone merge their reductions
/// on chip (a wide row), the probability targets' stream; at 128256 all
/// stream.
TEST_F(EmulatedNumerics, LongRows) {
  auto driver = driverFor("sm_90");
  ASSERT_TRUE(driver);
  for (const auto &entry : references())
    for (Dtype dtype : {Dtype::BF16, Dtype::F32})
      for (int64_t n : {32000, 128256, 262144})
        if (!isVariant(entry.first) && (!isCrossEntropyVariant(entry.first) ||
                                        (dtype == Dtype::BF16 && n != 262144)))
          check(*driver, "sm_90", {entry.first, dtype, n, 2, true});
}

/// With 2 SMs, column reductions run a persistent grid of fewer blocks
/// than rows (as many as can be resident, at most the tile's): blocks loop
/// over rows, and the last row group's rows clamp (or, where row groups
/// are whole warps, end at the last row). Where partials all stay on chip
/// and nothing is staged, the blocks an SM would run are one block of
/// their row groups (foldsResidentBlocks). Their partials stay in shared
/// memory across the rows (n = 32000: beside staged chunks of the streamed
/// row, or as many of them as fit) and reach global memory once per block.
TEST_F(EmulatedNumerics, PersistentGridWithFewerBlocksThanRows) {
  auto driver = driverFor("sm_90", 2);
  ASSERT_TRUE(driver);
  for (const char *name :
       {"rms_norm_bwd", "layer_norm_bwd", "layer_norm_bwd_recentered"})
    for (Dtype dtype : {Dtype::F32, Dtype::BF16})
      for (int64_t n : {7, 1000, 32000}) {
        auto kernel = compile(name, dtype, n, true, "sm_90");
        ASSERT_TRUE(kernel);
        const TileConfig &tile = kernel->info.tile;
        ASSERT_GT(tile.blocksPerSM, 0);
        // One folded block per SM (the emulator, told no registers, fits
        // the tile's blocks per SM in it), or the one block that fits where
        // it takes the SM's shared memory (n = 32000: staged chunks).
        bool folded = foldsResidentBlocks(tile);
        EXPECT_EQ(folded, n < 32000);
        int64_t fold = folded ? maxFoldedBlocks(tile) : 1;
        int64_t blocks = 2;
        int64_t rows = tile.blocksPerSM * 2 * tile.rowsPerBlock * 3 + 5;
        emulator::takeLaunches();
        check(*driver, "sm_90", {name, dtype, n, rows, true});
        std::vector<emulator::LaunchRecord> launches = emulator::takeLaunches();
        ASSERT_EQ(launches.size(), 2u) << "the kernel, then its finalize";
        EXPECT_EQ(launches[0].grid[0], blocks);
        EXPECT_EQ(launches[0].block[0], fold * tile.threadsPerBlock());
        EXPECT_LT(launches[0].grid[0] * tile.rowsPerBlock * fold, rows);
        // Each block writes its partials once (they stay on chip across its
        // rows; its row groups' combined), except layer_norm_bwd's at n =
        // 32000: two partials of 128 KiB per block do not both fit, and the
        // columns of the chunks that do not are read-modified-written in
        // global memory for every row (initialized once). The finalize
        // reads a row of partials per block once and writes each column
        // result once.
        bool allOnChip = n < 32000 || name == std::string("rms_norm_bwd");
        EXPECT_EQ(tile.partialChunks == tile.chunks, allOnChip);
        ASSERT_GT(tile.partialChunks, 0);
        uint64_t partialRows = blocks; // partials on chip: a row per block
        uint64_t onChipColumns = std::min<int64_t>(
            n, tile.partialChunks * tile.threadsPerRow * tile.vectorWidth);
        uint64_t offChipColumns = n - onChipColumns;
        EXPECT_EQ(offChipColumns > 0, !allOnChip);
        for (const emulator::BufferTraffic &buffer : launches[0].buffers)
          if (llvm::StringRef(buffer.name).ends_with("partials")) {
            SCOPED_TRACE(buffer.name);
            EXPECT_EQ(buffer.loadedBytes, rows * offChipColumns * 4);
            EXPECT_EQ(buffer.storedBytes,
                      (partialRows + rows) * offChipColumns * 4 +
                          partialRows * onChipColumns * 4);
          }
        // A row group whose row is past the last and a vector past a row's
        // end load nothing (predicated): a row kept on chip reads each
        // element of the full inputs once.
        if (n < 32000)
          for (const emulator::BufferTraffic &buffer : launches[0].buffers)
            if (buffer.name == "x" || buffer.name == "dy") {
              SCOPED_TRACE(buffer.name);
              EXPECT_EQ(buffer.loadedBytes,
                        uint64_t(rows * n) * elementBytes(dtypeName(dtype)));
            }
        EXPECT_EQ(launches[1].buffers.size(),
                  name == std::string("rms_norm_bwd") ? 2u : 4u)
            << "each column output and its partials";
        for (const emulator::BufferTraffic &buffer : launches[1].buffers) {
          SCOPED_TRACE(buffer.name);
          bool partials = llvm::StringRef(buffer.name).ends_with("partials");
          EXPECT_EQ(buffer.loadedBytes, partials ? partialRows * n * 4 : 0);
          EXPECT_EQ(buffer.storedBytes,
                    partials ? 0 : n * elementBytes(dtypeName(dtype)));
        }
      }
}

/// A full persistent grid's partial rows: each finalize slice combines its
/// share in groups of 16 partial rows, the last group's loads predicated on
/// the row being in the share, so each partial is read once and, in the
/// emulator's count, each group takes one round trip to memory (the rows
/// left over do not take one each).
TEST_F(EmulatedNumerics, FinalizeReadsEachPartialOnceInGroups) {
  // Twice an H200's SMs: a folded grid (one block per SM) leaves shares of
  // more than a group.
  constexpr int kSMs = 264;
  auto driver = driverFor("sm_90", kSMs);
  ASSERT_TRUE(driver);
  for (const char *name : {"rms_norm_bwd", "layer_norm_bwd"})
    for (int64_t n : {4096, 8192}) {
      SCOPED_TRACE(n);
      auto kernel = compile(name, Dtype::F32, n, true, "sm_90");
      ASSERT_TRUE(kernel);
      const TileConfig &tile = kernel->info.tile;
      int64_t rows = tile.blocksPerSM * kSMs * tile.rowsPerBlock + 3;
      emulator::takeLaunches();
      emulator::setTrafficDetail(true);
      check(*driver, "sm_90", {name, Dtype::F32, n, rows, true});
      emulator::setTrafficDetail(false);
      std::vector<emulator::LaunchRecord> launches = emulator::takeLaunches();
      ASSERT_EQ(launches.size(), 2u);
      int64_t partialRows = launches[0].grid[0];
      int64_t slices = finalizeSlices(n);
      int64_t share = llvm::divideCeil(partialRows, slices);
      EXPECT_GT(share, kFinalizeGroup);
      EXPECT_NE(share % kFinalizeGroup, 0);
      for (const emulator::BufferTraffic &buffer : launches[1].buffers) {
        bool partials = llvm::StringRef(buffer.name).ends_with("partials");
        EXPECT_EQ(buffer.loadedBytes,
                  partials ? uint64_t(partialRows * n * 4) : 0u);
      }
      int64_t groups = 0;
      for (int64_t slice = 0; slice < slices; ++slice)
        groups += llvm::divideCeil(
            std::clamp<int64_t>(partialRows - slice * share, 0, share),
            kFinalizeGroup);
      EXPECT_EQ(launches[1].loadRoundTrips, uint64_t(groups * n));
    }
}

/// NaN and Inf propagate as in PyTorch (see CpuNumericsTest).
TEST_F(EmulatedNumerics, NaNAndInfPropagate) {
  auto driver = driverFor("sm_90");
  ASSERT_TRUE(driver);
  for (const auto &[name, reference] : references()) {
    SCOPED_TRACE(name);
    int64_t n = 64, rows = 7;
    auto kernel = compile(name, Dtype::F32, n, true, "sm_90");
    ASSERT_TRUE(kernel);
    Values in = makeInputs(kernel->info, rows, /*seed=*/3);
    addNaNAndInf(kernel->info, in);
    Values actual = run(*driver, kernel, in, rows, true);
    expectMatchesReference(kernel->info, reference, in, actual, rows);
  }
}

/// Cross-entropy on masked logits (see CpuNumericsTest).
TEST_F(EmulatedNumerics, CrossEntropyMaskedLogits) {
  auto driver = driverFor("sm_90");
  ASSERT_TRUE(driver);
  for (const auto &[name, reference] : references()) {
    if (name.rfind("cross_entropy", 0) != 0)
      continue;
    int64_t n = 64, rows = 7;
    auto kernel = compile(name, Dtype::F32, n, true, "sm_90");
    ASSERT_TRUE(kernel);
    for (double smoothing : {0.0, 0.1}) {
      SCOPED_TRACE(name + " label_smoothing=" + std::to_string(smoothing));
      Values in = makeInputs(kernel->info, rows, /*seed=*/5);
      maskHalfOfEachRow(kernel->info, in, rows, smoothing);
      Values actual = run(*driver, kernel, in, rows, true);
      expectMatchesReference(kernel->info, reference, in, actual, rows);
    }
  }
}

/// The counters add up: an elementwise kernel reads each input once and
/// writes its output once, in 16-byte accesses; a row reduction shuffles
/// and synchronizes.
TEST_F(EmulatedNumerics, CountersMatchTheKernelsTraffic) {
  auto driver = driverFor("sm_90");
  ASSERT_TRUE(driver);
  int64_t n = 4096, rows = 6;
  auto swiglu = compile("swiglu_fwd", Dtype::BF16, n, true, "sm_90");
  ASSERT_TRUE(swiglu);
  emulator::takeLaunches();
  Values in = makeInputs(swiglu->info, rows, 1);
  run(*driver, swiglu, in, rows, true);
  std::vector<emulator::LaunchRecord> launches = emulator::takeLaunches();
  ASSERT_EQ(launches.size(), 1u);
  const emulator::LaunchRecord &record = launches[0];
  EXPECT_EQ(record.kernel, "swiglu_fwd");
  EXPECT_EQ(record.chip, "sm_90");
  ASSERT_EQ(record.buffers.size(), 3u);
  uint64_t bytes = rows * n * 2;
  for (const emulator::BufferTraffic &buffer : record.buffers) {
    bool output = buffer.name == "c";
    EXPECT_EQ(buffer.loadedBytes, output ? 0 : bytes) << buffer.name;
    EXPECT_EQ(buffer.storedBytes, output ? bytes : 0) << buffer.name;
    EXPECT_EQ((output ? buffer.stores : buffer.loads) * 16, bytes)
        << buffer.name << ": 16-byte accesses";
  }
  EXPECT_EQ(record.barriers, 0u);
  EXPECT_GT(record.instructions[size_t(emulator::InstructionClass::Memory)],
            0u);

  auto rmsNorm = compile("rms_norm_fwd", Dtype::F32, n, true, "sm_90");
  ASSERT_TRUE(rmsNorm);
  in = makeInputs(rmsNorm->info, rows, 2);
  run(*driver, rmsNorm, in, rows, true);
  launches = emulator::takeLaunches();
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_GT(launches[0].shuffles, 0u);
  EXPECT_GT(launches[0].barriers, 0u);
  EXPECT_GT(launches[0].instructions[size_t(
                emulator::InstructionClass::Transcendental)],
            0u)
      << "rsqrt.approx";
}

} // namespace
