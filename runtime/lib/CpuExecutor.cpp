//===- CpuExecutor.cpp - run CPU kernels with rows split over threads -----===//

#include "tilefuse/Runtime/CpuExecutor.h"
#include "tilefuse/Compiler/KernelABI.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/MathExtras.h"

using namespace tilefuse;

CpuExecutor::CpuExecutor(unsigned threads)
    : pool(threads ? llvm::hardware_concurrency(threads)
                   : llvm::hardware_concurrency()) {}

static size_t dtypeBytes(llvm::StringRef dtype) {
  return llvm::StringSwitch<size_t>(dtype)
      .Cases("f64", "i64", 8)
      .Cases("f32", "i32", 4)
      .Cases("f16", "bf16", 2)
      .Default(1);
}

llvm::Error CpuExecutor::run(const KernelInfo &info, PackedFunction kernel,
                             PackedFunction finalize,
                             llvm::ArrayRef<void *> arguments, int64_t rows) {
  size_t expected = info.inputs.size() + info.outputs.size();
  if (arguments.size() != expected)
    return llvm::createStringError(
        "%s: expected %zu arguments (inputs then outputs), got %zu",
        info.name.c_str(), expected, arguments.size());
  if (rows < 0)
    return llvm::createStringError("%s: rows must be >= 0, got %lld",
                                   info.name.c_str(),
                                   static_cast<long long>(rows));
  // Tasks of rowsPerTask rows; with column reductions each task runs its
  // rows in row groups of at most kCpuRowsPerPartial, each accumulating
  // into its own partials row (the finalize adds them up in blocks).
  int64_t rowsPerTask = std::max<int64_t>(1, info.tile.rowsPerTask);
  int64_t rowsPerGroup = info.hasColumnReduction()
                             ? std::min(rowsPerTask, kCpuRowsPerPartial)
                             : rowsPerTask;
  int64_t groupsPerTask = std::max<int64_t>(1, rowsPerTask / rowsPerGroup);
  int64_t groups = std::max<int64_t>(1, llvm::divideCeil(rows, rowsPerGroup));
  int64_t tasks = llvm::divideCeil(groups, groupsPerTask);

  // The pointer arguments, by value: the packed call takes their addresses.
  // Column-reduction outputs get a partials buffer, one row per row group.
  std::vector<void *> pointers(expected);
  std::vector<std::vector<char>> partials;
  for (size_t i = 0; i < info.inputs.size(); ++i)
    pointers[i] = arguments[i];
  for (size_t o = 0; o < info.outputs.size(); ++o) {
    const PortInfo &output = info.outputs[o];
    size_t slot = info.inputs.size() + o;
    pointers[slot] = arguments[slot];
    if (output.kind == PortInfo::Kind::Col) {
      partials.emplace_back(groups * info.n * dtypeBytes(output.accumulatorDtype));
      pointers[slot] = partials.back().data();
    }
  }

  auto runTask = [&](int64_t task) {
    int64_t rowsArg = rows, begin = 0, end = 0, group = 0;
    std::vector<void *> packed;
    packed.reserve(expected + 4);
    for (size_t i = 0; i < info.inputs.size(); ++i)
      packed.push_back(info.inputs[i].kind == PortInfo::Kind::Scalar
                           ? arguments[i]
                           : static_cast<void *>(&pointers[i]));
    for (size_t o = 0; o < info.outputs.size(); ++o)
      packed.push_back(&pointers[info.inputs.size() + o]);
    for (int64_t *value : {&rowsArg, &begin, &end, &group})
      packed.push_back(value);
    for (group = task * groupsPerTask;
         group < std::min(groups, (task + 1) * groupsPerTask); ++group) {
      begin = group * rowsPerGroup;
      end = std::min(rows, begin + rowsPerGroup);
      kernel(packed.data());
    }
  };
  // A task per row range; the calling thread waits for them. One task runs
  // right here: handing it to a worker costs more than small rows take.
  if (tasks == 1) {
    runTask(0);
  } else {
    llvm::ThreadPoolTaskGroup group(pool);
    for (int64_t task = 0; task < tasks; ++task)
      group.async(runTask, task);
    group.wait();
  }

  if (!info.hasColumnReduction())
    return llvm::Error::success();
  std::vector<void *> pairs;
  for (size_t o = 0; o < info.outputs.size(); ++o)
    if (info.outputs[o].kind == PortInfo::Kind::Col) {
      pairs.push_back(pointers[info.inputs.size() + o]);
      pairs.push_back(arguments[info.inputs.size() + o]);
    }
  int64_t rowGroups = groups, rowsArg = rows;
  std::vector<void *> packed;
  for (void *&pointer : pairs)
    packed.push_back(&pointer);
  packed.push_back(&rowGroups);
  packed.push_back(&rowsArg);
  finalize(packed.data());
  return llvm::Error::success();
}
