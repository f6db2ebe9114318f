//===- CudaDriverTest.cpp - the CUDA launch path against a fake driver ----===//
//
// Loads the fake libcuda (FakeCudaDriver.cpp) the way the real one is
// loaded and checks what CudaDriver asks of it: per-context module loads,
// grid and block, every parameter of KernelABI.h in order, the finalize
// launch of column reductions, and errors that name the call and kernel.
//
//===----------------------------------------------------------------------===//

#include "FakeCudaDriver.h"

#include "tilefuse/Kernels/Builtins.h"
#include "tilefuse/Runtime/CudaDriver.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

using namespace tilefuse;

namespace {

class CudaDriverTest : public ::testing::Test {
protected:
  void SetUp() override {
    fakeCudaState() = FakeCudaState();
    auto loaded = CudaDriver::load(TILEFUSE_FAKE_CUDA_DRIVER);
    ASSERT_TRUE(static_cast<bool>(loaded)) << llvm::toString(loaded.takeError());
    driver = std::move(*loaded);
  }

  std::shared_ptr<const GpuKernel> kernel(llvm::StringRef name,
                                          llvm::StringRef dtype, int64_t n) {
    auto module = kernels::buildBuiltin(runtime.context(), name);
    EXPECT_TRUE(mlir::succeeded(module));
    CompileOptions options;
    options.dtype = dtype.str();
    options.n = n;
    options.target = "sm_90";
    auto compiled = runtime.getGpuKernel(**module, options);
    EXPECT_TRUE(static_cast<bool>(compiled))
        << llvm::toString(compiled.takeError());
    return *compiled;
  }

  static uint64_t bits(float value) {
    uint64_t slot = 0;
    std::memcpy(&slot, &value, sizeof(value));
    return slot;
  }

  /// Launches rms_norm_bwd with dy, x, weight, rstd at 0x10-0x40, the
  /// offset scalar from `offsetSlot`, dx at 0x50, dweight at 0x60 and its
  /// partials at 0x70.
  llvm::Error launchRmsNormBwd(std::shared_ptr<const GpuKernel> backward,
                               int64_t rows, uint64_t &offsetSlot) {
    fakeCudaState().paramsPerLaunch = {8, 4};
    std::vector<void *> arguments;
    for (uint64_t pointer : {0x10, 0x20, 0x30, 0x40})
      arguments.push_back(reinterpret_cast<void *>(pointer));
    arguments.push_back(&offsetSlot);
    for (uint64_t pointer : {0x50, 0x60})
      arguments.push_back(reinterpret_cast<void *>(pointer));
    std::vector<void *> workspaces = {reinterpret_cast<void *>(0x70)};
    return driver->launch(backward, arguments, workspaces, rows, 0, nullptr);
  }

  Runtime runtime{std::nullopt};
  std::unique_ptr<CudaDriver> driver;
};

TEST_F(CudaDriverTest, MissingLibraryIsAnError) {
  auto loaded = CudaDriver::load("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(static_cast<bool>(loaded));
  EXPECT_NE(llvm::toString(loaded.takeError())
                .find("the CUDA driver (/nonexistent/libcuda.so.1) was not found"),
            std::string::npos);
}

TEST_F(CudaDriverTest, TargetFromComputeCapability) {
  auto target = driver->target(0);
  ASSERT_TRUE(static_cast<bool>(target));
  EXPECT_EQ(*target, "sm_90");

  fakeCudaState().major = 7;
  fakeCudaState().minor = 5;
  auto turing = CudaDriver::load(TILEFUSE_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(static_cast<bool>(turing));
  auto unsupported = (*turing)->target(0);
  ASSERT_FALSE(static_cast<bool>(unsupported));
  EXPECT_NE(llvm::toString(unsupported.takeError())
                .find("compute capability 7.5 is not supported"),
            std::string::npos);
}

TEST_F(CudaDriverTest, RowProgramParametersInABIOrder) {
  auto rmsNorm = kernel("rms_norm_fwd", "bf16", 4096);
  const TileConfig &tile = rmsNorm->info.tile;
  fakeCudaState().paramsPerLaunch = {7};
  float epsilon = 1e-6f, offset = 1.0f;
  uint64_t epsSlot = bits(epsilon), offsetSlot = bits(offset);
  std::vector<void *> arguments = {
      reinterpret_cast<void *>(0x1000), reinterpret_cast<void *>(0x2000),
      &epsSlot, &offsetSlot, reinterpret_cast<void *>(0x3000),
      reinterpret_cast<void *>(0x4000)};
  void *stream = reinterpret_cast<void *>(77);
  ASSERT_FALSE(static_cast<bool>(driver->launch(rmsNorm, arguments, {}, 5, 0, stream)));

  ASSERT_EQ(fakeCudaState().launches.size(), 1u);
  const FakeCudaState::Launch &launch = fakeCudaState().launches[0];
  EXPECT_EQ(launch.function, "rms_norm_fwd");
  EXPECT_EQ(launch.stream, stream);
  EXPECT_EQ(launch.grid, (5 + tile.rowsPerBlock - 1) / tile.rowsPerBlock);
  EXPECT_EQ(launch.block, tile.threadsPerRow * tile.rowsPerBlock);
  EXPECT_EQ(launch.params,
            (std::vector<uint64_t>{0x1000, 0x2000, bits(epsilon), bits(offset),
                                   0x3000, 0x4000, 5}));
  EXPECT_EQ(fakeCudaState().lastImage, rmsNorm->ptx);
}

/// Launches rms_norm_fwd bf16 n = 4096 (256-thread blocks: the goal is 4
/// per SM) once; what was launched and how many modules stayed loaded.
static void launchRmsNormFwd(CudaDriver &driver,
                             std::shared_ptr<const GpuKernel> forward) {
  fakeCudaState().paramsPerLaunch = {7};
  uint64_t epsSlot = 0, offsetSlot = 0;
  std::vector<void *> arguments = {reinterpret_cast<void *>(0x1000),
                                   reinterpret_cast<void *>(0x2000),
                                   &epsSlot,
                                   &offsetSlot,
                                   reinterpret_cast<void *>(0x3000),
                                   reinterpret_cast<void *>(0x4000)};
  ASSERT_FALSE(
      static_cast<bool>(driver.launch(forward, arguments, {}, 5, 0, nullptr)));
}

TEST_F(CudaDriverTest, RaisesOccupancyWhenNothingSpills) {
  auto forward = kernel("rms_norm_fwd", "bf16", 4096);
  ASSERT_EQ(blocksPerSMGoal(forward->info.tile), 4);
  fakeCudaState().residentBlocks = 3;
  launchRmsNormFwd(*driver, forward);
  // Loaded twice, the second time asking for 4 blocks; that one launched.
  ASSERT_EQ(fakeCudaState().modulesLoaded, 2);
  EXPECT_EQ(fakeCudaState().unloadedModules, (std::vector<size_t>{1}));
  ASSERT_EQ(fakeCudaState().asked, (std::vector<int>{0, 4}));
  EXPECT_NE(
      fakeCudaState().lastImage.find(".maxntid 256, 1, 1\n.minnctapersm 4\n{"),
      std::string::npos);
  ASSERT_EQ(fakeCudaState().launches.size(), 1u);
  EXPECT_EQ(fakeCudaState().launches[0].handle, 2u); // the asking module's
  ASSERT_EQ(fakeCudaState().occupancyQueries.size(), 2u);
  for (const FakeCudaState::OccupancyQuery &query :
       fakeCudaState().occupancyQueries) {
    EXPECT_EQ(query.blockSize, 256);
    EXPECT_EQ(query.dynamicSharedBytes, 0u);
  }
}

TEST_F(CudaDriverTest, AFailedSecondJitKeepsThePlainKernel) {
  fakeCudaState().residentBlocks = 3;
  fakeCudaState().loadResultWhenAsked = 1; // CUDA_ERROR_INVALID_VALUE
  launchRmsNormFwd(*driver, kernel("rms_norm_fwd", "bf16", 4096));
  EXPECT_EQ(fakeCudaState().loadAttempts, 2); // tried, failed
  EXPECT_EQ(fakeCudaState().modulesLoaded, 1);
  EXPECT_EQ(fakeCudaState().modulesUnloaded, 0);
  ASSERT_EQ(fakeCudaState().launches.size(), 1u);
  EXPECT_EQ(fakeCudaState().launches[0].handle, 1u);
}

TEST_F(CudaDriverTest, AsksForOneMoreBlockWhereTheGoalSpills) {
  auto forward = kernel("rms_norm_fwd", "bf16", 4096);
  fakeCudaState().residentBlocks = 2;
  fakeCudaState().localBytesWhenAsked = {{4, 24}};
  launchRmsNormFwd(*driver, forward);
  ASSERT_EQ(fakeCudaState().asked, (std::vector<int>{0, 4, 3}));
  // The spilling module, then the plain one.
  EXPECT_EQ(fakeCudaState().unloadedModules, (std::vector<size_t>{2, 1}));
  ASSERT_EQ(fakeCudaState().launches.size(), 1u);
  EXPECT_EQ(fakeCudaState().launches[0].handle, 3u);
}

TEST_F(CudaDriverTest, KeepsThePlainKernelWhenAskingSpillsOrGainsNothing) {
  struct Case {
    int plain, whenAsked;
    std::map<int, int> spills;
    std::vector<int> asked;
  };
  for (const Case &c : {
           Case{3, 0, {{4, 16}}, {0, 4}},            // the goal spills
           Case{2, 0, {{4, 16}, {3, 8}}, {0, 4, 3}}, // so does one more
           Case{3, 3, {}, {0, 4}},                   // no more fit
           Case{2, 2, {}, {0, 4}}, // none spilled: fewer cannot fit more
           Case{4, 0, {}, {0}},    // enough fit already
       }) {
    ASSERT_NO_FATAL_FAILURE(SetUp());
    fakeCudaState().residentBlocks = c.plain;
    fakeCudaState().residentBlocksWhenAsked = c.whenAsked;
    fakeCudaState().localBytesWhenAsked = c.spills;
    launchRmsNormFwd(*driver, kernel("rms_norm_fwd", "bf16", 4096));
    EXPECT_EQ(fakeCudaState().asked, c.asked) << c.plain;
    // Each asking module, never the plain one (handle 1).
    std::vector<size_t> asking;
    for (size_t module = 2; module <= c.asked.size(); ++module)
      asking.push_back(module);
    EXPECT_EQ(fakeCudaState().unloadedModules, asking) << c.plain;
    ASSERT_EQ(fakeCudaState().launches.size(), 1u);
    EXPECT_EQ(fakeCudaState().launches[0].handle, 1u) << c.plain;
  }
}

TEST_F(CudaDriverTest, ColumnReductionLaunchesFinalize) {
  auto backward = kernel("rms_norm_bwd", "f32", 8192);
  const TileConfig &tile = backward->info.tile;
  ASSERT_GT(tile.blocksPerSM, 0) << "column reductions use a persistent grid";
  int64_t rows = 100000;
  auto groups = driver->partialRows(backward, rows, 0);
  ASSERT_TRUE(static_cast<bool>(groups));
  // Its partials stay on chip: the blocks an SM holds fold into one
  // (foldsResidentBlocks), which writes one row of partials.
  ASSERT_TRUE(foldsResidentBlocks(tile));
  int64_t fold = maxFoldedBlocks(tile);
  int64_t blocks = 132;
  EXPECT_EQ(*groups, blocks);

  uint64_t offsetSlot = bits(0.0f);
  ASSERT_FALSE(static_cast<bool>(launchRmsNormBwd(backward, rows, offsetSlot)));

  ASSERT_EQ(fakeCudaState().launches.size(), 2u);
  const FakeCudaState::Launch &main = fakeCudaState().launches[0];
  EXPECT_EQ(main.function, "rms_norm_bwd");
  EXPECT_EQ(main.grid, blocks);
  EXPECT_EQ(main.block, fold * tile.threadsPerBlock());
  // dweight's slot holds the partials workspace.
  EXPECT_EQ(main.params, (std::vector<uint64_t>{0x10, 0x20, 0x30, 0x40,
                                                offsetSlot, 0x50, 0x70,
                                                uint64_t(rows)}));
  const FakeCudaState::Launch &finalize = fakeCudaState().launches[1];
  EXPECT_EQ(finalize.function, "rms_norm_bwd_finalize");
  EXPECT_EQ(finalize.grid, 8192u / 32u); // 32 columns a block, 8 threads each
  EXPECT_EQ(finalize.block, 256u);
  EXPECT_EQ(finalize.params, (std::vector<uint64_t>{0x70, 0x60, uint64_t(*groups),
                                                    uint64_t(rows)}));
}

TEST_F(CudaDriverTest, PersistentGridTakesOnlyResidentBlocks) {
  // The tile asks for 2 blocks per SM; the driver says 1 fits (a staged
  // row's shared memory): 1 per SM, and as many rows of partials.
  auto backward = kernel("rms_norm_bwd", "bf16", 32000);
  const TileConfig &tile = backward->info.tile;
  ASSERT_EQ(tile.blocksPerSM, 2);
  ASSERT_EQ(tile.partialChunks, tile.chunks);
  ASSERT_FALSE(foldsResidentBlocks(tile)) << "it stages its row";
  fakeCudaState().residentBlocks = 1;
  auto groups = driver->partialRows(backward, 100000, 0);
  ASSERT_TRUE(static_cast<bool>(groups));
  EXPECT_EQ(*groups, 132);
  ASSERT_EQ(fakeCudaState().occupancyQueries.size(), 1u);
  const FakeCudaState::OccupancyQuery &query =
      fakeCudaState().occupancyQueries[0];
  EXPECT_EQ(query.function, "rms_norm_bwd");
  EXPECT_EQ(query.blockSize, tile.threadsPerRow * tile.rowsPerBlock);
  EXPECT_EQ(query.dynamicSharedBytes, uint64_t(tile.stageBytes));

  uint64_t offsetSlot = bits(0.0f);
  ASSERT_FALSE(
      static_cast<bool>(launchRmsNormBwd(backward, 100000, offsetSlot)));
  ASSERT_EQ(fakeCudaState().launches.size(), 2u);
  EXPECT_EQ(fakeCudaState().launches[0].grid, 132u);
  EXPECT_EQ(fakeCudaState().launches[1].params[2], uint64_t(*groups));
  // Asked once per loaded kernel; more resident blocks than the tile asks
  // for get the tile's, and a driver that says none fit gets one block per
  // SM, never an empty grid (a kernel that folds its blocks loads again
  // bounded to its block size first: PlainBlockThatFitsNoSM).
  EXPECT_EQ(fakeCudaState().occupancyQueries.size(), 1u);
  // (Folded, ResidentBlocksFoldIntoOne: the tile's 2 blocks of 256 in one
  // block, though 3 would fit.)
  fakeCudaState().residentBlocks = 3;
  auto capped =
      driver->partialRows(kernel("rms_norm_bwd", "f32", 4096), 100000, 0);
  ASSERT_TRUE(static_cast<bool>(capped));
  EXPECT_EQ(*capped, 132);
  EXPECT_EQ(fakeCudaState().bounded.end()[-2], 2 * 256)
      << "the kernel kept (then its finalize)";
  fakeCudaState().residentBlocks = 0;
  auto other = kernel("rms_norm_bwd", "bf16", 32000);
  ASSERT_FALSE(foldsResidentBlocks(other->info.tile)) << "it stages its row";
  auto fewest = driver->partialRows(other, 100000, 0);
  ASSERT_TRUE(static_cast<bool>(fewest));
  EXPECT_EQ(*fewest, 132);
}

TEST_F(CudaDriverTest, PlainBlockThatFitsNoSM) {
  // A folding kernel's PTX has no block size, so ptxas chooses its
  // registers freely: layer_norm_bwd f32 n = 12288 took 136 a thread, and
  // no block of 512 threads fit an SM. Where no folded block fits either,
  // the kernel loads bounded to its own block size (.maxntid 512), kept
  // even though it spills: it is the one that launches.
  auto backward = kernel("rms_norm_bwd", "f32", 12288);
  const TileConfig &tile = backward->info.tile;
  ASSERT_TRUE(foldsResidentBlocks(tile));
  ASSERT_EQ(tile.threadsPerBlock(), 512);
  ASSERT_EQ(maxFoldedBlocks(tile), 2);
  fakeCudaState().residentBlocks = 0;
  fakeCudaState().residentBlocksWhenBounded = {{1024, 1}, {512, 2}};
  fakeCudaState().localBytesWhenBounded = {{1024, 16}, {512, 4}};
  auto groups = driver->partialRows(backward, 100000, 0);
  ASSERT_TRUE(static_cast<bool>(groups)) << llvm::toString(groups.takeError());
  EXPECT_EQ(*groups, 2 * 132) << "as many blocks as the bounded module fits";
  EXPECT_EQ(fakeCudaState().bounded, (std::vector<int>{0, 1024, 512, 256}))
      << "the plain kernel, the two tried, then the finalize";
  uint64_t offsetSlot = bits(0.0f);
  ASSERT_FALSE(
      static_cast<bool>(launchRmsNormBwd(backward, 100000, offsetSlot)));
  EXPECT_EQ(fakeCudaState().launches[0].block, 512u);
  EXPECT_EQ(fakeCudaState().launches[0].handle, 3u) << "the bounded module";

  // Where not even that fits, a clear error rather than a launch failure.
  fakeCudaState().residentBlocksWhenBounded.clear();
  auto none =
      driver->partialRows(kernel("layer_norm_bwd", "f32", 12288), 100000, 0);
  ASSERT_FALSE(static_cast<bool>(none));
  EXPECT_NE(llvm::toString(none.takeError())
                .find("layer_norm_bwd: no block of 512 threads fits on an SM"),
            std::string::npos);
}

TEST_F(CudaDriverTest, ResidentBlocksFoldIntoOne) {
  // rms_norm_bwd bf16 n = 4096 asks for 4 blocks of 256 threads per SM.
  // The runtime loads its PTX again with `.maxntid 1024`, which spills
  // here, then with 768, which does not: one block of 3 row groups per SM,
  // 3 blocks' shared memory, one row of partials per block.
  auto backward = kernel("rms_norm_bwd", "bf16", 4096);
  const TileConfig &tile = backward->info.tile;
  ASSERT_EQ(tile.blocksPerSM, 4);
  ASSERT_EQ(tile.threadsPerBlock(), 256);
  ASSERT_TRUE(foldsResidentBlocks(tile));
  fakeCudaState().localBytesWhenBounded = {{1024, 16}};
  auto groups = driver->partialRows(backward, 100000, 0);
  ASSERT_TRUE(static_cast<bool>(groups));
  EXPECT_EQ(*groups, 132);
  EXPECT_EQ(fakeCudaState().bounded, (std::vector<int>{0, 1024, 768, 256}))
      << "the plain kernel, the two tried, then the finalize";
  EXPECT_EQ(fakeCudaState().unloadedModules, (std::vector<size_t>{2, 1}))
      << "the spilling module, then the plain one";
  uint64_t offsetSlot = bits(0.0f);
  ASSERT_FALSE(
      static_cast<bool>(launchRmsNormBwd(backward, 100000, offsetSlot)));
  ASSERT_EQ(fakeCudaState().launches.size(), 2u);
  const FakeCudaState::Launch &main = fakeCudaState().launches[0];
  EXPECT_EQ(main.handle, 3u);
  EXPECT_EQ(main.grid, 132u);
  EXPECT_EQ(main.block, 768u);
  EXPECT_EQ(main.dynamicSharedBytes, 3u * tile.stageBytes);
  // The kept kernel may opt into that much (function handle 3).
  EXPECT_TRUE(llvm::any_of(fakeCudaState().sharedOptIns,
                           [&](const FakeCudaState::Attribute &optIn) {
                             return optIn.function == "rms_norm_bwd" &&
                                    optIn.value == 3 * tile.stageBytes;
                           }));
  EXPECT_EQ(fakeCudaState().launches[1].params[2], 132u);
  // Where every larger block spills, the blocks stay apart.
  fakeCudaState().residentBlocks = 2;
  fakeCudaState().localBytesWhenBounded = {{1024, 16}, {768, 8}, {512, 4}};
  auto apart =
      driver->partialRows(kernel("layer_norm_bwd", "bf16", 4096), 100000, 0);
  ASSERT_TRUE(static_cast<bool>(apart));
  EXPECT_EQ(*apart, 2 * 132);
}

TEST_F(CudaDriverTest, FinalizeLaunchesAlone) {
  // Over any number of partial rows (a benchmark's whole launch's), with
  // the same parameters launch passes it.
  auto backward = kernel("layer_norm_bwd", "f32", 4096);
  fakeCudaState().paramsPerLaunch = {6};
  std::vector<void *> workspaces = {reinterpret_cast<void *>(0x70),
                                    reinterpret_cast<void *>(0x80)};
  std::vector<void *> outputs = {reinterpret_cast<void *>(0x50),
                                 reinterpret_cast<void *>(0x60)};
  ASSERT_FALSE(static_cast<bool>(driver->launchFinalize(
      backward, workspaces, outputs, 528, 8192, 0, nullptr)));
  ASSERT_EQ(fakeCudaState().launches.size(), 1u);
  const FakeCudaState::Launch &finalize = fakeCudaState().launches[0];
  EXPECT_EQ(finalize.function, "layer_norm_bwd_finalize");
  // 16 columns a block at n = 4096: 256 blocks (KernelABI.h).
  EXPECT_EQ(finalize.grid, 4096u / 16u);
  EXPECT_EQ(finalize.params,
            (std::vector<uint64_t>{0x70, 0x50, 0x80, 0x60, 528, 8192}));

  llvm::Error mismatched = driver->launchFinalize(
      backward, workspaces, {outputs[0]}, 528, 8192, 0, nullptr);
  ASSERT_TRUE(static_cast<bool>(mismatched));
  EXPECT_NE(llvm::toString(std::move(mismatched))
                .find("got 2 workspaces, 1 outputs"),
            std::string::npos);
  llvm::Error none = driver->launchFinalize(kernel("swiglu_fwd", "f32", 4096),
                                            {}, {}, 1, 1, 0, nullptr);
  ASSERT_TRUE(static_cast<bool>(none));
  EXPECT_NE(llvm::toString(std::move(none))
                .find("swiglu_fwd has no column reduction to finalize"),
            std::string::npos);
}

TEST_F(CudaDriverTest, StagedRowOptsIntoItsDynamicSharedMemory) {
  // f32 n = 32000 streams (16 chunks of 512 threads x 4 lanes) and reads x
  // twice: the whole row is staged, past the default 48 KiB.
  auto staged = kernel("rms_norm_fwd", "f32", 32000);
  EXPECT_EQ(staged->info.tile.stagedChunks, 16);
  EXPECT_EQ(staged->info.tile.stageBytes, 16 * 512 * 4 * 4);
  fakeCudaState().paramsPerLaunch = {7, 7};
  float epsilon = 1e-6f, offset = 0.0f;
  uint64_t epsSlot = bits(epsilon), offsetSlot = bits(offset);
  std::vector<void *> arguments = {
      reinterpret_cast<void *>(0x1000), reinterpret_cast<void *>(0x2000),
      &epsSlot, &offsetSlot, reinterpret_cast<void *>(0x3000),
      reinterpret_cast<void *>(0x4000)};
  ASSERT_FALSE(static_cast<bool>(
      driver->launch(staged, arguments, {}, 3, 0, nullptr)));
  ASSERT_EQ(fakeCudaState().sharedOptIns.size(), 1u);
  EXPECT_EQ(fakeCudaState().sharedOptIns[0].function, "rms_norm_fwd");
  EXPECT_EQ(fakeCudaState().sharedOptIns[0].attribute,
            8); // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  EXPECT_EQ(fakeCudaState().sharedOptIns[0].value, 131072);
  ASSERT_EQ(fakeCudaState().launches.size(), 1u);
  EXPECT_EQ(fakeCudaState().launches[0].dynamicSharedBytes, 131072u);

  // A row that stays in registers stages nothing and opts into nothing.
  auto onChip = kernel("rms_norm_fwd", "f32", 1000);
  EXPECT_EQ(onChip->info.tile.stageBytes, 0);
  ASSERT_FALSE(static_cast<bool>(
      driver->launch(onChip, arguments, {}, 3, 0, nullptr)));
  EXPECT_EQ(fakeCudaState().sharedOptIns.size(), 1u);
  ASSERT_EQ(fakeCudaState().launches.size(), 2u);
  EXPECT_EQ(fakeCudaState().launches[1].dynamicSharedBytes, 0u);
}

TEST_F(CudaDriverTest, ModulesLoadOncePerContext) {
  auto swiglu = kernel("swiglu_fwd", "f32", 1024);
  fakeCudaState().paramsPerLaunch = {4, 4, 4};
  std::vector<void *> arguments(3, reinterpret_cast<void *>(0x100));
  for (int i = 0; i < 2; ++i)
    ASSERT_FALSE(static_cast<bool>(driver->launch(swiglu, arguments, {}, 1, 0, nullptr)));
  EXPECT_EQ(fakeCudaState().modulesLoaded, 1);
  fakeCudaState().context = reinterpret_cast<void *>(0x2);
  ASSERT_FALSE(static_cast<bool>(driver->launch(swiglu, arguments, {}, 1, 0, nullptr)));
  EXPECT_EQ(fakeCudaState().modulesLoaded, 2);
  // Loaded modules keep their kernel: its address never names another one.
  EXPECT_GT(swiglu.use_count(), 1);
}

TEST_F(CudaDriverTest, BindsThePrimaryContextOnAThreadWithNone) {
  auto swiglu = kernel("swiglu_fwd", "f32", 1024);
  fakeCudaState().paramsPerLaunch = {4, 4};
  fakeCudaState().context = nullptr;
  std::vector<void *> arguments(3, reinterpret_cast<void *>(0x100));
  for (int i = 0; i < 2; ++i)
    ASSERT_FALSE(static_cast<bool>(driver->launch(swiglu, arguments, {}, 1, 0, nullptr)));
  EXPECT_EQ(fakeCudaState().context, fakeCudaState().primaryContext);
  EXPECT_EQ(fakeCudaState().primaryRetains, 1);
  EXPECT_EQ(fakeCudaState().launches.size(), 2u);
}

TEST_F(CudaDriverTest, ErrorsNameTheCallAndKernel) {
  auto swiglu = kernel("swiglu_fwd", "f32", 1024);
  fakeCudaState().paramsPerLaunch = {4};
  fakeCudaState().launchResult = 1;
  std::vector<void *> arguments(3, reinterpret_cast<void *>(0x100));
  llvm::Error error = driver->launch(swiglu, arguments, {}, 1, 0, nullptr);
  EXPECT_EQ(llvm::toString(std::move(error)),
            "cuLaunchKernel failed for kernel swiglu_fwd: "
            "CUDA_ERROR_INVALID_VALUE (invalid argument)");

  std::vector<void *> tooFew(2, nullptr);
  error = driver->launch(swiglu, tooFew, {}, 1, 0, nullptr);
  EXPECT_NE(llvm::toString(std::move(error)).find("expected 3 arguments"),
            std::string::npos);
}

TEST_F(CudaDriverTest, PtxJitFailureCarriesTheJitLog) {
  auto swiglu = kernel("swiglu_fwd", "f32", 1024);
  fakeCudaState().loadResult = 1;
  fakeCudaState().jitErrorLog = "ptxas application ptx input, line 7; error";
  std::vector<void *> arguments(3, reinterpret_cast<void *>(0x100));
  llvm::Error error = driver->launch(swiglu, arguments, {}, 1, 0, nullptr);
  EXPECT_EQ(llvm::toString(std::move(error)),
            "cuModuleLoadDataEx failed for kernel swiglu_fwd: "
            "CUDA_ERROR_INVALID_VALUE (invalid argument)\nPTX JIT log:\n"
            "ptxas application ptx input, line 7; error");
}

} // namespace
