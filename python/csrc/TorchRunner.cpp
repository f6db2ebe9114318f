//===- TorchRunner.cpp - run a fusion on PyTorch tensors ------------------===//

#include "TorchRunner.h"

#include "tilefuse/Kernels/Builtins.h"
#include "tilefuse/Runtime/CudaDriver.h"
#include "tilefuse/Runtime/Fusion.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

using namespace tilefuse;

namespace {

using torch_ops::scalarType;

/// fuse element type names and the torch dtypes they store.
constexpr std::pair<const char *, at::ScalarType> kDtypes[] = {
    {"f32", at::kFloat},  {"f16", at::kHalf}, {"bf16", at::kBFloat16},
    {"f64", at::kDouble}, {"i64", at::kLong}, {"i32", at::kInt},
    {"i1", at::kBool}};

/// The fuse name of a torch dtype; nullptr for one fuse has no name for.
const char *dtypeName(at::ScalarType type) {
  for (auto [name, dtype] : kDtypes)
    if (dtype == type)
      return name;
  return nullptr;
}

/// The shape of a `kind` tensor (sizes as int64_t, or c10::SymInt for a
/// Meta kernel's symbolic shapes); on the stack for up to 5 leading dims
/// (it is built per tensor per call).
template <typename Size>
c10::SmallVector<Size, 6> shapeOf(PortInfo::Kind kind, const Size &n,
                                  c10::ArrayRef<Size> lead) {
  if (kind == PortInfo::Kind::Col)
    return {n};
  c10::SmallVector<Size, 6> shape(lead.begin(), lead.end());
  if (kind == PortInfo::Kind::Full)
    shape.push_back(n);
  return shape;
}

/// TILEFUSE_TARGET, checked: an unknown value is an error naming `op`.
const TargetSelection &target(std::string_view op) {
  const TargetSelection &selection = selectedTarget();
  TORCH_CHECK(selection.error.empty(), "tilefuse.", op, ": ", selection.error);
  return selection;
}

} // namespace

bool tilefuse::torch_ops::runsGPUCode(std::string_view op,
                                      const at::Device &device) {
  return !device.is_cpu() || target(op).kind == TargetSelection::Kind::Emulate;
}

namespace {

bool isStoredPort(const PortInfo &port) {
  return (port.kind == PortInfo::Kind::Full ||
          port.kind == PortInfo::Kind::Col) &&
         at::isFloatingType(scalarType(port.dtype));
}

/// The storage spec of a call (KernelABI: "bf16" or "bf16,exp_avg=f32"):
/// `storage`, then each stored port whose float tensor has another dtype.
std::string storageSpec(const Fusion &fusion, at::ScalarType storage,
                        at::TensorList tensors, at::TensorList out) {
  std::string spec = dtypeName(storage);
  auto add = [&](const PortInfo &port, const at::Tensor &tensor) {
    at::ScalarType type = tensor.scalar_type();
    if (isStoredPort(port) && type != storage && at::isFloatingType(type) &&
        dtypeName(type))
      spec += "," + port.name + "=" + dtypeName(type);
  };
  const at::Tensor *tensor = tensors.begin();
  for (const PortInfo &port : fusion.inputs())
    if (port.kind != PortInfo::Kind::Scalar && tensor != tensors.end())
      add(port, *tensor++);
  for (auto [port, tensor] : llvm::zip(fusion.outputs(), out))
    if (tensor.defined())
      add(port, tensor);
  return spec;
}

/// The driver (the PTX emulator's under TILEFUSE_TARGET=emulate) and the
/// compile target of `device`.
std::pair<CudaDriver *, std::string> gpuTarget(std::string_view op,
                                               const at::Device &device) {
  bool emulate = target(op).kind == TargetSelection::Kind::Emulate;
  TORCH_CHECK(target(op).kind != TargetSelection::Kind::Cpu, "tilefuse.", op,
              ": TILEFUSE_TARGET=cpu needs CPU tensors, got ", device);
  llvm::Expected<CudaDriver &> driver = CudaDriver::global();
  TORCH_CHECK(static_cast<bool>(driver), "tilefuse.", op, ": ",
              emulate ? "TILEFUSE_TARGET=emulate needs the PTX emulator: "
                      : "CUDA tensors need the CUDA driver: ",
              llvm::toString(driver.takeError()));
  llvm::Expected<std::string> chip =
      driver->target(emulate ? 0 : device.index());
  TORCH_CHECK(static_cast<bool>(chip), "tilefuse.", op, ": ",
              llvm::toString(chip.takeError()));
  return {&*driver, *chip};
}

/// Whether a symbolic size condition holds, without deciding an unbacked
/// size (a runtime assert instead, as TORCH_SYM_CHECK).
bool holds(const c10::SymBool &condition) {
  return condition.expect_true(__FILE__, __LINE__);
}
template <typename Size>
bool sameSizes(c10::ArrayRef<Size> a, c10::ArrayRef<Size> b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if constexpr (std::is_same_v<Size, c10::SymInt>) {
      if (!holds(a[i].sym_eq(b[i])))
        return false;
    } else if (a[i] != b[i]) {
      return false;
    }
  return true;
}

/// Checks `tensor` against `port`, of dtype `expected`, of a kernel over
/// (lead, n).
template <typename Size>
void checkTensor(std::string_view op, const char *role, const PortInfo &port,
                 at::ScalarType expected, const at::Tensor &tensor,
                 const at::Device &device, const Size &n,
                 c10::ArrayRef<Size> lead) {
  TORCH_CHECK_VALUE(tensor.defined(), "tilefuse.", op, ": ", role, " '",
                    port.name, "' is missing");
  TORCH_CHECK_VALUE(tensor.device() == device, "tilefuse.", op, ": ", role,
                    " '", port.name, "' is on ", tensor.device(),
                    " but the other tensors are on ", device);
  TORCH_CHECK_TYPE(tensor.scalar_type() == expected, "tilefuse.", op, ": ",
                   role, " '", port.name, "' must be ", expected, ", got ",
                   tensor.scalar_type());
  c10::ArrayRef<Size> sizes;
  if constexpr (std::is_same_v<Size, c10::SymInt>)
    sizes = tensor.sym_sizes();
  else
    sizes = tensor.sizes();
  auto shape = shapeOf(port.kind, n, lead);
  TORCH_CHECK_VALUE(sameSizes(sizes, c10::ArrayRef<Size>(shape)), "tilefuse.",
                    op, ": ", role, " '", port.name, "' must have shape ",
                    c10::ArrayRef<Size>(shape), " (",
                    PortInfo::kindName(port.kind).str(), "), got ", sizes);
  TORCH_CHECK_VALUE(tensor.is_contiguous(), "tilefuse.", op, ": ", role, " '",
                    port.name, "' must be contiguous");
}

/// A [..., n] iteration space of at least one column.
template <typename Size>
void checkIterationShape(std::string_view op, c10::ArrayRef<Size> shape) {
  bool positive;
  if constexpr (std::is_same_v<Size, c10::SymInt>)
    positive = !shape.empty() && holds(shape.back().sym_gt(0));
  else
    positive = !shape.empty() && shape.back() > 0;
  TORCH_CHECK_VALUE(positive, "tilefuse.", op,
                    ": the input must have a last dimension of at least 1, "
                    "got shape ",
                    shape);
}

/// At least one row where `fusion` reduces columns by max or min (as
/// torch.amax(x, 0)).
template <typename Size>
void checkRowsForColumnExtremes(std::string_view op, const Fusion &fusion,
                                c10::ArrayRef<Size> lead) {
  if (fusion.columnExtreme().empty())
    return;
  for (const Size &size : lead) {
    bool positive;
    if constexpr (std::is_same_v<Size, c10::SymInt>)
      positive = holds(size.sym_gt(0));
    else
      positive = size > 0;
    TORCH_CHECK_INDEX(positive, "tilefuse.", op, ": ", fusion.columnExtreme(),
                      " over the rows (dim=0) of zero rows: expected "
                      "reduction dim 0 to have non-zero size");
  }
}

/// `fusion` takes `tensors` and `scalars` (by value or by pointer).
void checkArgumentCounts(std::string_view op, const Fusion &fusion,
                         size_t tensors, size_t scalars) {
  const std::vector<PortInfo> &declared = fusion.inputs();
  size_t scalarPorts = llvm::count_if(declared, [](const PortInfo &port) {
    return port.kind == PortInfo::Kind::Scalar;
  });
  TORCH_CHECK(tensors == declared.size() - scalarPorts &&
                  scalars == scalarPorts && tensors > 0,
              "tilefuse.", op, ": ", fusion.name(), " takes ",
              declared.size() - scalarPorts, " tensors and ", scalarPorts,
              " scalars, got ", tensors, " and ", scalars);
}

/// A scalar read through a pointer: one element of a supported dtype on
/// `device`.
void checkScalarTensor(std::string_view op, const std::string &name,
                       const at::Tensor &tensor, const at::Device &device) {
  TORCH_CHECK_VALUE(tensor.numel() == 1, "tilefuse.", op, ": scalar '", name,
                    "' given as a tensor must have one element, got shape ",
                    tensor.sizes());
  TORCH_CHECK_TYPE(dtypeName(tensor.scalar_type()), "tilefuse.", op,
                   ": scalar '", name, "' has unsupported dtype ",
                   tensor.scalar_type());
  TORCH_CHECK_VALUE(tensor.device() == device, "tilefuse.", op, ": scalar '",
                    name, "' is on ", tensor.device(),
                    " but the tensors are on ", device);
}

/// The narrowest dtype of a fusion's full and per-column float ports (f32
/// if none), as fuse-specialize{dtype=declared} finds it.
at::ScalarType narrowestStorage(const Fusion &fusion) {
  at::ScalarType narrowest = at::kFloat;
  for (const auto *ports : {&fusion.inputs(), &fusion.outputs()})
    for (const PortInfo &port : *ports) {
      at::ScalarType type = scalarType(port.dtype);
      if (isStoredPort(port) &&
          c10::elementSize(type) < c10::elementSize(narrowest))
        narrowest = type;
    }
  return narrowest;
}

/// `value`'s bytes at the start of an 8-byte slot.
template <typename T> int64_t slotOf(T value) {
  static_assert(sizeof(T) <= sizeof(int64_t));
  int64_t slot = 0;
  std::memcpy(&slot, &value, sizeof(T));
  return slot;
}

/// `scalar` in an 8-byte slot, typed as `port` declares it (checked by
/// checkScalar).
int64_t scalarSlot(std::string_view op, const PortInfo &port,
                   const c10::Scalar &scalar) {
  torch_ops::checkScalar(op, port, scalar);
  if (port.dtype == "f32")
    return slotOf(static_cast<float>(scalar.toDouble()));
  if (port.dtype == "f64")
    return slotOf(scalar.toDouble());
  int64_t value = scalar.toLong();
  return port.dtype == "i32" ? slotOf(static_cast<int32_t>(value)) : value;
}

/// A float as Python writes it: 2.7, -2.0, inf.
std::string floatText(double value) {
  std::string text = c10::str(value);
  if (std::isfinite(value) && text.find_first_of(".e") == std::string::npos)
    text += ".0";
  return text;
}

} // namespace

at::ScalarType torch_ops::scalarType(const std::string &dtype) {
  for (auto [name, type] : kDtypes)
    if (dtype == name)
      return type;
  TORCH_CHECK_TYPE(false, "tilefuse: no torch dtype for '", dtype, "'");
}

bool torch_ops::mayAliasWritten(const at::Tensor &written,
                                const at::Tensor &other, bool otherWritten) {
  at::MemOverlapStatus status = at::get_overlap_status(written, other);
  return status != at::MemOverlapStatus::Partial &&
         (status != at::MemOverlapStatus::Full || !otherWritten);
}

void torch_ops::checkScalar(std::string_view op, const PortInfo &port,
                            const c10::Scalar &scalar) {
  if (scalar.isSymbolic())
    return; // traced: checked when the call runs
  TORCH_CHECK_TYPE(!scalar.isComplex(), "tilefuse.", op, ": scalar '",
                   port.name, "' is complex; the fusion takes ", port.dtype);
  if (port.dtype == "f32" || port.dtype == "f64") {
    double value = scalar.toDouble();
    TORCH_CHECK_VALUE(port.dtype == "f64" || !std::isfinite(value) ||
                          std::abs(value) <= FLT_MAX,
                      "tilefuse.", op, ": scalar '", port.name, "' = ", value,
                      " is out of range for float32");
    return;
  }
  bool i32 = port.dtype == "i32";
  TORCH_CHECK_TYPE(i32 || port.dtype == "i64", "tilefuse.", op, ": scalar '",
                   port.name, "' has unsupported dtype ", port.dtype);
  // As torch's int arguments: no float, and no value beyond the type.
  TORCH_CHECK_TYPE(!scalar.isFloatingPoint(), "tilefuse.", op, ": scalar '",
                   port.name, "' = ", floatText(scalar.toDouble()),
                   " is a float; the fusion takes an integer (", port.dtype,
                   ")");
  // An integral Scalar holds an int64 or, past INT64_MAX, a uint64.
  if (scalar.isUnsigned() && scalar.to<uint64_t>() > uint64_t(INT64_MAX))
    TORCH_CHECK_VALUE(false, "tilefuse.", op, ": scalar '", port.name,
                      "' = ", scalar.to<uint64_t>(), " does not fit in ",
                      i32 ? "int32" : "int64");
  int64_t value = scalar.toLong();
  TORCH_CHECK_VALUE(!i32 || (value >= INT32_MIN && value <= INT32_MAX),
                    "tilefuse.", op, ": scalar '", port.name, "' = ", value,
                    " does not fit in int32");
}

std::vector<at::Tensor>
torch_ops::runFusion(std::string_view op, Fusion &fusion,
                     at::TensorList tensors, c10::ArrayRef<c10::Scalar> scalars,
                     std::optional<at::ScalarType> storage,
                     at::IntArrayRef shape, at::TensorList out,
                     bool storagePerTensor,
                     c10::ArrayRef<std::optional<at::Tensor>> scalarTensors) {
  checkIterationShape(op, shape);
  int64_t n = shape.back();
  at::IntArrayRef lead = shape.slice(0, shape.size() - 1);
  const std::vector<PortInfo> &declared = fusion.inputs();
  size_t scalarPorts = llvm::count_if(declared, [](const PortInfo &port) {
    return port.kind == PortInfo::Kind::Scalar;
  });
  TORCH_CHECK(scalarTensors.empty() || scalarTensors.size() == scalarPorts,
              "tilefuse.", op, ": expected ", scalarPorts,
              " scalar tensor slots, got ", scalarTensors.size());
  size_t byPointer = llvm::count_if(
      scalarTensors, [](const auto &tensor) { return tensor.has_value(); });
  checkArgumentCounts(op, fusion, tensors.size(), scalars.size() + byPointer);
  checkRowsForColumnExtremes(op, fusion, lead);
  TORCH_CHECK(out.empty() || out.size() == fusion.outputs().size(), "tilefuse.",
              op, ": expected ", fusion.outputs().size(), " output slots, got ",
              out.size());
  const char *storageName = storage ? dtypeName(*storage) : "declared";
  TORCH_CHECK_TYPE(storageName && (!storage || at::isFloatingType(*storage)),
                   "tilefuse.", op, ": unsupported storage dtype ", *storage);
  at::Device device = tensors.front().device();
  TORCH_INTERNAL_ASSERT(storage || !storagePerTensor,
                        "per-tensor storage needs a default dtype");
  std::string spec = storagePerTensor
                         ? storageSpec(fusion, *storage, tensors, out)
                         : std::string(storageName);

  // The specialization: 16-byte vectors need n and every pointer aligned;
  // the narrowest stored float sets the vector width.
  int64_t vector =
      16 / c10::elementSize(storage ? *storage : narrowestStorage(fusion));
  bool aligned = n % vector == 0;
  for (const at::Tensor &tensor : tensors)
    aligned =
        aligned && reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0;
  for (const at::Tensor &tensor : out)
    aligned =
        aligned && (!tensor.defined() ||
                    reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0);

  // Scalars bound by pointer: a one-element tensor on the same device.
  KernelAbi abi;
  if (!scalarTensors.empty()) {
    const std::optional<at::Tensor> *slot = scalarTensors.begin();
    for (const PortInfo &port : declared) {
      if (port.kind != PortInfo::Kind::Scalar)
        continue;
      if (const std::optional<at::Tensor> &tensor = *slot++) {
        checkScalarTensor(op, port.name, *tensor, tensors.front().device());
        abi.scalarPointers[port.name] = dtypeName(tensor->scalar_type());
      }
    }
  }

  CudaDriver *driver = nullptr;
  std::shared_ptr<const CpuKernel> cpuKernel;
  std::shared_ptr<const GpuKernel> gpuKernel;
  std::optional<c10::DeviceGuard> guard;
  // Under TILEFUSE_TARGET=emulate, CPU tensors take the GPU path: PTX,
  // CudaDriver, the PTX emulator (host pointers are its device pointers).
  bool emulate = target(op).kind == TargetSelection::Kind::Emulate;
  if (device.is_cpu() && !emulate) {
    auto kernel = fusion.cpuKernel(spec, n, aligned, abi);
    TORCH_CHECK(static_cast<bool>(kernel), "tilefuse.", op, ": ",
                llvm::toString(kernel.takeError()));
    cpuKernel = *kernel;
  } else {
    if (emulate) {
      TORCH_CHECK(device.is_cpu(), "tilefuse.", op,
                  ": TILEFUSE_TARGET=emulate runs CPU tensors in the PTX "
                  "emulator, got ",
                  device);
    } else {
      TORCH_CHECK(device.is_cuda(), "tilefuse.", op, ": unsupported device ",
                  device);
      guard.emplace(device);
    }
    auto [gpu, chip] = gpuTarget(op, device);
    driver = gpu;
    auto kernel = fusion.gpuKernel(spec, n, aligned, chip, abi);
    TORCH_CHECK(static_cast<bool>(kernel), "tilefuse.", op, ": ",
                llvm::toString(kernel.takeError()));
    gpuKernel = *kernel;
  }
  const KernelInfo &info = cpuKernel ? cpuKernel->info() : gpuKernel->info;

  std::vector<int64_t> slots(info.inputs.size());
  std::vector<void *> arguments;
  arguments.reserve(info.inputs.size() + info.outputs.size());
  const at::Tensor *tensor = tensors.begin();
  const c10::Scalar *scalar = scalars.begin();
  const std::optional<at::Tensor> *scalarTensor = scalarTensors.begin();
  for (auto i : c10::irange(info.inputs.size())) {
    const PortInfo &port = info.inputs[i];
    if (port.kind == PortInfo::Kind::Scalar) {
      if (port.binding == PortInfo::Binding::Pointer) {
        arguments.push_back((*scalarTensor++)->data_ptr());
        continue;
      }
      if (!scalarTensors.empty())
        ++scalarTensor;
      slots[i] = scalarSlot(op, port, *scalar++);
      arguments.push_back(&slots[i]);
      continue;
    }
    checkTensor(op, "input", port, scalarType(port.dtype), *tensor, device, n,
                lead);
    arguments.push_back(tensor++->data_ptr());
  }
  std::vector<at::Tensor> outputs;
  for (auto i : c10::irange(info.outputs.size())) {
    const PortInfo &port = info.outputs[i];
    if (!out.empty() && out[i].defined()) {
      checkTensor(op, "output", port, scalarType(port.dtype), out[i], device, n,
                  lead);
      outputs.push_back(out[i]);
    } else {
      outputs.push_back(at::empty(
          shapeOf<int64_t>(port.kind, n, lead),
          at::TensorOptions().dtype(scalarType(port.dtype)).device(device)));
    }
    arguments.push_back(outputs.back().data_ptr());
  }
  int64_t rows = c10::multiply_integers(lead);

  if (cpuKernel) {
    llvm::Error error =
        cpuKernel->run(Runtime::global().executor(), arguments, rows);
    TORCH_CHECK(!error, "tilefuse.", op, ": ",
                llvm::toString(std::move(error)));
    return outputs;
  }
  // Column reductions leave partials in their compute type, one row per
  // block or per row group (CudaDriver::partialRows).
  int deviceIndex = emulate ? 0 : device.index();
  std::vector<at::Tensor> workspaces;
  std::vector<void *> workspacePointers;
  if (info.hasColumnReduction()) {
    llvm::Expected<int64_t> groups =
        driver->partialRows(gpuKernel, rows, deviceIndex);
    TORCH_CHECK(static_cast<bool>(groups), "tilefuse.", op, ": ",
                llvm::toString(groups.takeError()));
    for (const PortInfo &port : info.outputs) {
      if (port.kind != PortInfo::Kind::Col)
        continue;
      workspaces.push_back(
          at::empty({std::max<int64_t>(*groups, 1), n},
                    at::TensorOptions()
                        .dtype(scalarType(port.accumulatorDtype))
                        .device(device)));
      workspacePointers.push_back(workspaces.back().data_ptr());
    }
  }
  if (emulate) {
    // The emulator checks every access against the tensors' extents.
    std::vector<std::string> names;
    for (const PortInfo &port : info.outputs)
      if (port.kind == PortInfo::Kind::Col)
        names.push_back(port.name + " (partials)");
    std::vector<CudaDriver::Buffer> extents;
    const at::Tensor *input = tensors.begin();
    for (auto [i, port] : llvm::enumerate(info.inputs)) {
      if (port.binding == PortInfo::Binding::Pointer) {
        extents.push_back({port.name.c_str(), arguments[i],
                           c10::elementSize(scalarType(port.pointee))});
        continue;
      }
      if (port.kind == PortInfo::Kind::Scalar) {
        extents.push_back({port.name.c_str(), nullptr, 0});
        continue;
      }
      extents.push_back(
          {port.name.c_str(), input->data_ptr(), input->nbytes()});
      ++input;
    }
    for (auto i : c10::irange(info.outputs.size()))
      extents.push_back({info.outputs[i].name.c_str(), outputs[i].data_ptr(),
                         outputs[i].nbytes()});
    for (auto i : c10::irange(workspaces.size()))
      extents.push_back(
          {names[i].c_str(), workspaces[i].data_ptr(), workspaces[i].nbytes()});
    llvm::Error error = driver->launch(gpuKernel, arguments, workspacePointers,
                                       rows, deviceIndex, nullptr, extents);
    TORCH_CHECK(!error, "tilefuse.", op, ": ",
                llvm::toString(std::move(error)));
    return outputs;
  }
  c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
  void *stream = cuda.getStream(device).native_handle();
  llvm::Error error = driver->launch(gpuKernel, arguments, workspacePointers,
                                     rows, device.index(), stream);
  TORCH_CHECK(!error, "tilefuse.", op, ": ", llvm::toString(std::move(error)));
  return outputs;
}


namespace {

/// The target a call runs on: the CPU, or the GPU code through CudaDriver
/// (a real GPU or, under TILEFUSE_TARGET=emulate, the PTX emulator).
struct Placement {
  CudaDriver *driver = nullptr; // null: the CPU target
  std::string chip;
  int deviceIndex = 0;
  void *stream = nullptr;
};

Placement placementFor(std::string_view op, const at::Device &device) {
  bool emulate = target(op).kind == TargetSelection::Kind::Emulate;
  if (device.is_cpu() && !emulate)
    return {};
  TORCH_CHECK(emulate ? device.is_cpu() : device.is_cuda(), "tilefuse.", op,
              emulate ? ": TILEFUSE_TARGET=emulate runs CPU tensors in the "
                        "PTX emulator, got "
                      : ": unsupported device ",
              device);
  auto [driver, chip] = gpuTarget(op, device);
  Placement placement{driver, chip};
  if (!emulate) {
    placement.deviceIndex = device.index();
    c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    placement.stream = cuda.getStream(device).native_handle();
  }
  return placement;
}

/// One row set's tensors, laid out alike, and what groups it.
struct RowSet {
  std::vector<at::Tensor> tensors; // per input port (undefined for scalars)
  /// The storage spec: the reference tensor's float dtype, then the ports
  /// stored otherwise ("bf16,exp_avg=f32,exp_avg_sq=f32").
  std::string storage;
  bool aligned;
};

} // namespace

std::vector<std::vector<at::Tensor>>
torch_ops::runMultiTensor(std::string_view op, Fusion &fusion,
                          c10::ArrayRef<MultiTensorInput> inputs,
                          c10::ArrayRef<std::pair<size_t, size_t>> inplace,
                          const std::optional<at::Tensor> &skipIf,
                          c10::ArrayRef<at::TensorList> out) {
  using Kind = MultiTensorInput::Kind;
  const std::vector<PortInfo> &ports = fusion.inputs();
  TORCH_CHECK_VALUE(inputs.size() == ports.size(), "tilefuse.", op, ": ",
                    fusion.name(), " takes ", ports.size(),
                    " arguments, got ", inputs.size());
  // Row sets, and the device from the first list.
  int64_t count = -1;
  std::optional<at::Device> device;
  for (auto [input, port] : llvm::zip(inputs, ports)) {
    bool full = port.kind == PortInfo::Kind::Full;
    TORCH_CHECK_VALUE(full == (input.kind == Kind::Tensors) &&
                          (full || port.kind == PortInfo::Kind::Scalar),
                      "tilefuse.", op, ": argument '", port.name, "' must be ",
                      full ? "a list of tensors"
                           : "a number, a one-element tensor or a list of them");
    if (input.kind != Kind::Tensors && input.kind != Kind::PerTensor)
      continue;
    TORCH_CHECK_VALUE(count < 0 || int64_t(input.tensors.size()) == count,
                      "tilefuse.", op, ": argument '", port.name, "' has ",
                      input.tensors.size(), " tensors, the others ", count);
    count = input.tensors.size();
    if (!device && count > 0)
      device = input.tensors.front().device();
  }
  TORCH_CHECK_VALUE(count >= 0, "tilefuse.", op, ": ", fusion.name(),
                    " needs at least one list of tensors");
  std::vector<bool> updated(ports.size(), false);
  for (auto [output, input] : inplace) {
    TORCH_CHECK_VALUE(output < fusion.outputs().size() &&
                          inputs[input].kind == Kind::Tensors,
                      "tilefuse.", op, ": output ", output,
                      " cannot update input ", input, " in place");
    updated[input] = true;
  }
  size_t outputsAllocated = fusion.outputs().size() - inplace.size();
  TORCH_CHECK_VALUE(out.empty() || out.size() == outputsAllocated, "tilefuse.",
                    op, ": expected ", outputsAllocated, " output lists, got ",
                    out.size());
  std::vector<std::vector<at::Tensor>> results(outputsAllocated);
  if (count == 0)
    return results;

  // The ABI: scalars by pointer and per tensor (with their dtypes), the
  // outputs written in place, the skip flag.
  KernelAbi abi;
  abi.multiTensor = true;
  for (auto [output, input] : inplace)
    abi.inplace[fusion.outputs()[output].name] = ports[input].name;
  for (auto [input, port] : llvm::zip(inputs, ports)) {
    if (input.kind == Kind::Pointer) {
      TORCH_CHECK_VALUE(input.tensors.size() == 1, "tilefuse.", op,
                        ": scalar '", port.name, "' must be one tensor");
      checkScalarTensor(op, port.name, input.tensors.front(), *device);
      abi.scalarPointers[port.name] =
          dtypeName(input.tensors.front().scalar_type());
    } else if (input.kind == Kind::PerTensor) {
      at::ScalarType type = input.tensors.front().scalar_type();
      for (const at::Tensor &tensor : input.tensors) {
        checkScalarTensor(op, port.name, tensor, *device);
        TORCH_CHECK_TYPE(tensor.scalar_type() == type, "tilefuse.", op,
                         ": the tensors of scalar '", port.name,
                         "' must have one dtype, got ", type, " and ",
                         tensor.scalar_type());
      }
      abi.perTensorScalars[port.name] = dtypeName(type);
    }
  }
  if (skipIf) {
    checkScalarTensor(op, "skip_if", *skipIf, *device);
    abi.skipIf = dtypeName(skipIf->scalar_type());
  }
  Placement placement = placementFor(op, *device);

  // Each row set: shapes and layouts alike (read-only tensors laid out
  // otherwise are copied), no harmful overlap, the storage dtype of each
  // port (a bfloat16 parameter beside float32 state is one row set) and
  // its alignment class.
  std::vector<RowSet> rowSets(count);
  for (int64_t row = 0; row < count; ++row) {
    RowSet &set = rowSets[row];
    set.tensors.resize(ports.size());
    // The layout to match: an updated tensor's, else the first one's.
    std::optional<size_t> reference;
    for (size_t i = 0; i < ports.size(); ++i) {
      if (inputs[i].kind != Kind::Tensors)
        continue;
      set.tensors[i] = inputs[i].tensors[row];
      if (!reference || (updated[i] && !updated[*reference]))
        reference = i;
    }
    const at::Tensor ref = set.tensors[*reference];
    at::ScalarType defaultStorage =
        at::isFloatingType(ref.scalar_type()) ? ref.scalar_type() : at::kFloat;
    for (size_t i = 0; i < ports.size(); ++i) {
      if (inputs[i].kind != Kind::Tensors)
        continue;
      at::Tensor &tensor = set.tensors[i];
      const PortInfo &port = ports[i];
      TORCH_CHECK_VALUE(tensor.defined(), "tilefuse.", op, ": argument '",
                        port.name, "'[", row, "] is missing");
      TORCH_CHECK_VALUE(tensor.device() == *device, "tilefuse.", op,
                        ": argument '", port.name, "'[", row, "] is on ",
                        tensor.device(), " but the tensors are on ", *device);
      TORCH_CHECK_VALUE(tensor.sizes() == ref.sizes(), "tilefuse.", op,
                        ": argument '", port.name, "'[", row,
                        "] has shape ", tensor.sizes(), ", the others ",
                        ref.sizes());
      at::ScalarType type = tensor.scalar_type();
      bool floatPort = port.dtype == "f32" || port.dtype == "f64";
      if (floatPort) {
        TORCH_CHECK_TYPE(at::isFloatingType(type) && dtypeName(type),
                         "tilefuse.", op, ": argument '", port.name, "'[",
                         row, "] must be a float tensor, got ", type);
      } else {
        TORCH_CHECK_TYPE(type == scalarType(port.dtype), "tilefuse.", op,
                         ": argument '", port.name, "'[", row, "] must be ",
                         scalarType(port.dtype), ", got ", type);
      }
      if (updated[i]) {
        TORCH_CHECK_VALUE(tensor.is_non_overlapping_and_dense() &&
                              tensor.strides() == ref.strides(),
                          "tilefuse.", op, ": argument '", port.name, "'[",
                          row,
                          "] is updated in place and must be dense and laid "
                          "out as the row set's other tensors");
      } else if (!tensor.is_non_overlapping_and_dense() ||
                 tensor.strides() != ref.strides()) {
        tensor = at::empty_strided(ref.sizes(), ref.strides(),
                                   tensor.options())
                     .copy_(tensor);
      }
    }
    // What is written must not overlap another argument but as a whole
    // read-only alias.
    for (size_t i = 0; i < ports.size(); ++i) {
      if (!updated[i])
        continue;
      for (size_t j = 0; j < ports.size(); ++j) {
        if (j == i || !set.tensors[j].defined())
          continue;
        TORCH_CHECK_VALUE(
            mayAliasWritten(set.tensors[i], set.tensors[j], updated[j]),
            "tilefuse.", op, ": argument '", ports[i].name, "'[", row,
            "] is updated in place and overlaps '", ports[j].name, "'[", row,
            "]");
      }
    }
    // Each tensor stored in its dtype, an output written over an input as
    // that input.
    std::vector<at::Tensor> full, written(fusion.outputs().size());
    for (size_t i = 0; i < ports.size(); ++i)
      if (inputs[i].kind == Kind::Tensors)
        full.push_back(set.tensors[i]);
    for (auto [output, input] : inplace)
      written[output] = set.tensors[input];
    set.storage = storageSpec(fusion, defaultStorage, full, written);
    // The aligned class (GPU only: CPU tasks start anywhere).
    set.aligned = placement.driver != nullptr;
    for (const at::Tensor &tensor : set.tensors)
      set.aligned = set.aligned &&
                    (!tensor.defined() ||
                     reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0);
  }
  // Nor may what one row set writes share memory with another row set's
  // tensors: the sets run at once (a parameter listed twice was updated
  // twice). Only tensors of one storage can overlap.
  struct Use {
    const void *storage;
    int64_t row;
    size_t port;
  };
  std::vector<Use> uses;
  uses.reserve(count * ports.size());
  for (int64_t row = 0; row < count; ++row)
    for (size_t i = 0; i < ports.size(); ++i)
      if (rowSets[row].tensors[i].defined() &&
          rowSets[row].tensors[i].numel() > 0)
        uses.push_back({rowSets[row].tensors[i].storage().data(), row, i});
  llvm::sort(uses, [](const Use &a, const Use &b) {
    return std::less<const void *>()(a.storage, b.storage);
  });
  for (size_t a = 0; a < uses.size(); ++a)
    for (size_t b = a + 1;
         b < uses.size() && uses[b].storage == uses[a].storage; ++b) {
      const Use &first = uses[a], &second = uses[b];
      if (first.row == second.row ||
          (!updated[first.port] && !updated[second.port]))
        continue;
      TORCH_CHECK_VALUE(
          at::get_overlap_status(rowSets[first.row].tensors[first.port],
                                 rowSets[second.row].tensors[second.port]) ==
              at::MemOverlapStatus::No,
          "tilefuse.", op, ": argument '", ports[first.port].name, "'[",
          first.row, "] and '", ports[second.port].name, "'[", second.row,
          "] share memory, and one of them is updated in place");
    }

  // Scalars shared by every row set: 8-byte slots for values, pointers.
  std::vector<int64_t> slots(ports.size());
  std::vector<void *> scalars;
  for (auto [i, port] : llvm::enumerate(ports)) {
    if (inputs[i].kind == Kind::Value) {
      slots[i] = scalarSlot(op, port, inputs[i].value);
      scalars.push_back(&slots[i]);
    } else if (inputs[i].kind == Kind::Pointer) {
      scalars.push_back(inputs[i].tensors.front().data_ptr());
    }
  }

  // One call per (storage dtypes, alignment class), in first-seen order.
  std::vector<std::pair<std::string, bool>> groups;
  for (const RowSet &set : rowSets)
    if (!llvm::is_contained(groups, std::make_pair(set.storage, set.aligned)))
      groups.push_back({set.storage, set.aligned});
  for (auto &result : results)
    result.resize(count);
  for (const auto &[storage, aligned] : groups) {
    const char *storageName = storage.c_str();
    std::shared_ptr<const CpuKernel> cpuKernel;
    std::shared_ptr<const GpuKernel> gpuKernel;
    if (placement.driver) {
      auto kernel =
          fusion.gpuKernel(storageName, 0, aligned, placement.chip, abi);
      TORCH_CHECK(static_cast<bool>(kernel), "tilefuse.", op, ": ",
                  llvm::toString(kernel.takeError()));
      gpuKernel = *kernel;
    } else {
      auto kernel = fusion.cpuKernel(storageName, 0, false, abi);
      TORCH_CHECK(static_cast<bool>(kernel), "tilefuse.", op, ": ",
                  llvm::toString(kernel.takeError()));
      cpuKernel = *kernel;
    }
    const KernelInfo &info = cpuKernel ? cpuKernel->info() : gpuKernel->info;
    std::vector<int64_t> numel;
    std::vector<void *> pointers;
    for (int64_t row = 0; row < count; ++row) {
      RowSet &set = rowSets[row];
      if (set.storage != storage || set.aligned != aligned)
        continue;
      const at::Tensor *reference = nullptr;
      for (size_t i = 0; i < ports.size(); ++i) {
        if (inputs[i].kind == Kind::Tensors) {
          reference = reference ? reference : &set.tensors[i];
          pointers.push_back(set.tensors[i].data_ptr());
        } else if (inputs[i].kind == Kind::PerTensor) {
          pointers.push_back(inputs[i].tensors[row].data_ptr());
        }
      }
      numel.push_back(reference->numel());
      size_t allocated = 0;
      for (auto [o, port] : llvm::enumerate(info.outputs)) {
        if (!port.updates.empty())
          continue;
        at::TensorOptions options =
            reference->options().dtype(scalarType(port.dtype));
        at::Tensor output;
        if (out.empty()) {
          output = at::empty_strided(reference->sizes(), reference->strides(),
                                     options);
        } else {
          TORCH_CHECK_VALUE(int64_t(out[allocated].size()) == count,
                            "tilefuse.", op, ": output '", port.name,
                            "' has ", out[allocated].size(),
                            " tensors, expected ", count);
          output = out[allocated][row];
          TORCH_CHECK_VALUE(
              output.sizes() == reference->sizes() &&
                  output.strides() == reference->strides() &&
                  output.options().dtype() == options.dtype() &&
                  output.device() == reference->device(),
              "tilefuse.", op, ": output '", port.name, "'[", row,
              "] must be ", options.dtype(), " of shape ", reference->sizes(),
              " laid out as its row set on ", reference->device());
        }
        pointers.push_back(output.data_ptr());
        results[allocated++][row] = std::move(output);
      }
    }
    MultiTensorCall call{numel, pointers, scalars,
                         skipIf ? skipIf->data_ptr() : nullptr};
    llvm::Error error =
        cpuKernel ? cpuKernel->runMultiTensor(Runtime::global().executor(),
                                              call)
                  : placement.driver->launchMultiTensor(
                        gpuKernel, call, placement.deviceIndex,
                        placement.stream);
    TORCH_CHECK(!error, "tilefuse.", op, ": ",
                llvm::toString(std::move(error)));
  }
  return results;
}

Fusion &torch_ops::BuiltinFusion::operator()(at::ScalarType storage) {
  bool wide = storage == at::kDouble;
  std::call_once(built[wide], [&] {
    auto fusion =
        kernels::builtinFusion(name, wide ? dsl::DType::F64 : dsl::DType::F32);
    TORCH_INTERNAL_ASSERT(static_cast<bool>(fusion), "built-in fusion ", name,
                          ": ", llvm::toString(fusion.takeError()));
    fusions[wide] = fusion->get();
  });
  return *fusions[wide];
}

namespace {
struct Registered {
  std::shared_ptr<Fusion> fusion;
  std::optional<at::ScalarType> storage;
  std::vector<std::pair<size_t, size_t>> inplace;
  std::vector<bool> pointerScalars;
};
std::mutex registryMutex;
/// Entries never move (a deque), so references to them stay valid.
std::deque<Registered> &registry() {
  static auto *fusions = new std::deque<Registered>();
  return *fusions;
}
} // namespace

int64_t torch_ops::registerFusion(std::shared_ptr<Fusion> fusion,
                                  std::optional<at::ScalarType> storage,
                                  std::vector<std::pair<size_t, size_t>> inplace,
                                  std::vector<bool> pointerScalars) {
  for (auto [output, input] : inplace)
    TORCH_CHECK_VALUE(output < fusion->outputs().size() &&
                          input < fusion->inputs().size(),
                      "tilefuse: fusion ", fusion->name(),
                      " has no output ", output, " or input ", input);
  TORCH_CHECK_VALUE(pointerScalars.empty() ||
                        pointerScalars.size() == fusion->inputs().size(),
                    "tilefuse: expected a pointer flag per input of ",
                    fusion->name());
  std::lock_guard<std::mutex> lock(registryMutex);
  registry().push_back({std::move(fusion), storage, std::move(inplace),
                        std::move(pointerScalars)});
  return registry().size() - 1;
}

torch_ops::RegisteredFusion torch_ops::registeredFusion(std::string_view op,
                                                        int64_t handle) {
  std::lock_guard<std::mutex> lock(registryMutex);
  TORCH_CHECK_INDEX(handle >= 0 && handle < int64_t(registry().size()),
                    "tilefuse.", op, ": no fusion has handle ", handle);
  Registered &entry = registry()[handle];
  return {*entry.fusion, entry.storage, entry.inplace, entry.pointerScalars};
}

void torch_ops::checkFusionInputs(std::string_view op,
                                  const RegisteredFusion &registered,
                                  at::TensorList tensors, size_t scalars,
                                  c10::SymIntArrayRef shape,
                                  at::TensorList out) {
  checkIterationShape(op, shape);
  checkArgumentCounts(op, registered.fusion, tensors.size(), scalars);
  c10::SymIntArrayRef lead = shape.slice(0, shape.size() - 1);
  checkRowsForColumnExtremes(op, registered.fusion, lead);
  at::Device device = tensors.front().device();
  const at::Tensor *tensor = tensors.begin();
  for (const PortInfo &port : registered.fusion.inputs())
    if (port.kind != PortInfo::Kind::Scalar)
      checkTensor(op, "input", port, registered.dtypeOf(port), *tensor++,
                  device, shape.back(), lead);
  for (auto [port, output] : llvm::zip(registered.fusion.outputs(), out))
    if (output.defined())
      checkTensor(op, "output", port, registered.dtypeOf(port), output, device,
                  shape.back(), lead);
}

at::ScalarType
torch_ops::RegisteredFusion::dtypeOf(const PortInfo &port) const {
  at::ScalarType declared = scalarType(port.dtype);
  bool stored = port.kind == PortInfo::Kind::Full ||
                port.kind == PortInfo::Kind::Col;
  return storage && stored && at::isFloatingType(declared) ? *storage
                                                           : declared;
}
