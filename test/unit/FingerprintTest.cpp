//===- FingerprintTest.cpp - the cache's canonical fingerprint of a fusion -===//

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/Registration.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;

namespace {

/// The cache's fingerprint ignores how the IR is written, not what it says.
TEST(Fingerprint, IgnoresSpellingNotMeaning) {
  DialectRegistry registry;
  tilefuse::registerAllDialects(registry);
  MLIRContext context(registry);
  const char *named = R"mlir(
    // a comment
    fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
      %twice   = fuse.add %x, %x : !fuse.full<f32>
      fuse.yield %twice : !fuse.full<f32>
    })mlir";
  const char *numbered = R"mlir(
    fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
      %0 = fuse.add %x, %x : !fuse.full<f32> loc("elsewhere.py":3:1)
      fuse.yield %0 : !fuse.full<f32>
    })mlir";
  const char *different = R"mlir(
    fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
      %0 = fuse.mul %x, %x : !fuse.full<f32>
      fuse.yield %0 : !fuse.full<f32>
    })mlir";
  auto fingerprintOf = [&](const char *text) {
    OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, &context);
    EXPECT_TRUE(module);
    return module ? tilefuse::fingerprint(*module) : std::string();
  };
  EXPECT_EQ(fingerprintOf(named), fingerprintOf(numbered));
  EXPECT_NE(fingerprintOf(named), fingerprintOf(different));
  EXPECT_EQ(fingerprintOf(named).size(), 64u);
}

} // namespace
