//===- ColumnFinalize.cpp - the column reductions' finalize ---------------===//
//
// Shared by both targets: the finalize function's parameters, and how it
// combines the column reductions' partial rows and stores the outputs
// (KernelABI.h).
//
//===----------------------------------------------------------------------===//

#include "PredicatedLoad.h"
#include "RowProgram.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace tilefuse;
using namespace tilefuse::fuse;

namespace tilefuse::lowering {

SmallVector<std::pair<ReduceOp, Type>> columnReductions(KernelOp kernel) {
  SmallVector<std::pair<ReduceOp, Type>> result;
  auto yield = cast<YieldOp>(kernel.getEntryBlock().getTerminator());
  for (Value output : yield.getValues())
    if (valueType(output).getKind() == ValueKind::Col)
      result.push_back(
          {columnReductionOf(output), valueType(output).getElementType()});
  return result;
}

Value finalizeRowGroups(OpBuilder &b, Location loc, KernelOp kernel,
                        ValueRange arguments) {
  return arith::IndexCastOp::create(
      b, loc, b.getIndexType(), arguments[2 * columnReductions(kernel).size()]);
}

SmallVector<Value> combinePartials(OpBuilder &b, Location loc, KernelOp kernel,
                                   ValueRange arguments, Value column,
                                   int64_t n, Value first, Value count,
                                   int64_t maxCount, int64_t group,
                                   bool freezeStart) {
  auto reductions = columnReductions(kernel);
  // Per column reduction: partials[first, column], and the identity.
  SmallVector<Value> starts, identities;
  for (auto [position, entry] : llvm::enumerate(reductions)) {
    Type compute = valueType(entry.first.getInput()).getElementType();
    Value start = LLVM::GEPOp::create(
        b, loc, arguments[2 * position].getType(), compute,
        arguments[2 * position],
        ValueRange{arith::IndexCastOp::create(
            b, loc, b.getI64Type(),
            arith::AddIOp::create(
                b, loc,
                arith::MulIOp::create(b, loc, first, indexConstant(b, loc, n)),
                column))});
    starts.push_back(freezeStart ? LLVM::FreezeOp::create(b, loc, start)
                                 : start);
    identities.push_back(arith::ConstantOp::create(
        b, loc, reductionIdentity(entry.first.getKind(), compute)));
  }
  // Rows [firstRow, min(firstRow + group, count)) of every reduction's
  // partials, all loaded before any is combined; firstRow < count.
  auto combineGroup = [&](Value firstRow,
                          ValueRange carried) -> SmallVector<Value> {
    Value left = arith::SubIOp::create(b, loc, count, firstRow);
    SmallVector<Value> present;
    for (int64_t row = 1; row < group; ++row)
      present.push_back(arith::CmpIOp::create(
          b, loc, arith::CmpIPredicate::ult, indexConstant(b, loc, row), left));
    SmallVector<SmallVector<Value>> loaded(reductions.size());
    for (auto [position, entry] : llvm::enumerate(reductions)) {
      Type compute = identities[position].getType();
      Value base = LLVM::GEPOp::create(
          b, loc, starts[position].getType(), compute, starts[position],
          ValueRange{arith::IndexCastOp::create(
              b, loc, b.getI64Type(),
              arith::MulIOp::create(b, loc, firstRow,
                                    indexConstant(b, loc, n)))});
      loaded[position].push_back(LLVM::LoadOp::create(b, loc, compute, base));
      for (int64_t row = 1; row < group; ++row)
        loaded[position].push_back(predicatedLoad(
            b, loc, base, row * n * storageBytes(compute), present[row - 1],
            identities[position], storageBytes(compute), /*mayMerge=*/true));
    }
    // The group's own total first, in pairs: a partial then takes part in
    // at most 4 + 16 additions for a slice of 256 rows. A row past the
    // share adds its identity, which changes nothing (the running total
    // starts at +0, so a -0 partial is lost either way); selecting the sum
    // without it instead made ptxas wait for the first loads before it
    // issued the rest (SASS: 4 of 16 loads, then additions).
    SmallVector<Value> next;
    for (auto [position, entry] : llvm::enumerate(reductions)) {
      ReduceKind kind = entry.first.getKind();
      SmallVector<Value> terms = loaded[position];
      while (terms.size() > 1) {
        SmallVector<Value> pairs;
        for (size_t i = 0; i + 1 < terms.size(); i += 2)
          pairs.push_back(
              combineReduction(b, loc, kind, terms[i], terms[i + 1]));
        if (terms.size() % 2)
          pairs.push_back(terms.back());
        terms = std::move(pairs);
      }
      next.push_back(
          combineReduction(b, loc, kind, carried[position], terms[0]));
    }
    return next;
  };
  return emitBlockedAccumulation(
      b, loc,
      arith::CeilDivUIOp::create(b, loc, count, indexConstant(b, loc, group)),
      llvm::divideCeil(maxCount, group), identities,
      [&](Value index, ValueRange carried) {
        return combineGroup(
            arith::MulIOp::create(b, loc, index, indexConstant(b, loc, group)),
            carried);
      },
      [&](ValueRange lhs, ValueRange rhs) {
        SmallVector<Value> combined;
        for (auto [position, entry] : llvm::enumerate(reductions))
          combined.push_back(combineReduction(b, loc, entry.first.getKind(),
                                              lhs[position], rhs[position]));
        return combined;
      });
}

void storeFinalized(OpBuilder &b, Location loc, KernelOp kernel,
                    ValueRange arguments, Value column,
                    ArrayRef<Value> totals) {
  auto reductions = columnReductions(kernel);
  Value rows = arguments[2 * reductions.size() + 1];
  for (auto [position, entry, total] : llvm::enumerate(reductions, totals)) {
    auto [reduce, storage] = entry;
    Value output = arguments[2 * position + 1];
    Type compute = valueType(reduce.getInput()).getElementType();
    Value value = total;
    if (reduce.getKind() == ReduceKind::Mean)
      value = arith::DivFOp::create(
          b, loc, value, arith::SIToFPOp::create(b, loc, compute, rows));
    value = castFloat(b, loc, value, storage);
    Value column64 = arith::IndexCastOp::create(b, loc, b.getI64Type(), column);
    Value address = LLVM::GEPOp::create(b, loc, output.getType(), storage,
                                        output, ValueRange{column64});
    LLVM::StoreOp::create(b, loc, value, address);
  }
}

SmallVector<Type> finalizeParameters(KernelOp kernel, Type pointer) {
  SmallVector<Type> types(2 * columnReductions(kernel).size(), pointer);
  types.push_back(IntegerType::get(kernel.getContext(), 64)); // row_groups
  types.push_back(IntegerType::get(kernel.getContext(), 64)); // rows
  return types;
}

} // namespace tilefuse::lowering
