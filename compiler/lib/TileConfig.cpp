//===- TileConfig.cpp - the tile heuristic and fuse-select-tiles ----------===//

#include "tilefuse/Compiler/TileConfig.h"
#include "tilefuse/Compiler/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/MathExtras.h"

#include <set>
#include <tuple>

namespace tilefuse {
#define GEN_PASS_DEF_FUSESELECTTILES
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace {
constexpr int64_t kMaxThreadsPerBlock = 1024;
constexpr int64_t kMaxThreadsPerRow = 512;
constexpr int64_t kPreferredThreadsPerRow = 256;
constexpr int64_t kWarpSize = 32;
/// The longest row a loss gives one warp (TileConfig.h, "one warp a row").
constexpr int64_t kMaxWarpRowLength = 16384;
/// The most elements of the full inputs a thread keeps in a row of fewer
/// threads than the rule gave (fewer idle vectors, at most 256 threads):
/// the most that any tile those rules chose in the traffic model kept.
constexpr int64_t kMaxKeptInFewerThreads = 112;
constexpr int64_t kRegistersPerSM = 65536;
constexpr int64_t kMinThreadsPerBlock = 256;
constexpr int64_t kVectorsPerThread = 4;
constexpr int64_t kMaxOnChipChunks = 8;
constexpr int64_t kKeptElementsPerThread = 32;
constexpr int64_t kMultiTensorBlocksPerSM = 4;
constexpr int64_t kMinColumnReductionBlocksPerSM = 2;
constexpr int64_t kMaxColumnReductionBlocksPerSM = 4;
constexpr int64_t kColumnReductionBytesInFlight = 64 * 1024;
constexpr int64_t kCpuVectorBytes = 32;
constexpr int64_t kCpuElementsPerTask = 65536;
constexpr int64_t kMultiTensorChunk = 65536;
constexpr int64_t kMultiTensorThreads = 512;
} // namespace

/// A persistent grid's blocks per SM (TileConfig.h), 0 without column
/// reductions: 2, or up to 4 where a row group's full inputs are too few
/// bytes for the block's barrier-bound round trips.
static int64_t columnReductionBlocksPerSM(const KernelShape &shape,
                                          const TileConfig &config) {
  if (!shape.hasColumnReduction)
    return 0;
  int64_t rowGroupBytes =
      config.rowsPerBlock * shape.n * shape.storageBytes * shape.fullInputs;
  if (!shape.hasRowReduction || rowGroupBytes == 0)
    return kMinColumnReductionBlocksPerSM;
  return std::clamp<int64_t>(
      llvm::divideCeil(kColumnReductionBytesInFlight, rowGroupBytes),
      kMinColumnReductionBlocksPerSM, kMaxColumnReductionBlocksPerSM);
}

/// The elements of the full inputs a thread keeps where its row stays on
/// chip.
static int64_t keptElements(const KernelShape &shape, const TileConfig &config) {
  return config.chunks * config.vectorWidth * shape.fullInputs;
}

/// Whether the full inputs a thread keeps for the whole row (one 32-bit
/// register per element once widened) take at most half of the registers a
/// thread gets when a block of this size fills the SM, or 3/8 of them in a
/// fusion with column reductions. Measured on the backward norms: keeping
/// 56-64 elements of 128 registers, 11 of their 18 shapes at n =
/// 13312-16384 spilled 8-156 bytes on some chip (layer norm, with two
/// partials, at every one); keeping 48 (n = 12288), none did. The bound
/// holds for any fusion with column reductions, whose rows may need fewer.
static bool fitsInRegisters(const KernelShape &shape, const TileConfig &config) {
  int64_t budget = std::min<int64_t>(
      255, kRegistersPerSM / config.threadsPerBlock());
  int64_t kept = keptElements(shape, config);
  return shape.hasColumnReduction ? 8 * kept <= 3 * budget
                                  : 2 * kept <= budget;
}

/// Whether a row of `config` stays on chip (TileConfig.h, row_on_chip).
static bool rowFitsOnChip(const KernelShape &shape, const TileConfig &config) {
  return shape.hasRowReduction && config.chunks <= kMaxOnChipChunks &&
         (!config.isGPU() || fitsInRegisters(shape, config));
}

/// `config` with `threads` a row, as the heuristic sizes the rest, and
/// whether a row of them stays on chip, within the compile work of
/// TileConfig.h and keeping at most kMaxKeptInFewerThreads elements.
static bool keptOnChipWith(const KernelShape &shape, TileConfig config,
                           int64_t vectors, int64_t threads) {
  config.threadsPerRow = threads;
  config.rowsPerBlock = std::max<int64_t>(1, kMinThreadsPerBlock / threads);
  config.chunks = llvm::divideCeil(vectors, threads);
  return config.chunks <= kMaxOnChipChunks && fitsInRegisters(shape, config) &&
         keptElements(shape, config) <= kMaxKeptInFewerThreads &&
         shape.ops * shape.passes * config.chunks * config.vectorWidth <=
             kMaxEmittedOps;
}

/// A row kept on chip (TileConfig.h, "fewer idle vectors"): half or a
/// quarter of `config`'s threads a row where that leaves fewer of the
/// row's vector slots idle in its last chunk and the row still fits in
/// registers.
static int64_t fewestIdleThreadsPerRow(const KernelShape &shape,
                                       const TileConfig &config,
                                       int64_t vectors) {
  auto idle = [&](int64_t threads) {
    return llvm::divideCeil(vectors, threads) * threads - vectors;
  };
  int64_t best = config.threadsPerRow;
  for (int64_t threads = best / 2;
       threads >= 32 && threads * 4 >= config.threadsPerRow; threads /= 2)
    if (idle(threads) < idle(best) &&
        keptOnChipWith(shape, config, vectors, threads))
      best = threads;
  return best;
}

/// TileConfig.h, "at most 256 threads": 256 threads a row rather than 512
/// where a row of them still stays on chip.
static int64_t preferredThreadsPerRow(const KernelShape &shape,
                                      const TileConfig &config,
                                      int64_t vectors) {
  if (config.threadsPerRow > kPreferredThreadsPerRow &&
      keptOnChipWith(shape, config, vectors, kPreferredThreadsPerRow))
    return kPreferredThreadsPerRow;
  return config.threadsPerRow;
}

int64_t tilefuse::maxSharedBytesPerBlock(StringRef target) {
  return llvm::StringSwitch<int64_t>(target)
      .Case("sm_80", 163 * 1024)
      .Cases({"sm_86", "sm_89"}, 99 * 1024)
      .Case("sm_90", 227 * 1024)
      .Default(0);
}

bool tilefuse::runsAloneOnSM(const TileConfig &config,
                             int64_t staticSharedBytes) {
  if (!config.isGPU())
    return false;
  // The hardware reserves 1 KiB of shared memory per block, and an SM has
  // that much more than one block may opt into (sm_90 228 KiB).
  constexpr int64_t kReservedPerBlock = 1024;
  int64_t sharedPerSM =
      maxSharedBytesPerBlock(config.target) + kReservedPerBlock;
  int64_t sharedPerBlock =
      config.stageBytes + staticSharedBytes + kReservedPerBlock;
  return 2 * sharedPerBlock > sharedPerSM;
}

/// TileConfig.h, "a wide row in shared memory": whether a fusion with
/// column reductions streams a wide row through shared memory, two blocks
/// an SM, rather than keeping it in registers.
static bool stagesWideRow(const KernelShape &shape, const TileConfig &config) {
  // Rows that fill their chunks exactly, in an even number of them (where
  // the traffic model put the staged row ahead: TileConfig.h).
  int64_t rowGroup = config.chunks * config.threadsPerRow * config.vectorWidth;
  if (!shape.hasColumnReduction || !keepsWideRowOnChip(shape, config) ||
      config.threadsPerRow <= kWarpSize || rowGroup != shape.n ||
      config.chunks % 2 != 0)
    return false;
  int64_t blockElements = config.rowsPerBlock * shape.n;
  int64_t rowBytes = blockElements * shape.fullInputBytes;
  if (2 * rowBytes > kColumnReductionBytesInFlight)
    return false;
  // The staged row and every partial, beside the row reductions' slots (at
  // most four 8-byte state values a warp).
  TileConfig staged = config;
  staged.stageBytes = rowBytes + blockElements * shape.columnPartialBytes;
  int64_t workgroupBytes = llvm::divideCeil(config.threadsPerBlock(), 32) * 32;
  return !runsAloneOnSM(staged, workgroupBytes);
}

/// Whether a GPU tile's row is a power of two of threads (its lanes meet in
/// butterfly shuffles) and its block at most kMaxThreadsPerBlock, each
/// factor bounded before their product.
static bool hasValidBlockShape(const TileConfig &config) {
  return config.threadsPerRow >= 1 &&
         llvm::isPowerOf2_64(config.threadsPerRow) &&
         config.threadsPerRow <= kMaxThreadsPerBlock &&
         config.rowsPerBlock >= 1 &&
         config.rowsPerBlock <= kMaxThreadsPerBlock &&
         config.threadsPerBlock() <= kMaxThreadsPerBlock;
}

bool tilefuse::keepsWideRowOnChip(const KernelShape &shape,
                                  const TileConfig &config) {
  return config.isGPU() && config.rowOnChip &&
         keptElements(shape, config) > kKeptElementsPerThread;
}

bool tilefuse::foldsResidentBlocks(const TileConfig &config) {
  return config.isGPU() && config.blocksPerSM > 0 && config.partialChunks > 0 &&
         config.partialChunks == config.chunks && config.stagedChunks == 0 &&
         config.rowsPerBlock <= maxFoldedRowGroups(config);
}

int64_t tilefuse::maxFoldedRowGroups(const TileConfig &config) {
  constexpr int64_t kNamedBarriers = 15;
  int64_t groups = kMaxThreadsPerBlock / config.threadsPerRow;
  return config.threadsPerRow > 32 ? std::min(groups, kNamedBarriers) : groups;
}

int64_t tilefuse::maxFoldedBlocks(const TileConfig &config) {
  return std::min(config.blocksPerSM,
                  maxFoldedRowGroups(config) / config.rowsPerBlock);
}

int64_t tilefuse::blocksPerSMGoal(const TileConfig &config) {
  constexpr int64_t kResidentThreadsGoal = 1024;
  if (!config.isGPU() || config.blocksPerSM > 0 || config.stageBytes > 0)
    return 0;
  int64_t blocks = kResidentThreadsGoal / config.threadsPerBlock();
  return blocks > 1 ? blocks : 0;
}

int64_t tilefuse::storageBytes(Type elementType) {
  return llvm::divideCeil(elementType.getIntOrFloatBitWidth(), 8);
}

int64_t tilefuse::sharedRegionBytes(const TileConfig &config, int64_t chunks,
                                    Type elementType) {
  return llvm::alignTo(chunks * config.threadsPerRow * config.vectorWidth *
                           storageBytes(elementType),
                       16);
}

LogicalResult tilefuse::checkKernelOpLimit(KernelOp kernel, StringRef pass) {
  int64_t ops = kernel.getEntryBlock().getOperations().size();
  if (ops <= kMaxKernelOps)
    return success();
  return kernel.emitError(pass)
         << ": kernel @" << kernel.getSymName() << " has " << ops
         << " operations; the limit is " << kMaxKernelOps
         << ": split the fusion";
}

bool tilefuse::isKnownTarget(StringRef target) {
  return llvm::is_contained({"sm_80", "sm_86", "sm_89", "sm_90", "cpu"},
                            target);
}

TileConfig tilefuse::chooseTileConfig(const KernelShape &shape,
                                      StringRef target) {
  TileConfig config;
  config.target = target.str();
  if (shape.multiTensor) {
    config.chunkElements = kMultiTensorChunk;
    config.rowOnChip = false;
    if (target == "cpu") {
      config.vectorWidth = kCpuVectorBytes / 4;
      config.rowsPerTask = kMultiTensorChunk;
      return config;
    }
    config.vectorWidth = shape.aligned ? 16 / shape.storageBytes : 1;
    config.threadsPerRow = kMultiTensorThreads;
    config.chunks =
        kMultiTensorChunk / (kMultiTensorThreads * config.vectorWidth);
    config.blocksPerSM = kMultiTensorBlocksPerSM;
    return config;
  }
  int64_t n = shape.n;
  if (target == "cpu") {
    // Arithmetic runs in f32: one 256-bit register holds 8 lanes.
    int64_t lanes = kCpuVectorBytes / 4;
    config.vectorWidth = n % lanes == 0 ? lanes : 1;
    config.chunks = llvm::divideCeil(n, config.vectorWidth);
    config.rowOnChip = rowFitsOnChip(shape, config);
    config.rowsPerTask = std::max<int64_t>(1, kCpuElementsPerTask / n);
    return config;
  }
  int64_t vector = 16 / shape.storageBytes;
  config.vectorWidth = shape.aligned && n % vector == 0 ? vector : 1;
  int64_t vectors = llvm::divideCeil(n, config.vectorWidth);
  // Occupancy (TileConfig.h): rows of threads wide enough that a thread
  // keeps at most 32 elements of the full inputs, and no wider where a
  // fusion loads 16-byte vectors and reduces its rows without writing a
  // full row.
  int64_t keptPerVector = config.vectorWidth * shape.fullInputs;
  int64_t vectorsPerThread = kVectorsPerThread;
  bool reducesRowsOnly = shape.hasRowReduction && !shape.writesFullRow &&
                         keptPerVector > 0 && config.vectorWidth > 1;
  if (reducesRowsOnly)
    vectorsPerThread =
        std::clamp<int64_t>(kKeptElementsPerThread / keptPerVector,
                            kVectorsPerThread, kMaxOnChipChunks);
  config.threadsPerRow = std::min<int64_t>(
      kMaxThreadsPerRow,
      llvm::PowerOf2Ceil(llvm::divideCeil(vectors, vectorsPerThread)));
  if (shape.hasRowReduction)
    while (config.threadsPerRow < kMaxThreadsPerRow &&
           llvm::divideCeil(vectors, config.threadsPerRow) * keptPerVector >
               kKeptElementsPerThread)
      config.threadsPerRow *= 2;
  // A row one warp keeps on chip in 32 elements of each full input a
  // thread (TileConfig.h, "a row a warp holds") takes one warp, whose lanes
  // meet in shuffles alone. Loss forwards keep the rule of their own below.
  if (shape.hasRowReduction && !reducesRowsOnly &&
      config.threadsPerRow > kWarpSize &&
      llvm::divideCeil(vectors, kWarpSize) * config.vectorWidth <=
          kKeptElementsPerThread &&
      keptOnChipWith(shape, config, vectors, kWarpSize))
    config.threadsPerRow = kWarpSize;
  // Only rows the rule keeps on chip: fewer threads must not pull a
  // streamed row into registers.
  if (shape.hasRowReduction &&
      keptOnChipWith(shape, config, vectors, config.threadsPerRow)) {
    config.threadsPerRow = fewestIdleThreadsPerRow(shape, config, vectors);
    config.threadsPerRow = preferredThreadsPerRow(shape, config, vectors);
  }
  // One warp a row (TileConfig.h): a loss's rows meet in shuffles alone;
  // one narrowed to it (a thread would keep more than 32 elements) streams.
  bool narrowedToWarp = reducesRowsOnly && shape.mergesToOnePass &&
                        !shape.hasColumnReduction && n <= kMaxWarpRowLength &&
                        config.threadsPerRow > kWarpSize;
  if (narrowedToWarp)
    config.threadsPerRow = kWarpSize;
  config.rowsPerBlock =
      std::max<int64_t>(1, kMinThreadsPerBlock / config.threadsPerRow);
  config.chunks = llvm::divideCeil(vectors, config.threadsPerRow);
  config.rowOnChip = !narrowedToWarp && rowFitsOnChip(shape, config);
  if (stagesWideRow(shape, config))
    config.rowOnChip = false;
  config.blocksPerSM = columnReductionBlocksPerSM(shape, config);
  return config;
}

DictionaryAttr TileConfig::toAttr(MLIRContext *context) const {
  Builder b(context);
  SmallVector<NamedAttribute> fields = {
      b.getNamedAttr("target", b.getStringAttr(target)),
      b.getNamedAttr("vector_width", b.getI64IntegerAttr(vectorWidth)),
      b.getNamedAttr("chunks", b.getI64IntegerAttr(chunks)),
      b.getNamedAttr("row_on_chip", b.getBoolAttr(rowOnChip)),
  };
  if (chunkElements)
    fields.push_back(
        b.getNamedAttr("chunk_elements", b.getI64IntegerAttr(chunkElements)));
  if (stageBytes) {
    fields.push_back(
        b.getNamedAttr("staged_chunks", b.getI64IntegerAttr(stagedChunks)));
    fields.push_back(
        b.getNamedAttr("stage_bytes", b.getI64IntegerAttr(stageBytes)));
  }
  if (partialChunks)
    fields.push_back(
        b.getNamedAttr("partial_chunks", b.getI64IntegerAttr(partialChunks)));
  if (isGPU()) {
    fields.push_back(
        b.getNamedAttr("threads_per_row", b.getI64IntegerAttr(threadsPerRow)));
    fields.push_back(
        b.getNamedAttr("rows_per_block", b.getI64IntegerAttr(rowsPerBlock)));
    fields.push_back(b.getNamedAttr(
        "warps", b.getI64IntegerAttr(llvm::divideCeil(threadsPerBlock(), 32))));
    fields.push_back(
        b.getNamedAttr("blocks_per_sm", b.getI64IntegerAttr(blocksPerSM)));
  } else {
    fields.push_back(
        b.getNamedAttr("rows_per_task", b.getI64IntegerAttr(rowsPerTask)));
  }
  return b.getDictionaryAttr(fields);
}

FailureOr<TileConfig> TileConfig::fromKernel(KernelOp kernel) {
  auto attr = kernel->getAttrOfType<DictionaryAttr>("fuse.tile");
  if (!attr)
    return kernel.emitError("kernel @")
           << kernel.getSymName()
           << " has no tile configuration: run fuse-select-tiles first";
  TileConfig config;
  auto integer = [&](StringRef name, int64_t fallback) {
    auto value = attr.getAs<IntegerAttr>(name);
    return value ? value.getInt() : fallback;
  };
  auto target = attr.getAs<StringAttr>("target");
  auto onChip = attr.getAs<BoolAttr>("row_on_chip");
  if (!target || !onChip)
    return kernel.emitError("malformed fuse.tile: ") << attr;
  config.target = target.str();
  config.threadsPerRow = integer("threads_per_row", 1);
  config.rowsPerBlock = integer("rows_per_block", 1);
  config.vectorWidth = integer("vector_width", 1);
  config.chunks = integer("chunks", 1);
  config.rowOnChip = onChip.getValue();
  config.blocksPerSM = integer("blocks_per_sm", 0);
  config.rowsPerTask = integer("rows_per_task", 0);
  config.chunkElements = integer("chunk_elements", 0);
  config.stagedChunks = integer("staged_chunks", 0);
  config.stageBytes = integer("stage_bytes", 0);
  config.partialChunks = integer("partial_chunks", 0);
  // A row's lanes combine in butterfly shuffles within and across warps.
  if (config.isGPU() && !hasValidBlockShape(config))
    return kernel.emitError("malformed fuse.tile: threads_per_row = ")
           << config.threadsPerRow << " must be a power of two and "
           << "threads_per_row * rows_per_block (" << config.rowsPerBlock
           << ") at most " << kMaxThreadsPerBlock;
  // Partials on chip live in the stage's shared memory, a GPU block's; only
  // a block of one row group splits them (its partial rows are per block
  // either way).
  bool split = config.partialChunks && config.partialChunks < config.chunks;
  if (config.partialChunks < 0 || config.partialChunks > config.chunks ||
      (config.partialChunks && (!config.isGPU() || !config.stageBytes)) ||
      (split && config.rowsPerBlock != 1))
    return kernel.emitError("malformed fuse.tile: partial_chunks = ")
           << config.partialChunks
           << " must be 0 on the CPU or without stage_bytes, at most chunks ("
           << config.chunks << "), and all of them where rows_per_block > 1";
  return config;
}

DenseMap<Value, int> tilefuse::rowLevels(KernelOp kernel) {
  DenseMap<Value, int> levels;
  for (BlockArgument arg : kernel.getEntryBlock().getArguments())
    levels[arg] = 0;
  for (Operation &op : kernel.getEntryBlock().without_terminator()) {
    int level = 0;
    for (Value operand : op.getOperands())
      level = std::max(level, levels.lookup(operand));
    if (isRowReduction(&op))
      ++level;
    for (Value result : op.getResults())
      levels[result] = level;
  }
  return levels;
}

int tilefuse::finalPassLevel(KernelOp kernel,
                             const DenseMap<Value, int> &levels) {
  int finalLevel = 0;
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  for (Value value : yield.getValues())
    if (cast<ValueType>(value.getType()).getKind() == ValueKind::Full)
      finalLevel = std::max(finalLevel, levels.lookup(value));
  kernel.walk([&](ReduceOp reduce) {
    if (!reduce.isRowReduction())
      finalLevel = std::max(finalLevel, levels.lookup(reduce.getInput()));
  });
  return finalLevel;
}

int tilefuse::reducedLevel(Operation *rowReduction,
                           const DenseMap<Value, int> &levels) {
  int level = 0;
  for (Value operand : rowReduction->getOperands())
    level = std::max(level, levels.lookup(operand));
  return level;
}

SmallVector<int> tilefuse::passLevels(KernelOp kernel) {
  DenseMap<Value, int> levels = rowLevels(kernel);
  std::set<int> passes = {finalPassLevel(kernel, levels)};
  kernel.walk([&](Operation *op) {
    if (isRowReduction(op))
      passes.insert(reducedLevel(op, levels));
  });
  return SmallVector<int>(passes.begin(), passes.end());
}

SmallVector<SmallVector<Value>> tilefuse::passChunkValues(KernelOp kernel) {
  DenseMap<Value, int> levels = rowLevels(kernel);
  int finalLevel = finalPassLevel(kernel, levels);
  DenseMap<int, SmallVector<Value>> roots;
  kernel.walk([&](Operation *op) {
    if (auto reduce = dyn_cast<ReduceOp>(op); reduce && !reduce.isRowReduction())
      roots[finalLevel].push_back(reduce.getInput());
    else if (isRowReduction(op))
      llvm::append_range(roots[reducedLevel(op, levels)], op->getOperands());
  });
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  for (Value value : yield.getValues())
    if (cast<ValueType>(value.getType()).getKind() == ValueKind::Full)
      roots[finalLevel].push_back(value);
  SmallVector<SmallVector<Value>> passes;
  for (int pass : passLevels(kernel)) {
    llvm::SetVector<Value> values;
    SmallVector<Value> worklist(roots.lookup(pass));
    while (!worklist.empty()) {
      Value value = worklist.pop_back_val();
      ValueKind kind = cast<ValueType>(value.getType()).getKind();
      if ((kind != ValueKind::Full && kind != ValueKind::Col) ||
          !values.insert(value))
        continue;
      Operation *op = value.getDefiningOp();
      if (op && !isRowReduction(op))
        llvm::append_range(worklist, op->getOperands());
    }
    passes.push_back(values.takeVector());
  }
  return passes;
}

SmallVector<BlockArgument> tilefuse::rereadFullInputs(KernelOp kernel) {
  DenseMap<Value, int> readingPasses;
  for (const SmallVector<Value> &values : passChunkValues(kernel))
    for (Value value : values)
      if (isa<BlockArgument>(value) &&
          cast<ValueType>(value.getType()).getKind() == ValueKind::Full)
        ++readingPasses[value];
  SmallVector<BlockArgument> reread;
  for (BlockArgument arg : kernel.getEntryBlock().getArguments())
    if (readingPasses.lookup(arg) > 1)
      reread.push_back(arg);
  return reread;
}

std::string KernelAbi::str() const {
  SmallVector<std::string> fields;
  if (multiTensor)
    fields.push_back("multi-tensor");
  for (const auto &[name, dtype] : scalarPointers)
    fields.push_back("pointer:" + name + ":" + dtype);
  for (const auto &[name, dtype] : perTensorScalars)
    fields.push_back("per-tensor:" + name + ":" + dtype);
  for (const auto &[output, input] : inplace)
    fields.push_back("inplace:" + output + ":" + input);
  if (!skipIf.empty())
    fields.push_back("skip-if:" + skipIf);
  return llvm::join(fields, ",");
}

std::optional<KernelAbi> KernelAbi::parse(StringRef text) {
  KernelAbi abi;
  SmallVector<StringRef> fields, parts;
  text.split(fields, ',', /*MaxSplit=*/-1, /*KeepEmpty=*/false);
  for (StringRef field : fields) {
    parts.clear();
    field.trim().split(parts, ':');
    if (llvm::any_of(parts, [](StringRef part) { return part.empty(); }))
      return std::nullopt;
    std::string first = parts.size() > 1 ? parts[1].str() : "";
    std::string second = parts.size() > 2 ? parts[2].str() : "";
    bool inserted = true;
    if (parts[0] == "multi-tensor" && parts.size() == 1)
      abi.multiTensor = true;
    else if (parts[0] == "pointer" && parts.size() == 3)
      inserted = abi.scalarPointers.try_emplace(first, second).second;
    else if (parts[0] == "per-tensor" && parts.size() == 3)
      inserted = abi.perTensorScalars.try_emplace(first, second).second;
    else if (parts[0] == "inplace" && parts.size() == 3)
      inserted = abi.inplace.try_emplace(first, second).second;
    else if (parts[0] == "skip-if" && parts.size() == 2)
      abi.skipIf = first;
    else
      return std::nullopt;
    if (!inserted)
      return std::nullopt;
  }
  return abi;
}

uint64_t tilefuse::dtypeBytes(StringRef dtype) {
  return llvm::StringSwitch<uint64_t>(dtype)
      .Cases({"f64", "i64"}, 8)
      .Cases({"f32", "i32"}, 4)
      .Cases({"f16", "bf16"}, 2)
      .Default(1);
}

FailureOr<KernelAbi> tilefuse::getKernelAbi(KernelOp kernel) {
  auto spec = kernel->getAttrOfType<DictionaryAttr>("fuse.specialization");
  auto text = spec ? spec.getAs<StringAttr>("abi") : StringAttr();
  if (!text)
    return KernelAbi();
  std::optional<KernelAbi> abi = KernelAbi::parse(text.getValue());
  if (!abi)
    return kernel.emitError("malformed ABI in fuse.specialization: ") << text;
  return *abi;
}

FailureOr<KernelShape> tilefuse::getKernelShape(KernelOp kernel) {
  auto spec = kernel->getAttrOfType<DictionaryAttr>("fuse.specialization");
  auto dtype = spec ? spec.getAs<TypeAttr>("dtype") : TypeAttr();
  auto n = spec ? spec.getAs<IntegerAttr>("n") : IntegerAttr();
  auto aligned = spec ? spec.getAs<BoolAttr>("aligned") : BoolAttr();
  if (!dtype || !n || !aligned)
    return kernel.emitError("kernel @")
           << kernel.getSymName()
           << " is not specialized: run fuse-specialize first";
  KernelShape shape;
  shape.n = n.getInt();
  shape.storageBytes = dtype.getValue().getIntOrFloatBitWidth() / 8;
  shape.aligned = aligned.getValue();
  FailureOr<KernelAbi> abi = getKernelAbi(kernel);
  if (failed(abi))
    return failure();
  shape.multiTensor = abi->multiTensor;
  for (Type type : kernel.getInputTypes()) {
    auto value = cast<ValueType>(type);
    if (value.getKind() != ValueKind::Full)
      continue;
    ++shape.fullInputs;
    shape.fullInputBytes += storageBytes(value.getElementType());
  }
  shape.writesFullRow = llvm::any_of(kernel.getOutputTypes(), [](Type type) {
    return cast<ValueType>(type).getKind() == ValueKind::Full;
  });
  kernel.walk([&](Operation *op) {
    shape.hasRowReduction |= isRowReduction(op);
    if (auto reduce = dyn_cast<ReduceOp>(op);
        reduce && !reduce.isRowReduction()) {
      shape.hasColumnReduction = true;
      shape.columnPartialBytes += storageBytes(
          cast<ValueType>(reduce.getInput().getType()).getElementType());
    }
  });
  shape.ops = kernel.getEntryBlock().getOperations().size();
  for (auto [value, level] : rowLevels(kernel))
    shape.passes = std::max<int64_t>(shape.passes, level + 1);
  return shape;
}

namespace {
struct FuseSelectTilesPass
    : tilefuse::impl::FuseSelectTilesBase<FuseSelectTilesPass> {
  using FuseSelectTilesBase::FuseSelectTilesBase;

  void runOnOperation() override {
    KernelOp kernel = getOperation();
    if (!isKnownTarget(target)) {
      kernel.emitError("fuse-select-tiles: unknown target '")
          << target << "': expected sm_80, sm_86, sm_89, sm_90 or cpu";
      return signalPassFailure();
    }
    FailureOr<KernelShape> shape = getKernelShape(kernel);
    if (failed(shape))
      return signalPassFailure();
    shape->mergesToOnePass =
        passLevels(kernel).size() > 1 && mergesIntoOnePass(kernel);
    TileConfig config = chooseTileConfig(*shape, target);
    if (shape->multiTensor && (threadsPerRow || rowsPerBlock || vectorWidth ||
                               rowOnChip != "auto")) {
      kernel.emitError("fuse-select-tiles: tile overrides do not apply to "
                       "multi-tensor kernels");
      return signalPassFailure();
    }
    if ((!shape->multiTensor && failed(applyOverrides(kernel, *shape, config))) ||
        failed(checkCompileWork(kernel, *shape, config)))
      return signalPassFailure();
    kernel->setAttr("fuse.tile", config.toAttr(&getContext()));
  }

  /// The limits of TileConfig.h on what the lowering will emit.
  LogicalResult checkCompileWork(KernelOp kernel, const KernelShape &shape,
                                 const TileConfig &config) {
    if (failed(checkKernelOpLimit(kernel, "fuse-select-tiles")))
      return failure();
    int64_t unrolled = config.rowOnChip ? config.chunks : 1;
    int64_t lanes = config.isGPU() ? config.vectorWidth : 1;
    int64_t emitted = shape.ops * shape.passes * unrolled * lanes;
    if (emitted <= kMaxEmittedOps)
      return success();
    return kernel.emitError("fuse-select-tiles: kernel @")
           << kernel.getSymName() << " would emit about " << emitted
           << " operations (" << shape.ops << " ops x " << shape.passes
           << " passes x " << unrolled << " unrolled chunks x " << lanes
           << " lanes); the limit is " << kMaxEmittedOps
           << ": split the fusion"
           << (config.rowOnChip ? " or use row-on-chip=false" : "");
  }

  LogicalResult applyOverrides(KernelOp kernel, const KernelShape &shape,
                               TileConfig &config) {
    const TileConfig chosen = config;
    auto fail = [&](const Twine &message) {
      return kernel.emitError("fuse-select-tiles: ") << message;
    };
    if (vectorWidth) {
      int64_t maxWidth = config.isGPU() ? 16 / shape.storageBytes
                                        : kCpuVectorBytes / 4;
      if (!llvm::isPowerOf2_64(vectorWidth) || vectorWidth > maxWidth)
        return fail("vector-width must be a power of two <= " +
                    Twine(maxWidth) + ", got " + Twine(vectorWidth));
      if (vectorWidth > 1 && (shape.n % vectorWidth != 0 ||
                              (config.isGPU() && !shape.aligned)))
        return fail("vector-width " + Twine(vectorWidth) +
                    " needs the aligned class and n divisible by it (n = " +
                    Twine(shape.n) + ")");
      config.vectorWidth = vectorWidth;
    }
    if (threadsPerRow || rowsPerBlock) {
      if (!config.isGPU())
        return fail("threads-per-row and rows-per-block apply to GPU "
                    "targets only");
      if (threadsPerRow) {
        config.threadsPerRow = threadsPerRow;
        config.rowsPerBlock =
            std::max<int64_t>(1, kMinThreadsPerBlock / threadsPerRow);
      }
      if (rowsPerBlock)
        config.rowsPerBlock = rowsPerBlock;
      if (!hasValidBlockShape(config))
        return fail("threads-per-row must be a power of two and "
                    "threads-per-row * rows-per-block at most 1024, got " +
                    Twine(config.threadsPerRow) + " * " +
                    Twine(config.rowsPerBlock));
    }
    config.chunks = llvm::divideCeil(
        llvm::divideCeil(shape.n, config.vectorWidth), config.threadsPerRow);
    if (rowOnChip == "true" || rowOnChip == "false")
      config.rowOnChip = rowOnChip == "true";
    else if (rowOnChip == "auto") {
      // Rows shaped as the heuristic shaped them keep its choice (a row
      // narrowed to one warp streams).
      if (std::tie(config.vectorWidth, config.threadsPerRow,
                   config.rowsPerBlock) != std::tie(chosen.vectorWidth,
                                                    chosen.threadsPerRow,
                                                    chosen.rowsPerBlock))
        config.rowOnChip = rowFitsOnChip(shape, config);
    } else
      return fail("row-on-chip must be true, false or auto, got '" +
                  rowOnChip + "'");
    if (config.rowOnChip && config.chunks > kMaxUnrolledChunks)
      return fail("row-on-chip=true would unroll " + Twine(config.chunks) +
                  " chunks per thread (n = " + Twine(shape.n) +
                  "); at most " + Twine(kMaxUnrolledChunks) +
                  " are unrolled: use row-on-chip=false or auto" +
                  (config.isGPU() ? " or more threads-per-row" : ""));
    if (config.isGPU())
      config.blocksPerSM = columnReductionBlocksPerSM(shape, config);
    return success();
  }
};
} // namespace
