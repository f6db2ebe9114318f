//===- LowerToGPU.cpp - fuse-lower-to-gpu ---------------------------------===//
//
// A row program on a GPU: a row's threads and how they combine a reduction
// (GPURowMapping), the kernel and its finalize as gpu.func, and the pass,
// which lowers multi-tensor kernels too (LowerMultiTensor.cpp).
//
//===----------------------------------------------------------------------===//

#include "RowProgram.h"

#include "tilefuse/Compiler/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "llvm/Support/MathExtras.h"

namespace tilefuse {
#define GEN_PASS_DEF_FUSELOWERTOGPU
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;
using namespace tilefuse::lowering;

namespace tilefuse::lowering {

Value GPURowMapping::isRowLeader(OpBuilder &b, Location loc) {
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, laneIndex,
                               indexConstant(b, loc, 0));
}

SmallVector<ReductionState>
GPURowMapping::combineAcrossRow(OpBuilder &b, Location loc,
                                ArrayRef<RowReduction> reductions,
                                ArrayRef<ReductionState> partials) {
  SmallVector<ReductionState> states(partials);
  // Within a warp: butterfly shuffles over the lanes of this row.
  if (config.threadsPerRow <= 32) {
    for (auto [reduction, state] : llvm::zip(reductions, states))
      state =
          combineAcrossLanes(b, loc, reduction, state, config.threadsPerRow);
    return states;
  }
  // Only each warp's lane 0 publishes its state: no lane needs the rest
  // to agree with it.
  for (auto [reduction, state] : llvm::zip(reductions, states))
    state = butterfly(b, loc, reduction, state, 32);
  // Across the warps of a row: lane 0 of each warp publishes its state in
  // workgroup memory; after a barrier lane l of every warp reads warp
  // l % warps' state and butterfly shuffles combine them, log2(warps)
  // deep (every warp the same way, so every thread of the row gets the
  // same bits). Reading every warp's state instead held them all at once
  // (16 warps' four cross-entropy states took 64 registers, one
  // 512-thread block per SM). A persistent block (the backward norms)
  // still reads them all and combines them in order: its lanes would keep
  // their slot's address live across all their rows, and ptxas spilled a
  // register at f32 n = 32000 (the shuffles took 102 registers to 80 at
  // f32 n = 1000, which changed no block count).
  int64_t warpsPerRow = config.threadsPerRow / 32;
  Value warpInRow =
      arith::DivUIOp::create(b, loc, laneIndex, indexConstant(b, loc, 32));
  Value laneInWarp =
      arith::RemUIOp::create(b, loc, laneIndex, indexConstant(b, loc, 32));
  auto slot = [&](Value warp, size_t component) -> Value {
    // ((group * warpsPerRow + warp) * maxReductions + component)
    Value rowWarp = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, groupInBlock,
                              indexConstant(b, loc, warpsPerRow)),
        warp);
    return arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, rowWarp,
                              indexConstant(b, loc, maxReductions)),
        indexConstant(b, loc, component));
  };
  Value isWarpLeader = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::eq, laneInWarp, indexConstant(b, loc, 0));
  emitGuarded(b, loc, isWarpLeader, [&] {
    size_t component = 0;
    for (const ReductionState &state : states)
      for (Value value : state)
        memref::StoreOp::create(b, loc, toSlot(b, loc, value), workgroup,
                                slot(warpInRow, component++));
  });
  synchronizeRow(b, loc);
  bool inOrder = config.blocksPerSM > 0;
  Value sourceWarp =
      inOrder ? Value()
              : arith::RemUIOp::create(b, loc, laneInWarp,
                                       indexConstant(b, loc, warpsPerRow));
  size_t first = 0;
  for (auto [reduction, state] : llvm::zip(reductions, states)) {
    auto read = [&](Value warp) {
      ReductionState part;
      for (auto [index, value] : llvm::enumerate(state))
        part.push_back(
            fromSlot(b, loc,
                     memref::LoadOp::create(b, loc, workgroup,
                                            slot(warp, first + index)),
                     value.getType()));
      return part;
    };
    ReductionState total;
    if (inOrder) {
      total = read(indexConstant(b, loc, 0));
      for (int64_t warp = 1; warp < warpsPerRow; ++warp)
        total = combineStates(b, loc, reduction, total,
                              read(indexConstant(b, loc, warp)), math);
    } else {
      total =
          combineAcrossLanes(b, loc, reduction, read(sourceWarp), warpsPerRow);
    }
    first += state.size();
    state = total;
  }
  // The next reduction reuses the workgroup memory.
  synchronizeRow(b, loc);
  return states;
}

ReductionState GPURowMapping::butterfly(OpBuilder &b, Location loc,
                                        const RowReduction &reduction,
                                        ReductionState state, int64_t lanes) {
  assert(llvm::isPowerOf2_64(lanes) && lanes <= 32 && "a warp's lanes");
  for (int64_t offset = 1; offset < lanes; offset *= 2) {
    ReductionState shuffled;
    for (Value value : state)
      shuffled.push_back(gpu::ShuffleOp::create(b, loc, value, offset, 32,
                                                gpu::ShuffleMode::XOR)
                             .getShuffleResult());
    state = combineStates(b, loc, reduction, state, shuffled, math);
  }
  return state;
}

ReductionState GPURowMapping::combineAcrossLanes(OpBuilder &b, Location loc,
                                                 const RowReduction &reduction,
                                                 ReductionState state,
                                                 int64_t lanes) {
  state = butterfly(b, loc, reduction, state, lanes);
  if (lanes == 1 || reduction.form != RowReduction::Form::Moments)
    return state;
  Value lane = gpu::LaneIdOp::create(b, loc, /*upperBound=*/nullptr);
  Value first = arith::IndexCastOp::create(
      b, loc, b.getI32Type(),
      arith::AndIOp::create(b, loc, lane, indexConstant(b, loc, -lanes)));
  Value width = arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(32));
  for (Value &value : state)
    value = gpu::ShuffleOp::create(b, loc, value, first, width,
                                   gpu::ShuffleMode::IDX)
                .getShuffleResult();
  return state;
}

void GPURowMapping::synchronizeRow(OpBuilder &b, Location loc) {
  if (!namedBarriers) {
    gpu::BarrierOp::create(b, loc);
    return;
  }
  Type i32 = b.getI32Type();
  Value id = arith::IndexCastOp::create(
      b, loc, i32,
      arith::AddIOp::create(b, loc, groupInBlock, indexConstant(b, loc, 1)));
  Value threads = arith::ConstantOp::create(
      b, loc, b.getI32IntegerAttr(config.threadsPerRow));
  NVVM::BarrierOp::create(b, loc, Type(), id, threads,
                          NVVM::BarrierReductionAttr(), Value());
}

Type GPURowMapping::slotType() const {
  return cast<MemRefType>(workgroup.getType()).getElementType();
}

Value GPURowMapping::toSlot(OpBuilder &b, Location loc, Value value) const {
  if (isa<FloatType>(value.getType()))
    return castFloat(b, loc, value, slotType());
  unsigned width = slotType().getIntOrFloatBitWidth();
  if (width != value.getType().getIntOrFloatBitWidth())
    value = arith::ExtSIOp::create(b, loc, b.getIntegerType(width), value);
  return arith::BitcastOp::create(b, loc, slotType(), value);
}

Value GPURowMapping::fromSlot(OpBuilder &b, Location loc, Value slotValue,
                              Type type) const {
  if (isa<FloatType>(type))
    return castFloat(b, loc, slotValue, type);
  unsigned width = slotType().getIntOrFloatBitWidth();
  Value bits =
      arith::BitcastOp::create(b, loc, b.getIntegerType(width), slotValue);
  if (width != type.getIntOrFloatBitWidth())
    bits = arith::TruncIOp::create(b, loc, type, bits);
  return bits;
}

/// `@<name>_finalize` (KernelABI.h): each block finalizes finalizeColumns(n)
/// columns with finalizeSlices(n) threads per column. Slice s combines its
/// contiguous share of the row groups (coalesced: a warp reads whole
/// sectors of consecutive columns), then slice 0 combines the slices'
/// results in order: the same result for the same partials, and enough
/// blocks to fill the chip (a block per 8-32 columns, not per 256).
static void emitGPUFinalize(OpBuilder &b, Location loc, KernelOp kernel,
                            gpu::GPUModuleOp module, Type pointer, int64_t n) {
  MLIRContext *context = kernel.getContext();
  auto reductions = columnReductions(kernel);
  SmallVector<Type> slotTypes;
  for (auto [reduce, storage] : reductions)
    slotTypes.push_back(MemRefType::get(
        {kFinalizeThreads}, valueType(reduce.getInput()).getElementType(),
        MemRefLayoutAttrInterface{},
        gpu::AddressSpaceAttr::get(context, gpu::AddressSpace::Workgroup)));
  auto finalize = gpu::GPUFuncOp::create(
      b, loc, (kernel.getSymName() + kFinalizeSuffix).str(),
      b.getFunctionType(finalizeParameters(kernel, pointer), {}), slotTypes,
      TypeRange{});
  finalize->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  finalize.setKnownBlockSizeAttr(
      b.getDenseI32ArrayAttr({static_cast<int32_t>(kFinalizeThreads), 1, 1}));
  Block &entry = finalize.getBody().front();
  OpBuilder::InsertionGuard insertion(b);
  b.setInsertionPointToStart(&entry);
  ValueRange arguments =
      entry.getArguments().take_front(finalize.getNumArguments());
  Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  int64_t columnsPerBlock = finalizeColumns(n), slices = finalizeSlices(n);
  Value columns = indexConstant(b, loc, columnsPerBlock);
  Value lane = arith::RemUIOp::create(b, loc, thread, columns);
  Value slice = arith::DivUIOp::create(b, loc, thread, columns);
  Value column = arith::AddIOp::create(
      b, loc,
      arith::MulIOp::create(
          b, loc, gpu::BlockIdOp::create(b, loc, gpu::Dimension::x), columns),
      lane);
  // Threads past the last column combine no row group (every thread
  // reaches the barrier) and store nothing.
  Value inRange = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                        column, indexConstant(b, loc, n));
  Value rowGroups = finalizeRowGroups(b, loc, kernel, arguments);
  Value share = arith::CeilDivUIOp::create(b, loc, rowGroups,
                                           indexConstant(b, loc, slices));
  Value first = arith::MinUIOp::create(
      b, loc, arith::MulIOp::create(b, loc, slice, share), rowGroups);
  Value count = arith::SelectOp::create(
      b, loc, inRange,
      arith::MinUIOp::create(b, loc, share,
                             arith::SubIOp::create(b, loc, rowGroups, first)),
      indexConstant(b, loc, 0));
  SmallVector<Value> totals =
      combinePartials(b, loc, kernel, arguments, column, n, first, count,
                      kMaxSliceRows, kFinalizeGroup, /*freezeStart=*/true);
  ValueRange slots = finalize.getWorkgroupAttributions();
  for (auto [total, slot] : llvm::zip(totals, slots))
    memref::StoreOp::create(b, loc, total, slot, thread);
  gpu::BarrierOp::create(b, loc);
  Value isFirstSlice = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                             slice, indexConstant(b, loc, 0));
  emitGuarded(b, loc, andConditions(b, loc, isFirstSlice, inRange), [&] {
    SmallVector<Value> combined;
    for (auto [entry, slot] : llvm::zip(reductions, slots)) {
      Value total;
      for (int64_t s = 0; s < slices; ++s) {
        Value part = memref::LoadOp::create(
            b, loc, slot,
            ValueRange{arith::AddIOp::create(
                b, loc, lane, indexConstant(b, loc, s * columnsPerBlock))});
        total = s == 0 ? part
                       : combineReduction(b, loc, entry.first.getKind(), total,
                                          part);
      }
      combined.push_back(total);
    }
    storeFinalized(b, loc, kernel, arguments, column, combined);
  });
  gpu::ReturnOp::create(b, loc);
  // LLVM would unroll the group loops again (NVPTX asks for runtime
  // unrolling of small loops), which gives loop strength reduction one base
  // per copy to search again (rms_norm_bwd: 57% of the finalize's code
  // generation).
  auto rolled = LLVM::LoopAnnotationAttr::get(
      context, {}, {}, {},
      LLVM::LoopUnrollAttr::get(context, b.getBoolAttr(true), {}, {}, {}, {},
                                {}, {}),
      {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {});
  finalize.walk(
      [&](scf::ForOp loop) { loop->setAttr(kLoopAnnotationAttr, rolled); });
}

/// The launch's dynamic shared memory (`.extern .shared` in PTX, sized by
/// the launch), declared once per module.
constexpr StringLiteral kStageSymbol = "tilefuse_stage";

/// The launch's dynamic shared memory.
static Value dynamicSharedMemory(OpBuilder &b, Location loc,
                                 gpu::GPUModuleOp module) {
  if (!module.lookupSymbol(kStageSymbol)) {
    OpBuilder::InsertionGuard insertion(b);
    b.setInsertionPointToStart(module.getBody());
    LLVM::GlobalOp::create(b, loc, LLVM::LLVMArrayType::get(b.getI8Type(), 0),
                           /*isConstant=*/false, LLVM::Linkage::External,
                           kStageSymbol, Attribute(), /*alignment=*/16,
                           /*addrSpace=*/3);
  }
  return LLVM::AddressOfOp::create(
      b, loc, LLVM::LLVMPointerType::get(b.getContext(), /*addressSpace=*/3),
      kStageSymbol);
}

/// `index` frozen: opaque to LLVM's scalar evolution, so that loop strength
/// reduction does not search rewrites of every address computed from it
/// (an unclamped row: 13.8 -> 29.7 M instructions of loop passes in three
/// rms_norm_bwd compiles).
static Value freezeIndex(OpBuilder &b, Location loc, Value index) {
  Value wide = arith::IndexCastOp::create(b, loc, b.getI64Type(), index);
  return arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                    LLVM::FreezeOp::create(b, loc, wide));
}

static LogicalResult lowerKernelToGPU(KernelOp kernel,
                                      gpu::GPUModuleOp module) {
  FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
  FailureOr<KernelShape> shape = getKernelShape(kernel);
  if (failed(config) || failed(shape))
    return failure();
  if (!config->isGPU())
    return kernel.emitError("kernel @")
           << kernel.getSymName() << " is tiled for " << config->target
           << ", not a GPU";
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPointToEnd(module.getBody());
  Type pointer = LLVM::LLVMPointerType::get(context, /*addressSpace=*/1);

  FailureOr<KernelAbi> abi = getKernelAbi(kernel);
  if (failed(abi))
    return failure();
  SmallVector<Type> parameters = loweredParameters(kernel, pointer, *abi);
  parameters.push_back(b.getI64Type()); // rows
  ReductionWorkgroup reductionSlots = reductionWorkgroup(kernel, *config);
  if (config->stageBytes + reductionSlots.bytes() >
      maxSharedBytesPerBlock(config->target))
    return kernel.emitError("the staged chunks (")
           << config->stageBytes << " bytes) and the row reductions' slots ("
           << reductionSlots.bytes() << ") exceed the shared memory a block "
           << "of " << config->target << " may have";
  SmallVector<Type> workgroupTypes;
  if (reductionSlots.slots)
    workgroupTypes.push_back(MemRefType::get(
        {reductionSlots.slots}, reductionSlots.slotType,
        MemRefLayoutAttrInterface{},
        gpu::AddressSpaceAttr::get(context, gpu::AddressSpace::Workgroup)));
  auto function = gpu::GPUFuncOp::create(b, loc, kernel.getSymName(),
                                         b.getFunctionType(parameters, {}),
                                         workgroupTypes, TypeRange{});
  function->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  // A folded block's size is the runtime's (TileConfig.h).
  bool folded = foldsResidentBlocks(*config);
  if (!folded)
    function.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr(
        {static_cast<int32_t>(config->threadsPerBlock()), 1, 1}));
  bool aloneOnSM = runsAloneOnSM(*config, reductionSlots.bytes());
  if (aloneOnSM)
    function->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                      b.getI32IntegerAttr(1));

  Block &entry = function.getBody().front();
  b.setInsertionPointToStart(&entry);
  // A folded block's size is at most maxFoldedRowGroups rows of threads.
  IntegerAttr threadBound =
      folded
          ? b.getIndexAttr(maxFoldedRowGroups(*config) * config->threadsPerRow)
          : IntegerAttr();
  auto dimensionX = gpu::DimensionAttr::get(context, gpu::Dimension::x);
  Value thread = gpu::ThreadIdOp::create(b, loc, dimensionX, threadBound);
  Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  Value tpr = indexConstant(b, loc, config->threadsPerRow);
  Value rpb =
      folded
          ? arith::DivUIOp::create(
                b, loc,
                gpu::BlockDimOp::create(b, loc, dimensionX, threadBound), tpr)
                .getResult()
          : indexConstant(b, loc, config->rowsPerBlock);
  Value lane = arith::RemUIOp::create(b, loc, thread, tpr);
  Value group = arith::DivUIOp::create(b, loc, thread, tpr);
  Value rowGroup = arith::AddIOp::create(
      b, loc, arith::MulIOp::create(b, loc, block, rpb), group);
  Value rowGroups = arith::MulIOp::create(b, loc, blocks, rpb);
  // Workgroup attributions follow the parameters among the block arguments.
  Value rows = arith::IndexCastOp::create(
      b, loc, b.getIndexType(), entry.getArgument(parameters.size() - 1));

  GPURowMapping mapping(*config, MathLowering::of(*config, *shape), lane, group,
                        reductionSlots.slots
                            ? Value(function.getWorkgroupAttributions().front())
                            : Value(),
                        reductionSlots.stateValues);
  RowProgramEmitter emitter(kernel, *config, *shape, mapping, b);
  if (failed(emitter.checkSupported()))
    return failure();
  bindArguments(emitter, b, loc, kernel, *abi, entry.getArguments());
  if (config->stageBytes)
    emitter.bindStage(dynamicSharedMemory(b, loc, module), group,
                      config->stageBytes / config->rowsPerBlock, aloneOnSM);
  emitter.emitPartialsInit(rowGroup);

  // Every thread of a block runs the same number of row iterations (the
  // reductions synchronize the block); a row group's rows past the end are
  // clamped, load nothing (predicatedLoads) and do not store. A block of
  // one row group has none: its trips end at the last row, which the
  // column reductions' grids rely on (the clamp cost layer_norm_bwd bf16
  // n = 4096 13 registers), freezing the row instead; elsewhere ptxas's
  // register choices moved without it (cross_entropy_capped_fwd f32 n =
  // 32000: 64% -> 52% in the traffic model), so they keep it. The row
  // groups of a folded block meet only at their own barriers, so each
  // ends at its own last row, where they are whole warps (a warp's
  // shuffles take every lane).
  bool groupsEndApart = folded && config->threadsPerRow >= 32;
  Value firstRow = groupsEndApart
                       ? rowGroup
                       : arith::MulIOp::create(b, loc, block, rpb).getResult();
  Value remaining = arith::SubIOp::create(
      b, loc, arith::MaxSIOp::create(b, loc, rows, firstRow), firstRow);
  Value trips = arith::CeilDivUIOp::create(b, loc, remaining, rowGroups);
  auto loop = scf::ForOp::create(b, loc, indexConstant(b, loc, 0), trips,
                                 indexConstant(b, loc, 1));
  b.setInsertionPointToStart(loop.getBody());
  Value row = arith::AddIOp::create(
      b, loc, rowGroup,
      arith::MulIOp::create(b, loc, loop.getInductionVar(), rowGroups));
  Value rowValid, emittedRow;
  if (!groupsEndApart &&
      (folded || config->rowsPerBlock > 1 || !shape->hasColumnReduction)) {
    rowValid =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, row, rows);
    Value lastRow =
        arith::SubIOp::create(b, loc, rows, indexConstant(b, loc, 1));
    emittedRow = arith::SelectOp::create(b, loc, rowValid, row, lastRow);
  } else {
    emittedRow = freezeIndex(b, loc, row);
  }
  if (failed(emitter.emitRow(emittedRow, rowValid, rowGroup)))
    return failure();
  b.setInsertionPointToEnd(&entry);
  emitter.emitPartialsFlush(block, rpb);
  gpu::ReturnOp::create(b, loc);
  unrollStreamLoops(function);
  if (emitter.loadsAhead())
    function->setAttr(kKeepLoadOrderAttr, b.getUnitAttr());

  if (columnReductions(kernel).empty())
    return success();
  b.setInsertionPointToEnd(module.getBody());
  emitGPUFinalize(b, loc, kernel, module, pointer, shape->n);
  return success();
}

/// Lowers a row program or, for a multi-tensor kernel, its multi-tensor
/// form (LowerMultiTensor.cpp).
static LogicalResult lowerAnyKernelToGPU(KernelOp kernel,
                                         gpu::GPUModuleOp module) {
  auto multiTensor = multiTensorKernel(kernel);
  if (failed(multiTensor))
    return failure();
  if (!*multiTensor)
    return lowerKernelToGPU(kernel, module);
  return lowerMultiTensorKernelToGPU(kernel, module, (*multiTensor)->config,
                                     (*multiTensor)->shape,
                                     (*multiTensor)->abi);
}

} // namespace tilefuse::lowering

namespace {

struct FuseLowerToGPUPass
    : tilefuse::impl::FuseLowerToGPUBase<FuseLowerToGPUPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<KernelOp> kernels(module.getOps<KernelOp>());
    if (kernels.empty())
      return;
    OpBuilder b(module.getBodyRegion());
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    b.getUnitAttr());
    auto gpuModule =
        gpu::GPUModuleOp::create(b, module.getLoc(), kGPUModuleName);
    for (KernelOp kernel : kernels) {
      if (failed(lowerAnyKernelToGPU(kernel, gpuModule)))
        return signalPassFailure();
      kernel.erase();
    }
  }
};

} // namespace

int64_t ReductionWorkgroup::bytes() const {
  return slots * storageBytes(slotType);
}

ReductionWorkgroup tilefuse::reductionWorkgroup(KernelOp kernel,
                                                const TileConfig &config) {
  ReductionWorkgroup workgroup;
  Builder b(kernel.getContext());
  workgroup.slotType = b.getF32Type();
  DenseMap<Value, int> levels = rowLevels(kernel);
  SmallVector<RowReduction> reductions = rowReductions(kernel, levels, -1);
  DenseMap<int, int64_t> stateValuesPerPass;
  for (const RowReduction &reduction : reductions) {
    // 64-bit states (f64, i64: their bits) need 64-bit slots.
    if (valueType(reduction.input).getElementType().getIntOrFloatBitWidth() >
        32)
      workgroup.slotType = b.getF64Type();
    int64_t &values = stateValuesPerPass[reducedLevel(reduction.op, levels)];
    values += reduction.stateSize();
    workgroup.stateValues = std::max(workgroup.stateValues, values);
  }
  int64_t rowGroups = foldsResidentBlocks(config) ? maxFoldedRowGroups(config)
                                                  : config.rowsPerBlock;
  if (config.threadsPerRow > 32 && !reductions.empty())
    workgroup.slots =
        rowGroups * (config.threadsPerRow / 32) * workgroup.stateValues;
  return workgroup;
}
