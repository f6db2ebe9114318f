//===- PtxPipelineTest.cpp - what PTX compiles in one process reuse --------===//

#include "tilefuse/Compiler/Pipeline.h"
#include "tilefuse/Compiler/Registration.h"

#include "Libdevice.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Linker/Linker.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

using namespace mlir;

namespace {

/// Linking a slice gives the IR that linking all of libdevice gives, to the
/// order of each value's uses.
TEST(PtxPipeline, LibdeviceSliceLinksWhatAllOfLibdeviceLinks) {
  llvm::Expected<std::string> path = tilefuse::findLibdevice();
  ASSERT_TRUE(bool(path)) << llvm::toString(path.takeError());
  auto bitcode = llvm::MemoryBuffer::getFile(*path);
  ASSERT_TRUE(bool(bitcode));
  // A module declaring three functions; sinf uses an internal table and a
  // named struct type, and all three call __nvvm_reflect with private
  // strings. Each module in its own context, as each compile has one.
  auto moduleDeclaring = [](llvm::LLVMContext &context) {
    auto module = std::make_unique<llvm::Module>("kernels", context);
    llvm::Type *f32 = llvm::Type::getFloatTy(context);
    auto *unary = llvm::FunctionType::get(f32, {f32}, false);
    for (const char *name : {"__nv_erff", "__nv_logf", "__nv_sinf"})
      module->getOrInsertFunction(name, unary);
    return module;
  };
  auto printed = [](const llvm::Module &module) {
    std::string text;
    llvm::raw_string_ostream os(text);
    module.print(os, nullptr, /*ShouldPreserveUseListOrder=*/true);
    return text;
  };

  llvm::LLVMContext directContext;
  std::unique_ptr<llvm::Module> direct = moduleDeclaring(directContext);
  auto library =
      llvm::parseBitcodeFile((*bitcode)->getMemBufferRef(), directContext);
  ASSERT_TRUE(bool(library)) << llvm::toString(library.takeError());
  (*library)->setTargetTriple(direct->getTargetTriple());
  (*library)->setDataLayout(direct->getDataLayout());
  ASSERT_FALSE(llvm::Linker::linkModules(*direct, std::move(*library),
                                         llvm::Linker::Flags::LinkOnlyNeeded));
  for (llvm::Function &function : *direct)
    if (!function.isDeclaration())
      function.setLinkage(llvm::GlobalValue::InternalLinkage);

  tilefuse::Libdevice libdevice(std::move(*bitcode));
  for (int time = 0; time < 2; ++time) { // the slice cut, then reused
    llvm::LLVMContext context;
    std::unique_ptr<llvm::Module> sliced = moduleDeclaring(context);
    llvm::Error error = libdevice.linkInto(*sliced);
    ASSERT_FALSE(bool(error)) << llvm::toString(std::move(error));
    EXPECT_EQ(printed(*sliced), printed(*direct)) << "time " << time;
  }
}

/// A kernel compiled again after kernels declaring the same or other sets
/// of libdevice functions gets the PTX it got the first time.
TEST(PtxPipeline, ReusedLibdeviceSlicesGiveTheSamePtx) {
  DialectRegistry registry;
  tilefuse::registerAllDialects(registry);
  tilefuse::registerAllPasses();
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  const char *fusions[] = {"swiglu_fwd",        "geglu_fwd",
                           "geglu_tanh_fwd",    "cross_entropy_fwd",
                           "adamw_step",        "rms_norm_bwd"};
  auto ptxOf = [&](const std::string &fusion) -> std::string {
    OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(
        std::string(TILEFUSE_FUSIONS_DIR) + "/" + fusion + ".mlir", &context);
    EXPECT_TRUE(module) << fusion;
    if (!module)
      return "";
    tilefuse::CompileOptions options;
    options.dtype = "bf16";
    options.n = 4096;
    auto result = tilefuse::compile(*module, options, tilefuse::Stage::PTX);
    EXPECT_TRUE(succeeded(result)) << fusion;
    return succeeded(result) ? result->text : "";
  };
  std::map<std::string, std::string> first;
  for (const char *fusion : fusions)
    first[fusion] = ptxOf(fusion);
  for (auto it = std::rbegin(fusions); it != std::rend(fusions); ++it) {
    EXPECT_EQ(ptxOf(*it), first[*it]) << *it;
  }
}

} // namespace

TEST(PtxPipeline, MinBlocksPerSMFollowsTheEntrysMaxntid) {
  std::string ptx = ".visible .entry k_finalize(\n\t.param .u64 p\n)\n"
                    ".maxntid 256, 1, 1\n{\n\tret;\n}\n"
                    ".visible .entry k(\n\t.param .u64 p\n)\n"
                    ".maxntid 512, 1, 1\n{\n\tret;\n}\n";
  llvm::Expected<std::string> asked = tilefuse::withMinBlocksPerSM(ptx, "k", 2);
  ASSERT_TRUE(static_cast<bool>(asked)) << llvm::toString(asked.takeError());
  // Only `k` asks (not k_finalize, whose name it begins), on its own line.
  EXPECT_EQ(*asked, ".visible .entry k_finalize(\n\t.param .u64 p\n)\n"
                    ".maxntid 256, 1, 1\n{\n\tret;\n}\n"
                    ".visible .entry k(\n\t.param .u64 p\n)\n"
                    ".maxntid 512, 1, 1\n.minnctapersm 2\n{\n\tret;\n}\n");

  // After a .reqntid as well.
  llvm::Expected<std::string> required = tilefuse::withMinBlocksPerSM(
      ".visible .entry k(\n)\n.reqntid 256, 1, 1\n{\n}\n", "k", 4);
  ASSERT_TRUE(static_cast<bool>(required))
      << llvm::toString(required.takeError());
  EXPECT_EQ(
      *required,
      ".visible .entry k(\n)\n.reqntid 256, 1, 1\n.minnctapersm 4\n{\n}\n");

  // Asking twice, an entry without a block size or a missing entry fails.
  for (auto [text, entry] :
       {std::pair{*asked, "k"}, std::pair{ptx, "absent"},
        std::pair{std::string(".visible .entry k(\n)\n{\n}\n"), "k"}}) {
    llvm::Expected<std::string> failed =
        tilefuse::withMinBlocksPerSM(text, entry, 2);
    ASSERT_FALSE(static_cast<bool>(failed)) << entry;
    EXPECT_NE(
        llvm::toString(failed.takeError())
            .find(std::string("cannot ask ptxas for 2 blocks per SM of ") +
                  entry),
        std::string::npos);
  }
}

TEST(PtxPipeline, BlocksPerSMGoalIs1024ThreadsOfRowGroupKernels) {
  tilefuse::TileConfig config;
  config.target = "sm_90";
  config.threadsPerRow = 64;
  config.rowsPerBlock = 4;
  EXPECT_EQ(tilefuse::blocksPerSMGoal(config), 4);
  config.rowsPerBlock = 8;
  EXPECT_EQ(tilefuse::blocksPerSMGoal(config), 2);
  config.rowsPerBlock = 16;
  EXPECT_EQ(tilefuse::blocksPerSMGoal(config), 0); // one block is the goal
  config.rowsPerBlock = 4;
  config.blocksPerSM = 2; // a persistent grid: its tile decides
  EXPECT_EQ(tilefuse::blocksPerSMGoal(config), 0);
  config.blocksPerSM = 0;
  config.stageBytes = 16384; // shared memory bounds it
  EXPECT_EQ(tilefuse::blocksPerSMGoal(config), 0);
  config.stageBytes = 0;
  config.target = "cpu";
  EXPECT_EQ(tilefuse::blocksPerSMGoal(config), 0);
}
