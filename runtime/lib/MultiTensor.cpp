//===- MultiTensor.cpp - the host side of multi-tensor calls --------------===//

#include "tilefuse/Runtime/MultiTensor.h"

#include "llvm/Support/FormatVariadic.h"

using namespace tilefuse;

int64_t tilefuse::multiTensorColumns(const KernelInfo &info) {
  int64_t columns = 0;
  for (const PortInfo &port : info.inputs)
    columns += port.kind == PortInfo::Kind::Full ||
               port.binding == PortInfo::Binding::PerTensor;
  for (const PortInfo &port : info.outputs)
    columns += port.updates.empty();
  return columns;
}

int64_t tilefuse::multiTensorScalars(const KernelInfo &info) {
  return llvm::count_if(info.inputs, [](const PortInfo &port) {
    return port.kind == PortInfo::Kind::Scalar &&
           port.binding != PortInfo::Binding::PerTensor;
  });
}

llvm::Error tilefuse::checkMultiTensorCall(const KernelInfo &info,
                                           const MultiTensorCall &call) {
  int64_t columns = multiTensorColumns(info);
  if (!info.multiTensor)
    return llvm::createStringError(
        llvm::formatv("{0} is not a multi-tensor kernel", info.name));
  if (int64_t(call.pointers.size()) != columns * int64_t(call.numel.size()) ||
      int64_t(call.scalars.size()) != multiTensorScalars(info) ||
      (call.skipIf != nullptr) != !info.skipIf.empty())
    return llvm::createStringError(llvm::formatv(
        "{0}: expected {1} pointers per tensor, {2} scalars and {3} skip "
        "flag, got {4} pointers for {5} tensors, {6} scalars and {7}",
        info.name, columns, multiTensorScalars(info),
        info.skipIf.empty() ? "no" : "a", call.pointers.size(),
        call.numel.size(), call.scalars.size(),
        call.skipIf ? "a skip flag" : "none"));
  for (int64_t numel : call.numel)
    if (numel < 0)
      return llvm::createStringError(llvm::formatv(
          "{0}: a tensor has a negative element count {1}", info.name, numel));
  return llvm::Error::success();
}

std::vector<int64_t> tilefuse::multiTensorTable(const MultiTensorCall &call,
                                                int64_t columns,
                                                llvm::ArrayRef<int64_t> tensors,
                                                int64_t words) {
  std::vector<int64_t> table;
  table.reserve(std::max<int64_t>(words, 1 + tensors.size() * (columns + 1)));
  table.push_back(tensors.size());
  for (int64_t tensor : tensors) {
    table.push_back(call.numel[tensor]);
    for (int64_t c = 0; c < columns; ++c)
      table.push_back(reinterpret_cast<intptr_t>(
          call.pointers[tensor * columns + c]));
  }
  if (words > int64_t(table.size()))
    table.resize(words, 0);
  return table;
}
