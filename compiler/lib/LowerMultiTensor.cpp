//===- LowerMultiTensor.cpp - multi-tensor kernels, both targets ----------===//
//
// Multi-tensor kernels (KernelABI.h): the elementwise program of a kernel
// over a table of tensors, in chunks; the same emitter writes the body.
//
//===----------------------------------------------------------------------===//

#include "RowProgram.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace tilefuse::lowering {

namespace {

/// How a multi-tensor kernel's ports map onto its table and parameters.
struct MultiTensorLayout {
  /// Per input: its table column (full inputs, per-tensor scalars) or -1.
  SmallVector<int64_t> inputColumn;
  /// Per output: its table column, or the column of the input it updates.
  SmallVector<int64_t> outputColumn;
  /// Pointer bindings of scalar inputs (shared or per tensor): pointee type.
  DenseMap<unsigned, Type> pointee;
  int64_t columns = 0;
  /// Parameters besides the table: scalars not per tensor, the skip flag.
  SmallVector<Type> parameters;
  Type skipType;

  MultiTensorLayout(KernelOp kernel, const KernelAbi &abi, Type pointer) {
    MLIRContext *context = kernel.getContext();
    auto dtype = [&](StringRef name) { return abiDtype(context, name); };
    SmallVector<StringRef> inputNames(
        kernel.getInputNames().getAsValueRange<StringAttr>());
    for (auto [index, name, type] :
         llvm::enumerate(inputNames, kernel.getInputTypes())) {
      auto valueType = cast<ValueType>(type);
      int64_t column = -1;
      if (valueType.getKind() == ValueKind::Full) {
        column = columns++;
      } else if (auto it = abi.perTensorScalars.find(name.str());
                 it != abi.perTensorScalars.end()) {
        column = columns++;
        pointee[index] = dtype(it->second);
      } else if (auto it = abi.scalarPointers.find(name.str());
                 it != abi.scalarPointers.end()) {
        pointee[index] = dtype(it->second);
        parameters.push_back(pointer);
      } else {
        parameters.push_back(valueType.getElementType());
      }
      inputColumn.push_back(column);
    }
    for (StringRef name :
         kernel.getOutputNames().getAsValueRange<StringAttr>()) {
      auto it = abi.inplace.find(name.str());
      outputColumn.push_back(
          it == abi.inplace.end()
              ? columns++
              : inputColumn[llvm::find(inputNames, it->second) -
                            inputNames.begin()]);
    }
    if (!abi.skipIf.empty()) {
      skipType = dtype(abi.skipIf);
      parameters.push_back(pointer);
    }
  }
};

} // namespace

/// Reads word `word` (index) of the table as an i64.
static Value loadTableWord(OpBuilder &b, Location loc, Value table,
                           Value word) {
  Value offset = arith::IndexCastOp::create(b, loc, b.getI64Type(), word);
  Value address = LLVM::GEPOp::create(b, loc, table.getType(), b.getI64Type(),
                                      table, ValueRange{offset});
  return LLVM::LoadOp::create(b, loc, b.getI64Type(), address, 8);
}

/// Whether the flag at `pointer` (of `type`) is nonzero (a NaN counts).
static Value flagIsSet(OpBuilder &b, Location loc, Value pointer, Type type) {
  Value flag = LLVM::LoadOp::create(b, loc, type, pointer);
  if (auto floatType = dyn_cast<FloatType>(type))
    return arith::CmpFOp::create(
        b, loc, arith::CmpFPredicate::UNE, flag,
        arith::ConstantOp::create(b, loc, FloatAttr::get(floatType, 0.0)));
  return arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::ne, flag,
      arith::ConstantOp::create(b, loc, IntegerAttr::get(type, 0)));
}

namespace {

/// Emits the kernel's multi-tensor body around `emitTensor`, which runs one
/// tensor given its row base in the table, its element count and whether
/// the tensor is this thread's; shared by both targets.
class MultiTensorEmitter {
public:
  MultiTensorEmitter(KernelOp kernel, const TileConfig &config,
                     const KernelShape &shape, const MultiTensorLayout &layout,
                     RowMapping &mapping, OpBuilder &b, Type pointer)
      : kernel(kernel), config(config), layout(layout), b(b),
        loc(kernel.getLoc()), pointer(pointer),
        vector(kernel, config, shape, mapping, b),
        scalarConfig(withWidth(config, 1)),
        tail(kernel, scalarConfig, shape, mapping, b) {}

  LogicalResult checkSupported() {
    return success(succeeded(vector.checkSupported()) &&
                   succeeded(tail.checkSupported()));
  }

  /// Binds the scalar parameters (`arguments`: the function's parameters
  /// after the table); shared pointers are read here, once.
  void bindScalars(ValueRange arguments) {
    unsigned next = 0;
    for (auto [index, column] : llvm::enumerate(layout.inputColumn)) {
      if (column >= 0)
        continue;
      Value argument = arguments[next++];
      if (Type pointee = layout.pointee.lookup(index))
        argument = readScalar(b, loc, kernel, index, argument, pointee);
      bind(index, argument);
    }
  }

  /// Binds tensor `rowBase`'s columns: pointers and per-tensor scalars.
  void bindTensor(Value table, Value rowBase) {
    auto column = [&](int64_t c) -> Value {
      Value word =
          arith::AddIOp::create(b, loc, rowBase, indexConstant(b, loc, 1 + c));
      return LLVM::IntToPtrOp::create(b, loc, pointer,
                                      loadTableWord(b, loc, table, word));
    };
    for (auto [index, c] : llvm::enumerate(layout.inputColumn)) {
      if (c < 0)
        continue;
      Value address = column(c);
      Type pointee = layout.pointee.lookup(index);
      bind(index, pointee ? readScalar(b, loc, kernel, index, address, pointee)
                          : address);
    }
    for (auto [index, c] : llvm::enumerate(layout.outputColumn)) {
      Value address = column(c);
      vector.bindOutput(index, address);
      tail.bindOutput(index, address);
    }
  }

  RowProgramEmitter &vectors() { return vector; }
  RowProgramEmitter &scalars() { return tail; }

private:
  static TileConfig withWidth(TileConfig config, int64_t width) {
    config.vectorWidth = width;
    return config;
  }
  void bind(unsigned index, Value value) {
    vector.bindInput(index, value);
    tail.bindInput(index, value);
  }

  KernelOp kernel;
  const TileConfig &config;
  const MultiTensorLayout &layout;
  OpBuilder &b;
  Location loc;
  Type pointer;
  RowProgramEmitter vector;
  TileConfig scalarConfig;
  RowProgramEmitter tail;
};

} // namespace

/// The table parameter's type: 64-bit words filling the parameter space
/// the other parameters leave (KernelABI.h).
static LLVM::LLVMArrayType tableType(MLIRContext *context,
                                     const MultiTensorLayout &layout) {
  return LLVM::LLVMArrayType::get(
      IntegerType::get(context, 64),
      multiTensorTableWords(layout.parameters.size()));
}

/// Runs `body` unless the skip flag (if any) is set.
template <typename Fn>
static void unlessSkipped(OpBuilder &b, Location loc,
                          const MultiTensorLayout &layout, Value skipPointer,
                          Fn body) {
  Value run;
  if (layout.skipType)
    run = arith::XOrIOp::create(
        b, loc, flagIsSet(b, loc, skipPointer, layout.skipType),
        arith::ConstantOp::create(b, loc, b.getBoolAttr(true)));
  emitGuarded(b, loc, run, body);
}

LogicalResult lowerMultiTensorKernelToGPU(KernelOp kernel,
                                          gpu::GPUModuleOp module,
                                          const TileConfig &config,
                                          const KernelShape &shape,
                                          const KernelAbi &abi) {
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPointToEnd(module.getBody());
  Type global = LLVM::LLVMPointerType::get(context, /*addressSpace=*/1);
  MultiTensorLayout layout(kernel, abi, global);
  // The table is passed by value (byval, set on the LLVM function after
  // conversion; see Pipeline.cpp): loads from it become ld.param.
  SmallVector<Type> parameters = {LLVM::LLVMPointerType::get(context)};
  llvm::append_range(parameters, layout.parameters);
  auto function = gpu::GPUFuncOp::create(b, loc, kernel.getSymName(),
                                         b.getFunctionType(parameters, {}));
  function->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  function->setAttr(kParamTableAttr, TypeAttr::get(tableType(context, layout)));
  function.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr(
      {static_cast<int32_t>(config.threadsPerRow), 1, 1}));

  Block &entry = function.getBody().front();
  b.setInsertionPointToStart(&entry);
  Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  // One thread per lane: RowMapping's lane is the thread.
  GPURowMapping mapping(config, MathLowering::of(config, shape), thread,
                        indexConstant(b, loc, 0), Value(), 1);
  MultiTensorEmitter emitter(kernel, config, shape, layout, mapping, b, global);
  if (failed(emitter.checkSupported()))
    return failure();
  Value table = entry.getArgument(0);
  ValueRange rest = entry.getArguments().drop_front();
  LogicalResult result = success();
  unlessSkipped(b, loc, layout, layout.skipType ? rest.back() : Value(), [&] {
    emitter.bindScalars(rest);
    Value count = arith::IndexCastOp::create(
        b, loc, b.getIndexType(),
        loadTableWord(b, loc, table, indexConstant(b, loc, 0)));
    Value chunk = indexConstant(b, loc, config.chunkElements);
    Value zero = indexConstant(b, loc, 0), one = indexConstant(b, loc, 1);
    auto tensors =
        scf::ForOp::create(b, loc, zero, count, one, ValueRange{zero});
    OpBuilder::InsertionGuard insertion(b);
    b.setInsertionPointToStart(tensors.getBody());
    Value tensor = tensors.getInductionVar();
    Value firstChunk = tensors.getRegionIterArgs()[0];
    Value rowBase = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, tensor,
                              indexConstant(b, loc, layout.columns + 1)),
        one);
    Value n = arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                         loadTableWord(b, loc, table, rowBase));
    Value chunks = arith::CeilDivUIOp::create(b, loc, n, chunk);
    // This block's first chunk of the tensor: the c with
    // (firstChunk + c) % blocks == block.
    Value phase = arith::RemUIOp::create(b, loc, firstChunk, blocks);
    Value mine = arith::RemUIOp::create(
        b, loc,
        arith::SubIOp::create(
            b, loc, arith::AddIOp::create(b, loc, block, blocks), phase),
        blocks);
    Value hasWork =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, mine, chunks);
    emitGuarded(b, loc, hasWork, [&] {
      emitter.bindTensor(table, rowBase);
      if (failed(emitter.vectors().emitScalarValues())) {
        result = failure();
        return;
      }
      int64_t width = config.vectorWidth;
      Value whole = arith::MulIOp::create(
          b, loc,
          arith::DivUIOp::create(b, loc, n, indexConstant(b, loc, width)),
          indexConstant(b, loc, width));
      auto chunkLoop = scf::ForOp::create(b, loc, mine, chunks, blocks);
      OpBuilder::InsertionGuard inChunk(b);
      b.setInsertionPointToStart(chunkLoop.getBody());
      Value start =
          arith::MulIOp::create(b, loc, chunkLoop.getInductionVar(), chunk);
      auto sweep = scf::ForOp::create(
          b, loc, zero, indexConstant(b, loc, config.chunks), one);
      {
        OpBuilder::InsertionGuard inSweep(b);
        b.setInsertionPointToStart(sweep.getBody());
        // offset = start + (sweep * threads + thread) * V
        Value slot = arith::AddIOp::create(
            b, loc,
            arith::MulIOp::create(b, loc, sweep.getInductionVar(),
                                  indexConstant(b, loc, config.threadsPerRow)),
            thread);
        Value offset = arith::AddIOp::create(
            b, loc, start,
            arith::MulIOp::create(b, loc, slot, indexConstant(b, loc, width)));
        Value valid = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                            offset, whole);
        emitGuarded(b, loc, valid,
                    [&] { emitter.vectors().emitElementwiseAt(offset); });
      }
      if (width == 1)
        return;
      // The last n % V elements, one per thread, in the chunk holding them.
      Value offset = arith::AddIOp::create(b, loc, whole, thread);
      Value end = arith::AddIOp::create(b, loc, start, chunk);
      Value inTail = andConditions(
          b, loc,
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, offset, n),
          andConditions(b, loc,
                        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::uge,
                                              whole, start),
                        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                              whole, end)));
      emitGuarded(b, loc, inTail, [&] {
        if (failed(emitter.scalars().emitScalarValues())) {
          result = failure();
          return;
        }
        emitter.scalars().emitElementwiseAt(offset);
      });
    });
    scf::YieldOp::create(
        b, loc, ValueRange{arith::AddIOp::create(b, loc, firstChunk, chunks)});
  });
  b.setInsertionPointToEnd(&entry);
  gpu::ReturnOp::create(b, loc);
  return result;
}

LogicalResult lowerMultiTensorKernelToCPU(KernelOp kernel, ModuleOp module,
                                          const TileConfig &config,
                                          const KernelShape &shape,
                                          const KernelAbi &abi) {
  MLIRContext *context = kernel.getContext();
  Location loc = kernel.getLoc();
  OpBuilder b(context);
  b.setInsertionPoint(kernel);
  Type pointer = LLVM::LLVMPointerType::get(context);
  MultiTensorLayout layout(kernel, abi, pointer);
  SmallVector<Type> parameters = {pointer};
  llvm::append_range(parameters, layout.parameters);
  // Then t_begin, e_begin, t_last, e_end.
  auto function = createCPUEntry(b, loc, kernel, parameters);
  Block *entry = &function.front();
  Value tensorBegin = trailingIndex(b, loc, function, 4),
        elementBegin = trailingIndex(b, loc, function, 3),
        tensorLast = trailingIndex(b, loc, function, 2),
        elementEnd = trailingIndex(b, loc, function, 1);
  CPURowMapping mapping(b, loc);
  // Tasks start anywhere in a tensor: no access may assume alignment.
  KernelShape unaligned = shape;
  unaligned.aligned = false;
  MultiTensorEmitter emitter(kernel, config, unaligned, layout, mapping, b,
                             pointer);
  if (failed(emitter.checkSupported()))
    return failure();
  Value table = entry->getArgument(0);
  ValueRange scalars = entry->getArguments().slice(1, layout.parameters.size());
  LogicalResult result = success();
  unlessSkipped(
      b, loc, layout, layout.skipType ? scalars.back() : Value(), [&] {
        emitter.bindScalars(scalars);
        Value zero = indexConstant(b, loc, 0), one = indexConstant(b, loc, 1);
        auto tensors = scf::ForOp::create(
            b, loc, tensorBegin, arith::AddIOp::create(b, loc, tensorLast, one),
            one);
        OpBuilder::InsertionGuard insertion(b);
        b.setInsertionPointToStart(tensors.getBody());
        Value tensor = tensors.getInductionVar();
        Value rowBase = arith::AddIOp::create(
            b, loc,
            arith::MulIOp::create(b, loc, tensor,
                                  indexConstant(b, loc, layout.columns + 1)),
            one);
        Value n = arith::IndexCastOp::create(
            b, loc, b.getIndexType(), loadTableWord(b, loc, table, rowBase));
        auto is = [&](Value bound) {
          return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, tensor,
                                       bound);
        };
        Value lo = arith::SelectOp::create(b, loc, is(tensorBegin),
                                           elementBegin, zero);
        Value hi =
            arith::SelectOp::create(b, loc, is(tensorLast), elementEnd, n);
        emitter.bindTensor(table, rowBase);
        if (failed(emitter.vectors().emitScalarValues()) ||
            failed(emitter.scalars().emitScalarValues())) {
          result = failure();
          return;
        }
        Value width = indexConstant(b, loc, config.vectorWidth);
        Value whole = arith::AddIOp::create(
            b, loc, lo,
            arith::MulIOp::create(
                b, loc,
                arith::DivUIOp::create(
                    b, loc, arith::SubIOp::create(b, loc, hi, lo), width),
                width));
        auto vectors = scf::ForOp::create(b, loc, lo, whole, width);
        {
          OpBuilder::InsertionGuard inLoop(b);
          b.setInsertionPointToStart(vectors.getBody());
          emitter.vectors().emitElementwiseAt(vectors.getInductionVar());
        }
        auto rest = scf::ForOp::create(b, loc, whole, hi, one);
        OpBuilder::InsertionGuard inLoop(b);
        b.setInsertionPointToStart(rest.getBody());
        emitter.scalars().emitElementwiseAt(rest.getInductionVar());
      });
  b.setInsertionPointToEnd(entry);
  func::ReturnOp::create(b, loc);
  return result;
}

FailureOr<std::optional<MultiTensorKernel>> multiTensorKernel(KernelOp kernel) {
  FailureOr<KernelAbi> abi = getKernelAbi(kernel);
  if (failed(abi))
    return failure();
  if (!abi->multiTensor)
    return std::optional<MultiTensorKernel>();
  FailureOr<TileConfig> config = TileConfig::fromKernel(kernel);
  FailureOr<KernelShape> shape = getKernelShape(kernel);
  if (failed(config) || failed(shape))
    return failure();
  return std::optional<MultiTensorKernel>({*config, *shape, *abi});
}

} // namespace tilefuse::lowering
