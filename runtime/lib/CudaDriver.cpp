//===- CudaDriver.cpp - the CUDA driver API, loaded with dlopen -----------===//

#include "tilefuse/Runtime/CudaDriver.h"
#include "tilefuse/Compiler/KernelABI.h"

#include "llvm/Support/FormatVariadic.h"

#include <dlfcn.h>

using namespace tilefuse;

namespace {
// The driver API's types and constants, as cuda.h declares them; no CUDA
// header is needed to build.
using CUresult = int;
using CUdevice = int;
using CUcontext = void *;
using CUmodule = void *;
using CUfunction = void *;
using CUstream = void *;
constexpr int kMultiprocessorCount = 16;
constexpr int kComputeCapabilityMajor = 75;
constexpr int kComputeCapabilityMinor = 76;
} // namespace

struct CudaDriver::Api {
  void *library = nullptr;
  CUresult (*init)(unsigned);
  CUresult (*getErrorName)(CUresult, const char **);
  CUresult (*getErrorString)(CUresult, const char **);
  CUresult (*ctxGetCurrent)(CUcontext *);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*deviceGetAttribute)(int *, int, CUdevice);
  CUresult (*moduleLoadData)(CUmodule *, const void *);
  CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*moduleUnload)(CUmodule);
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, unsigned, CUstream, void **,
                           void **);
  ~Api() {
    if (library)
      dlclose(library);
  }
};

llvm::Expected<std::unique_ptr<CudaDriver>>
CudaDriver::load(const std::string &library) {
  auto api = std::make_unique<Api>();
  api->library = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->library)
    return llvm::createStringError(
        llvm::formatv("the CUDA driver ({0}) was not found: {1}", library,
                      dlerror()));
  const char *missing = nullptr;
  auto resolve = [&](auto &function, const char *name) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(
        dlsym(api->library, name));
    if (!function && !missing)
      missing = name;
  };
  resolve(api->init, "cuInit");
  resolve(api->getErrorName, "cuGetErrorName");
  resolve(api->getErrorString, "cuGetErrorString");
  resolve(api->ctxGetCurrent, "cuCtxGetCurrent");
  resolve(api->ctxSetCurrent, "cuCtxSetCurrent");
  resolve(api->primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  resolve(api->deviceGetAttribute, "cuDeviceGetAttribute");
  resolve(api->moduleLoadData, "cuModuleLoadData");
  resolve(api->moduleGetFunction, "cuModuleGetFunction");
  resolve(api->moduleUnload, "cuModuleUnload");
  resolve(api->launchKernel, "cuLaunchKernel");
  if (missing)
    return llvm::createStringError(llvm::formatv(
        "the CUDA driver ({0}) has no {1}: it is too old", library, missing));
  std::unique_ptr<CudaDriver> driver(new CudaDriver(std::move(api)));
  if (llvm::Error error = driver->check(driver->api->init(0), "cuInit"))
    return std::move(error);
  return driver;
}

llvm::Expected<CudaDriver &> CudaDriver::global() {
  // Opened once; a process without a driver keeps the reason. Never
  // destroyed (see ~CudaDriver).
  struct Global {
    std::unique_ptr<CudaDriver> driver;
    std::string error;
  };
  static Global *loaded = [] {
    auto *global = new Global;
    llvm::Expected<std::unique_ptr<CudaDriver>> driver = load("libcuda.so.1");
    if (driver)
      global->driver = std::move(*driver);
    else
      global->error = llvm::toString(driver.takeError());
    return global;
  }();
  if (!loaded->driver)
    return llvm::createStringError(loaded->error);
  return *loaded->driver;
}

CudaDriver::CudaDriver(std::unique_ptr<Api> api) : api(std::move(api)) {}

// Modules stay loaded until the process exits: contexts may already be gone
// when static destructors run, so unloading then is unsafe.
CudaDriver::~CudaDriver() = default;

llvm::Error CudaDriver::check(int result, llvm::StringRef call,
                              llvm::StringRef kernel) const {
  if (result == 0)
    return llvm::Error::success();
  const char *name = nullptr, *text = nullptr;
  api->getErrorName(result, &name);
  api->getErrorString(result, &text);
  std::string where = kernel.empty() ? "" : (" for kernel " + kernel).str();
  return llvm::createStringError(llvm::formatv(
      "{0} failed{1}: {2} ({3})", call, where,
      name ? std::string(name) : "CUDA error " + std::to_string(result),
      text ? text : ""));
}

llvm::Expected<void *> CudaDriver::context(int device) {
  CUcontext context = nullptr;
  if (llvm::Error error =
          check(api->ctxGetCurrent(&context), "cuCtxGetCurrent"))
    return std::move(error);
  if (context)
    return context;
  // A thread the CUDA runtime never bound (PyTorch skips cudaSetDevice when
  // the device index already matches): bind the primary context, retained
  // once per such thread.
  if (llvm::Error error = check(api->primaryCtxRetain(&context, device),
                                "cuDevicePrimaryCtxRetain"))
    return std::move(error);
  if (llvm::Error error = check(api->ctxSetCurrent(context), "cuCtxSetCurrent"))
    return std::move(error);
  return context;
}

llvm::Expected<int> CudaDriver::attribute(int device, int which) {
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = attributes.try_emplace({device, which}, 0);
  if (!inserted)
    return it->second;
  if (llvm::Error error = check(
          api->deviceGetAttribute(&it->second, which, device),
          "cuDeviceGetAttribute")) {
    attributes.erase(it);
    return std::move(error);
  }
  return it->second;
}

llvm::Expected<std::string> CudaDriver::target(int device) {
  llvm::Expected<int> major = attribute(device, kComputeCapabilityMajor);
  if (!major)
    return major.takeError();
  llvm::Expected<int> minor = attribute(device, kComputeCapabilityMinor);
  if (!minor)
    return minor.takeError();
  if (*major == 9)
    return std::string("sm_90");
  if (*major == 8 && (*minor == 0 || *minor == 6 || *minor == 9))
    return llvm::formatv("sm_8{0}", *minor).str();
  return llvm::createStringError(llvm::formatv(
      "compute capability {0}.{1} is not supported (sm_80, sm_86, sm_89 and "
      "sm_90 are)",
      *major, *minor));
}

llvm::Expected<int64_t> CudaDriver::rowGroups(const GpuKernel &kernel,
                                              int64_t rows, int device) {
  const TileConfig &tile = kernel.info.tile;
  int64_t blocks = (rows + tile.rowsPerBlock - 1) / tile.rowsPerBlock;
  if (tile.blocksPerSM > 0) {
    llvm::Expected<int> sms = attribute(device, kMultiprocessorCount);
    if (!sms)
      return sms.takeError();
    blocks = std::min<int64_t>(blocks, tile.blocksPerSM * *sms);
  }
  return blocks * tile.rowsPerBlock;
}

llvm::Expected<CudaDriver::Loaded>
CudaDriver::functions(void *context,
                      const std::shared_ptr<const GpuKernel> &kernel) {
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = modules.try_emplace({context, kernel.get()});
  if (!inserted)
    return it->second;
  // Holding the kernel keeps its address from naming another kernel later.
  Loaded loaded{kernel};
  const std::string &name = kernel->info.name;
  llvm::Error error = check(api->moduleLoadData(&loaded.module,
                                                kernel->ptx.c_str()),
                            "cuModuleLoadData", name);
  if (!error)
    error = check(api->moduleGetFunction(&loaded.main, loaded.module,
                                         name.c_str()),
                  "cuModuleGetFunction", name);
  std::string finalizeName = name + kFinalizeSuffix;
  if (!error && kernel->info.hasColumnReduction())
    error = check(api->moduleGetFunction(&loaded.finalize, loaded.module,
                                         finalizeName.c_str()),
                  "cuModuleGetFunction", finalizeName);
  if (error) {
    if (loaded.module)
      api->moduleUnload(loaded.module);
    modules.erase(it);
    return std::move(error);
  }
  return it->second = loaded;
}

llvm::Error CudaDriver::launch(std::shared_ptr<const GpuKernel> kernel,
                               llvm::ArrayRef<void *> arguments,
                               llvm::ArrayRef<void *> workspaces, int64_t rows,
                               int device, void *stream) {
  const KernelInfo &info = kernel->info;
  size_t inputs = info.inputs.size();
  size_t columnOutputs = llvm::count_if(info.outputs, [](const PortInfo &p) {
    return p.kind == PortInfo::Kind::Col;
  });
  if (arguments.size() != inputs + info.outputs.size() ||
      workspaces.size() != columnOutputs)
    return llvm::createStringError(llvm::formatv(
        "{0}: expected {1} arguments and {2} workspaces, got {3} and {4}",
        info.name, inputs + info.outputs.size(), columnOutputs,
        arguments.size(), workspaces.size()));
  llvm::Expected<void *> current = context(device);
  if (!current)
    return current.takeError();
  llvm::Expected<Loaded> loaded = functions(*current, kernel);
  if (!loaded)
    return loaded.takeError();
  llvm::Expected<int64_t> groups = rowGroups(*kernel, rows, device);
  if (!groups)
    return groups.takeError();
  int64_t rowGroupCount = *groups;

  // cuLaunchKernel takes the address of each parameter's value.
  auto address = [](void *const &slot) {
    return const_cast<void *>(static_cast<const void *>(&slot));
  };
  std::vector<void *> params, finalizeParams;
  for (size_t i = 0; i < inputs; ++i)
    params.push_back(info.inputs[i].kind == PortInfo::Kind::Scalar
                         ? arguments[i]
                         : address(arguments[i]));
  size_t workspace = 0;
  for (size_t i = 0; i < info.outputs.size(); ++i) {
    void *const &output = arguments[inputs + i];
    if (info.outputs[i].kind != PortInfo::Kind::Col) {
      params.push_back(address(output));
      continue;
    }
    params.push_back(address(workspaces[workspace]));
    finalizeParams.push_back(address(workspaces[workspace++]));
    finalizeParams.push_back(address(output));
  }
  params.push_back(&rows);
  finalizeParams.push_back(&rowGroupCount);
  finalizeParams.push_back(&rows);

  const TileConfig &tile = info.tile;
  unsigned blocks = rowGroupCount / tile.rowsPerBlock;
  if (blocks > 0)
    if (llvm::Error error = check(
            api->launchKernel(loaded->main, blocks, 1, 1,
                              tile.threadsPerRow * tile.rowsPerBlock, 1, 1, 0,
                              stream, params.data(), nullptr),
            "cuLaunchKernel", info.name))
      return error;
  if (!loaded->finalize)
    return llvm::Error::success();
  unsigned finalizeBlocks = (info.n + kFinalizeThreads - 1) / kFinalizeThreads;
  return check(api->launchKernel(loaded->finalize, finalizeBlocks, 1, 1,
                                 kFinalizeThreads, 1, 1, 0, stream,
                                 finalizeParams.data(), nullptr),
               "cuLaunchKernel", info.name + kFinalizeSuffix);
}
