//===- TorchRunner.cpp - run a fusion on PyTorch tensors ------------------===//

#include "TorchRunner.h"

#include "tilefuse/Kernels/Builtins.h"
#include "tilefuse/Runtime/CudaDriver.h"
#include "tilefuse/Runtime/Fusion.h"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
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

/// The shape of a `kind` tensor; on the stack for up to 5 leading dims
/// (it is built per tensor per call).
c10::SmallVector<int64_t, 6> shapeOf(PortInfo::Kind kind, int64_t n,
                                     at::IntArrayRef lead) {
  if (kind == PortInfo::Kind::Col)
    return {n};
  c10::SmallVector<int64_t, 6> shape(lead.begin(), lead.end());
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

/// Checks `tensor` against `port` of a kernel specialized for (n, lead).
void checkTensor(std::string_view op, const char *role, const PortInfo &port,
                 const at::Tensor &tensor, const at::Device &device, int64_t n,
                 at::IntArrayRef lead) {
  TORCH_CHECK_VALUE(tensor.defined(), "tilefuse.", op, ": ", role, " '",
                    port.name, "' is missing");
  TORCH_CHECK_VALUE(tensor.device() == device, "tilefuse.", op, ": ", role,
                    " '", port.name, "' is on ", tensor.device(),
                    " but the other tensors are on ", device);
  at::ScalarType expected = scalarType(port.dtype);
  TORCH_CHECK_TYPE(tensor.scalar_type() == expected, "tilefuse.", op, ": ",
                   role, " '", port.name, "' must be ", expected, ", got ",
                   tensor.scalar_type());
  auto shape = shapeOf(port.kind, n, lead);
  TORCH_CHECK_VALUE(
      tensor.sizes() == at::IntArrayRef(shape), "tilefuse.", op, ": ", role,
      " '", port.name, "' must have shape ", at::IntArrayRef(shape), " (",
      PortInfo::kindName(port.kind).str(), "), got ", tensor.sizes());
  TORCH_CHECK_VALUE(tensor.is_contiguous(), "tilefuse.", op, ": ", role, " '",
                    port.name, "' must be contiguous");
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

/// `scalar` in an 8-byte slot, typed as `port` declares it.
int64_t scalarSlot(std::string_view op, const PortInfo &port,
                   const c10::Scalar &scalar) {
  if (port.dtype == "f32") {
    double value = scalar.toDouble();
    TORCH_CHECK_VALUE(!std::isfinite(value) || std::abs(value) <= FLT_MAX,
                      "tilefuse.", op, ": scalar '", port.name, "' = ", value,
                      " is out of range for float32");
    return slotOf(static_cast<float>(value));
  }
  if (port.dtype == "f64")
    return slotOf(scalar.to<double>());
  if (port.dtype == "i32")
    return slotOf(scalar.to<int32_t>());
  if (port.dtype == "i64")
    return scalar.to<int64_t>();
  TORCH_CHECK_TYPE(false, "tilefuse.", op, ": scalar '", port.name,
                   "' has unsupported dtype ", port.dtype);
}

} // namespace

at::ScalarType torch_ops::scalarType(const std::string &dtype) {
  for (auto [name, type] : kDtypes)
    if (dtype == name)
      return type;
  TORCH_CHECK_TYPE(false, "tilefuse: no torch dtype for '", dtype, "'");
}

std::vector<at::Tensor>
torch_ops::runFusion(std::string_view op, Fusion &fusion,
                     at::TensorList tensors, c10::ArrayRef<c10::Scalar> scalars,
                     std::optional<at::ScalarType> storage,
                     at::IntArrayRef shape, at::TensorList out,
                     bool storagePerTensor) {
  TORCH_CHECK_VALUE(!shape.empty() && shape.back() > 0, "tilefuse.", op,
                    ": the input must have a last dimension of at least 1, "
                    "got shape ",
                    shape);
  int64_t n = shape.back();
  at::IntArrayRef lead = shape.slice(0, shape.size() - 1);
  const std::vector<PortInfo> &declared = fusion.inputs();
  size_t scalarPorts = llvm::count_if(declared, [](const PortInfo &port) {
    return port.kind == PortInfo::Kind::Scalar;
  });
  TORCH_CHECK(tensors.size() == declared.size() - scalarPorts &&
                  scalars.size() == scalarPorts && !tensors.empty(),
              "tilefuse.", op, ": ", fusion.name(), " takes ",
              declared.size() - scalarPorts, " tensors and ", scalarPorts,
              " scalars, got ", tensors.size(), " and ", scalars.size());
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

  CudaDriver *driver = nullptr;
  std::shared_ptr<const CpuKernel> cpuKernel;
  std::shared_ptr<const GpuKernel> gpuKernel;
  std::optional<c10::DeviceGuard> guard;
  // Under TILEFUSE_TARGET=emulate, CPU tensors take the GPU path: PTX,
  // CudaDriver, the PTX emulator (host pointers are its device pointers).
  bool emulate = target(op).kind == TargetSelection::Kind::Emulate;
  if (device.is_cpu() && !emulate) {
    auto kernel = fusion.cpuKernel(spec, n, aligned);
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
    auto kernel = fusion.gpuKernel(spec, n, aligned, chip);
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
  for (auto i : c10::irange(info.inputs.size())) {
    const PortInfo &port = info.inputs[i];
    if (port.kind == PortInfo::Kind::Scalar) {
      slots[i] = scalarSlot(op, port, *scalar++);
      arguments.push_back(&slots[i]);
      continue;
    }
    checkTensor(op, "input", port, *tensor, device, n, lead);
    arguments.push_back(tensor++->data_ptr());
  }
  std::vector<at::Tensor> outputs;
  for (auto i : c10::irange(info.outputs.size())) {
    const PortInfo &port = info.outputs[i];
    if (!out.empty() && out[i].defined()) {
      checkTensor(op, "output", port, out[i], device, n, lead);
      outputs.push_back(out[i]);
    } else {
      outputs.push_back(at::empty(
          shapeOf(port.kind, n, lead),
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
  // row group.
  int deviceIndex = emulate ? 0 : device.index();
  std::vector<at::Tensor> workspaces;
  std::vector<void *> workspacePointers;
  if (info.hasColumnReduction()) {
    llvm::Expected<int64_t> groups =
        driver->rowGroups(*gpuKernel, rows, deviceIndex);
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
    for (const PortInfo &port : info.inputs) {
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
std::mutex registryMutex;
std::vector<std::pair<std::shared_ptr<Fusion>, std::optional<at::ScalarType>>> &
registry() {
  static auto *fusions = new std::vector<
      std::pair<std::shared_ptr<Fusion>, std::optional<at::ScalarType>>>();
  return *fusions;
}
} // namespace

int64_t torch_ops::registerFusion(std::shared_ptr<Fusion> fusion,
                                  std::optional<at::ScalarType> storage) {
  std::lock_guard<std::mutex> lock(registryMutex);
  registry().emplace_back(std::move(fusion), storage);
  return registry().size() - 1;
}

torch_ops::RegisteredFusion torch_ops::registeredFusion(std::string_view op,
                                                        int64_t handle) {
  std::lock_guard<std::mutex> lock(registryMutex);
  TORCH_CHECK_INDEX(handle >= 0 && handle < int64_t(registry().size()),
                    "tilefuse.", op, ": no fusion has handle ", handle);
  auto &[fusion, storage] = registry()[handle];
  return {*fusion, storage};
}

at::ScalarType
torch_ops::RegisteredFusion::dtypeOf(const PortInfo &port) const {
  at::ScalarType declared = scalarType(port.dtype);
  bool stored = port.kind == PortInfo::Kind::Full ||
                port.kind == PortInfo::Kind::Col;
  return storage && stored && at::isFloatingType(declared) ? *storage
                                                           : declared;
}
