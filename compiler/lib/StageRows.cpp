//===- StageRows.cpp - keep a streamed row's re-read inputs on chip -------===//
//
// Chooses how many chunks of each re-read full input a streamed row keeps in
// dynamic shared memory (TileConfig.h). It runs after the passes that change
// how many times a row is read (fuse-merge-reductions), so that a row read
// once is not staged.
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

/// Bytes of static workgroup memory the row reductions may take beside the
/// staged chunks: a slot per warp, per reduction-state value (at most 3),
/// of at most 8 bytes.
int64_t reductionSharedBytes(KernelOp kernel, const TileConfig &config) {
  int64_t reductions = 0;
  kernel.walk([&](Operation *op) { reductions += isRowReduction(op); });
  int64_t warps = llvm::divideCeil(config.threadsPerBlock(), 32);
  return warps * std::max<int64_t>(1, reductions) * 3 * 8;
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
    SmallVector<BlockArgument> reread;
    if (config->isGPU() && !config->rowOnChip && !shape->multiTensor)
      reread = rereadFullInputs(kernel);
    // The staged loops' unrolled copies count against the compile-work
    // limit; a kernel past it streams as before.
    bool bounded = shape->ops * shape->passes * (kStagedUnroll + 2) *
                       config->vectorWidth <=
                   kMaxEmittedOps;
    if (!reread.empty() && bounded) {
      int64_t budget = maxSharedBytesPerBlock(config->target) -
                       reductionSharedBytes(kernel, *config);
      int64_t bytesPerChunk = 0;
      for (BlockArgument input : reread)
        bytesPerChunk += config->threadsPerRow * config->vectorWidth *
                         cast<ValueType>(input.getType())
                                 .getElementType()
                                 .getIntOrFloatBitWidth() /
                         8;
      bytesPerChunk *= config->rowsPerBlock;
      config->stagedChunks =
          std::min<int64_t>(config->chunks, budget / bytesPerChunk);
      // Rounding each region up to 16 bytes may take a chunk back.
      for (; config->stagedChunks > 0; --config->stagedChunks) {
        config->stageBytes = 0;
        for (BlockArgument input : reread)
          config->stageBytes += stageRegionBytes(
              *config, cast<ValueType>(input.getType()).getElementType());
        config->stageBytes *= config->rowsPerBlock;
        if (config->stageBytes <= budget)
          break;
      }
      if (!config->stagedChunks)
        config->stageBytes = 0;
    }
    kernel->setAttr("fuse.tile", config->toAttr(&getContext()));
  }
};

} // namespace
