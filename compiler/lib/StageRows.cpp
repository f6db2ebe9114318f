//===- StageRows.cpp - keep a streamed row's re-read inputs on chip -------===//
//
// Chooses what a block keeps in dynamic shared memory (TileConfig.h): its
// column partials, and chunks of each re-read full input of a streamed row.
// It runs after the passes that change how many times a row is read
// (fuse-merge-reductions), so that a row read once is not staged.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Passes.h"
#include "tilefuse/Compiler/TileConfig.h"

namespace tilefuse {
#define GEN_PASS_DEF_FUSESTAGEROWS
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace {

Type elementType(BlockArgument input) {
  return cast<ValueType>(input.getType()).getElementType();
}

/// The bytes `chunks` chunks per thread of every column partial take per
/// block.
int64_t partialBytes(KernelOp kernel, const TileConfig &config,
                     int64_t chunks) {
  int64_t bytes = 0;
  kernel.walk([&](ReduceOp reduce) {
    if (!reduce.isRowReduction())
      bytes += sharedRegionBytes(
          config, chunks,
          cast<ValueType>(reduce.getInput().getType()).getElementType());
  });
  return bytes * config.rowsPerBlock;
}

/// The bytes the staged chunks of `reread` take per block.
int64_t stagedBytes(const TileConfig &config, ArrayRef<BlockArgument> reread) {
  int64_t bytes = 0;
  for (BlockArgument input : reread)
    bytes += sharedRegionBytes(config, config.stagedChunks, elementType(input));
  return bytes * config.rowsPerBlock;
}

struct FuseStageRowsPass
    : tilefuse::impl::FuseStageRowsBase<FuseStageRowsPass> {
  void runOnOperation() override {
    KernelOp kernel = getOperation();
    FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
    FailureOr<KernelShape> shape = getKernelShape(kernel);
    if (failed(config) || failed(shape))
      return signalPassFailure();
    config->stagedChunks = config->stageBytes = 0;
    config->partialChunks = 0;
    if (config->isGPU() && !shape->multiTensor)
      choose(kernel, *shape, *config);
    kernel->setAttr("fuse.tile", config->toAttr(&getContext()));
  }

  void choose(KernelOp kernel, const KernelShape &shape, TileConfig &config) {
    int64_t budget = maxSharedBytesPerBlock(config.target) -
                     reductionWorkgroup(kernel, config).bytes();
    // Column partials first: an element of a partial off chip costs a
    // load and a store for every row, a staged element a load per later
    // pass. All of them, or, where a block has one row group (its partial
    // rows are then per block either way) and streams its row, as many
    // chunks as fit (a region of k chunks takes at most k times one
    // chunk's bytes). A row kept in registers beside split partials made
    // ptxas spill (layer_norm_bwd f32 n = 16384 on sm_86: 32 -> 116 bytes).
    if (int64_t perChunk = partialBytes(kernel, config, 1)) {
      if (partialBytes(kernel, config, config.chunks) <= budget)
        config.partialChunks = config.chunks;
      else if (config.rowsPerBlock == 1 && !config.rowOnChip)
        config.partialChunks =
            std::clamp<int64_t>(budget / perChunk, 0, config.chunks);
      if (config.partialChunks) {
        config.stageBytes = partialBytes(kernel, config, config.partialChunks);
        budget -= config.stageBytes;
      }
    }
    if (config.rowOnChip)
      return;
    // The staged loops' unrolled copies count against the compile-work
    // limit; a kernel past it streams as before.
    if (shape.ops * shape.passes * (kStagedLoads + 2) * config.vectorWidth >
        kMaxEmittedOps)
      return;
    SmallVector<BlockArgument> reread = rereadFullInputs(kernel);
    if (reread.empty())
      return;
    // Start from the chunks that fit before rounding (a row may have
    // billions of chunks); rounding each region up to 16 bytes may take a
    // few back.
    int64_t bytesPerChunk = 0;
    for (BlockArgument input : reread)
      bytesPerChunk += config.threadsPerRow * config.vectorWidth *
                       storageBytes(elementType(input)) * config.rowsPerBlock;
    config.stagedChunks =
        std::clamp<int64_t>(budget / bytesPerChunk, 0, config.chunks);
    while (config.stagedChunks > 0 && stagedBytes(config, reread) > budget)
      --config.stagedChunks;
    config.stageBytes += stagedBytes(config, reread);
  }
};

} // namespace
