//===- ReciprocalDivisions.cpp - one reciprocal per row -------------------===//
//
// x / broadcast(r), r per-row, becomes x * broadcast(1 / r) (see
// Passes.td): the lowering computes per-row values once per row, so the
// division runs once per row instead of once per element.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Passes.h"

namespace tilefuse {
#define GEN_PASS_DEF_FUSERECIPROCALDIVISIONS
#include "tilefuse/Compiler/Passes.h.inc"
} // namespace tilefuse

using namespace mlir;
using namespace tilefuse::fuse;

namespace {

struct FuseReciprocalDivisionsPass
    : tilefuse::impl::FuseReciprocalDivisionsBase<
          FuseReciprocalDivisionsPass> {
  void runOnOperation() override {
    SmallVector<DivOp> divisions;
    getOperation().walk([&](DivOp division) {
      auto type = cast<ValueType>(division.getType());
      auto divisor = division.getRhs().getDefiningOp<BroadcastOp>();
      if (type.isFloat() && type.getKind() == ValueKind::Full && divisor &&
          cast<ValueType>(divisor.getInput().getType()).getKind() ==
              ValueKind::Row)
        divisions.push_back(division);
    });
    // One reciprocal per row value, however many divisions share it.
    DenseMap<Value, Value> reciprocals;
    for (DivOp division : divisions) {
      auto divisor = division.getRhs().getDefiningOp<BroadcastOp>();
      Value row = divisor.getInput();
      Value &reciprocal = reciprocals[row];
      if (!reciprocal) {
        OpBuilder b = OpBuilder::atBlockBegin(division->getBlock());
        b.setInsertionPointAfterValue(row);
        auto rowType = cast<ValueType>(row.getType());
        Value one = ConstantOp::create(b, division.getLoc(), rowType, 1.0);
        Value inverse = DivOp::create(b, division.getLoc(), rowType, one, row);
        reciprocal = BroadcastOp::create(b, division.getLoc(),
                                         division.getType(), inverse);
      }
      OpBuilder b(division);
      Value product = MulOp::create(b, division.getLoc(), division.getType(),
                                    division.getLhs(), reciprocal);
      division.replaceAllUsesWith(product);
      division.erase();
      if (divisor->use_empty())
        divisor.erase();
    }
  }
};

} // namespace
