//===- CpuExecutor.cpp - run CPU kernels with rows split over threads -----===//

#include "tilefuse/Runtime/CpuExecutor.h"
#include "tilefuse/Compiler/KernelABI.h"

#include "llvm/Support/MathExtras.h"

using namespace tilefuse;

CpuExecutor::CpuExecutor(unsigned threads)
    : pool(threads ? llvm::hardware_concurrency(threads)
                   : llvm::hardware_concurrency()) {}

template <typename Task>
void CpuExecutor::runTasks(int64_t tasks, Task runTask) {
  // The calling thread waits for the tasks. One task runs right here:
  // handing it to a worker costs more than small rows take.
  if (tasks == 1) {
    runTask(0);
    return;
  }
  llvm::ThreadPoolTaskGroup group(pool);
  for (int64_t task = 0; task < tasks; ++task)
    group.async(runTask, task);
  group.wait();
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
      packed.push_back(info.inputs[i].kind == PortInfo::Kind::Scalar &&
                               info.inputs[i].binding ==
                                   PortInfo::Binding::Value
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
  runTasks(tasks, runTask);

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

llvm::Error CpuExecutor::runMultiTensor(const KernelInfo &info,
                                        PackedFunction kernel,
                                        const MultiTensorCall &call) {
  if (llvm::Error error = checkMultiTensorCall(info, call))
    return error;
  // Tasks of rows_per_task consecutive elements, empty tensors left out:
  // (first tensor, its first element, last tensor, the end in it), tensor
  // indices into the table.
  std::vector<int64_t> tensors;
  for (size_t t = 0; t < call.numel.size(); ++t)
    if (call.numel[t] > 0)
      tensors.push_back(t);
  if (tensors.empty())
    return llvm::Error::success();
  int64_t columns = multiTensorColumns(info);
  std::vector<int64_t> table = multiTensorTable(call, columns, tensors);
  struct Task {
    int64_t tensorBegin, elementBegin, tensorLast, elementEnd;
  };
  std::vector<Task> tasks;
  int64_t perTask = std::max<int64_t>(1, info.tile.rowsPerTask);
  int64_t tensor = 0, element = 0;
  int64_t count = tensors.size();
  while (tensor < count) {
    Task task{tensor, element, tensor, element};
    for (int64_t budget = perTask; budget > 0 && tensor < count;) {
      int64_t numel = call.numel[tensors[tensor]];
      int64_t take = std::min(budget, numel - element);
      budget -= take;
      task.tensorLast = tensor;
      task.elementEnd = element + take;
      element += take;
      if (element == numel) {
        ++tensor;
        element = 0;
      }
    }
    tasks.push_back(task);
  }

  // The packed call takes the address of each argument's value.
  void *tableData = table.data();
  std::vector<void *> scalars(call.scalars.begin(), call.scalars.end());
  void *skipIf = call.skipIf;
  auto runTask = [&](int64_t index) {
    Task task = tasks[index];
    std::vector<void *> packed = {&tableData};
    size_t scalar = 0;
    for (const PortInfo &port : info.inputs) {
      if (port.kind != PortInfo::Kind::Scalar ||
          port.binding == PortInfo::Binding::PerTensor)
        continue;
      packed.push_back(port.binding == PortInfo::Binding::Value
                           ? scalars[scalar]
                           : static_cast<void *>(&scalars[scalar]));
      ++scalar;
    }
    if (skipIf)
      packed.push_back(&skipIf);
    for (int64_t *value : {&task.tensorBegin, &task.elementBegin,
                           &task.tensorLast, &task.elementEnd})
      packed.push_back(value);
    kernel(packed.data());
  };
  runTasks(tasks.size(), runTask);
  return llvm::Error::success();
}
