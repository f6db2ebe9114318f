//===- CudaDriver.cpp - the CUDA driver API, loaded with dlopen -----------===//

#include "tilefuse/Runtime/CudaDriver.h"
#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Emulator/Emulator.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>
#include <cstring>
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
// CUjit_option: the JIT's logs, and their detail.
constexpr int kJitInfoLogBuffer = 3;
constexpr int kJitInfoLogBufferSizeBytes = 4;
constexpr int kJitErrorLogBuffer = 5;
constexpr int kJitErrorLogBufferSizeBytes = 6;
constexpr int kJitLogVerbose = 12;
constexpr size_t kJitLogBytes = 1 << 16;
constexpr int kMultiprocessorCount = 16;
constexpr int kComputeCapabilityMajor = 75;
constexpr int kComputeCapabilityMinor = 76;
// CUfunction_attribute: local memory a thread uses (ptxas's spills), and
// past 48 KiB, dynamic shared memory is opted into.
constexpr int kLocalSizeBytes = 3;
constexpr int kMaxDynamicSharedSizeBytes = 8;
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
  /// With the JIT's logs; every real driver has it, the emulator does not.
  CUresult (*moduleLoadDataEx)(CUmodule *, const void *, unsigned, int *,
                               void **) = nullptr;
  CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*moduleUnload)(CUmodule);
  CUresult (*funcGetAttribute)(int *, int, CUfunction);
  CUresult (*funcSetAttribute)(CUfunction, int, int);
  CUresult (*occupancy)(int *, CUfunction, int, size_t);
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, unsigned, CUstream, void **,
                           void **);
  /// The emulator's only: the buffers of the next launch.
  decltype(&tilefuseEmulatorSetBuffers) setBuffers = nullptr;
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
  resolve(api->funcGetAttribute, "cuFuncGetAttribute");
  resolve(api->funcSetAttribute, "cuFuncSetAttribute");
  resolve(api->occupancy, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  resolve(api->launchKernel, "cuLaunchKernel");
  api->moduleLoadDataEx = reinterpret_cast<decltype(api->moduleLoadDataEx)>(
      dlsym(api->library, "cuModuleLoadDataEx"));
  api->setBuffers = reinterpret_cast<decltype(api->setBuffers)>(
      dlsym(api->library, "tilefuseEmulatorSetBuffers"));
  if (missing)
    return llvm::createStringError(llvm::formatv(
        "the CUDA driver ({0}) has no {1}: it is too old", library, missing));
  std::unique_ptr<CudaDriver> driver(new CudaDriver(std::move(api)));
  if (llvm::Error error = driver->check(driver->api->init(0), "cuInit"))
    return std::move(error);
  return driver;
}

const TargetSelection &tilefuse::selectedTarget() {
  static const TargetSelection selection = [] {
    TargetSelection selection;
    const char *value = std::getenv("TILEFUSE_TARGET");
    llvm::StringRef text = value ? value : "";
    if (text.empty())
      return selection;
    if (text == "cpu") {
      selection.kind = TargetSelection::Kind::Cpu;
    } else if (text == "emulate" || text == "emulate:sm_90" ||
               text == "emulate:sm_80") {
      selection.kind = TargetSelection::Kind::Emulate;
      selection.chip = text == "emulate:sm_80" ? "sm_80" : "sm_90";
    } else {
      selection.error = llvm::formatv("TILEFUSE_TARGET={0} is not a target: "
                                      "use cpu, emulate, emulate:sm_80 or "
                                      "emulate:sm_90",
                                      text);
    }
    return selection;
  }();
  return selection;
}

std::string CudaDriver::emulatorPath() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void *>(&selectedTarget), &info) ||
      !info.dli_fname)
    return "";
  llvm::SmallString<256> path(llvm::sys::path::parent_path(info.dli_fname));
  llvm::sys::path::append(path, "libtilefuse_emulator.so");
  return std::string(path);
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
    std::string library = "libcuda.so.1";
    if (selectedTarget().kind == TargetSelection::Kind::Emulate) {
      // The one already loaded (a program linked with it, like _C), else
      // the one beside this library (the package), else wherever the
      // dynamic linker finds it.
      library = "libtilefuse_emulator.so";
      void *loaded = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
      if (loaded)
        dlclose(loaded);
      else if (std::string beside = emulatorPath();
               !beside.empty() && llvm::sys::fs::exists(beside))
        library = beside;
    }
    llvm::Expected<std::unique_ptr<CudaDriver>> driver = load(library);
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

bool CudaDriver::emulated() const { return api->setBuffers != nullptr; }

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

llvm::Expected<int64_t> CudaDriver::blocks(const Loaded &loaded, int64_t rows,
                                           int device) {
  const TileConfig &tile = loaded.kernel->info.tile;
  int64_t rowsPerBlock = tile.rowsPerBlock * loaded.foldedBlocks;
  int64_t blocks = (rows + rowsPerBlock - 1) / rowsPerBlock;
  if (loaded.blocksPerSM > 0) {
    llvm::Expected<int> sms = attribute(device, kMultiprocessorCount);
    if (!sms)
      return sms.takeError();
    blocks = std::min<int64_t>(blocks, loaded.blocksPerSM * *sms);
  }
  return blocks;
}

/// A row of partials per block when they stay on chip (all of them, or
/// some where a block has one row group), else per row group.
static int64_t partialRowsOf(const TileConfig &tile, int64_t blocks) {
  return tile.partialChunks ? blocks : blocks * tile.rowsPerBlock;
}

llvm::Expected<int64_t>
CudaDriver::partialRows(const std::shared_ptr<const GpuKernel> &kernel,
                        int64_t rows, int device) {
  llvm::Expected<Loaded> loaded = functions(device, kernel);
  if (!loaded)
    return loaded.takeError();
  llvm::Expected<int64_t> count = blocks(*loaded, rows, device);
  if (!count)
    return count.takeError();
  return partialRowsOf(kernel->info.tile, *count);
}

llvm::Expected<CudaDriver::Loaded>
CudaDriver::functions(int device,
                      const std::shared_ptr<const GpuKernel> &kernel) {
  llvm::Expected<void *> current = context(device);
  if (!current)
    return current.takeError();
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = modules.try_emplace({*current, kernel.get()});
  if (!inserted)
    return it->second;
  // Holding the kernel keeps its address from naming another kernel later.
  Loaded loaded{kernel};
  const std::string &name = kernel->info.name;
  llvm::Error error = loadModule(&loaded.module, kernel->ptx, name);
  if (!error)
    error = check(api->moduleGetFunction(&loaded.main, loaded.module,
                                         name.c_str()),
                  "cuModuleGetFunction", name);
  if (!error)
    error = raiseOccupancy(loaded);
  const TileConfig &tile = kernel->info.tile;
  if (!error && tile.stageBytes)
    error = check(api->funcSetAttribute(loaded.main, kMaxDynamicSharedSizeBytes,
                                        tile.stageBytes),
                  "cuFuncSetAttribute", name);
  // A persistent grid takes no more blocks than can be resident: a block
  // past them would wait for a whole wave, and write one more row of
  // partials.
  int resident = 0;
  if (!error && tile.blocksPerSM > 0) {
    error = check(api->occupancy(&resident, loaded.main,
                                 tile.threadsPerRow * tile.rowsPerBlock,
                                 tile.stageBytes),
                  "cuOccupancyMaxActiveBlocksPerMultiprocessor", name);
    loaded.blocksPerSM = std::clamp<int64_t>(resident, 1, tile.blocksPerSM);
  }
  if (!error && foldsResidentBlocks(tile))
    error = foldResidentBlocks(loaded, /*plainFits=*/resident > 0);
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

/// TILEFUSE_LOG=jit: the PTX JIT's report (registers, spills) and what
/// raiseOccupancy did, on stderr.
static bool logJit() {
  static const bool enabled = [] {
    const char *log = std::getenv("TILEFUSE_LOG");
    return log && llvm::StringRef(log).contains("jit");
  }();
  return enabled;
}

llvm::Expected<CudaDriver::AskedModule>
CudaDriver::loadAsking(const std::string &ptx, const std::string &name,
                       int threads, unsigned sharedBytes) {
  AskedModule asked;
  llvm::Error error = loadModule(&asked.module, ptx, name);
  if (!error)
    error =
        check(api->moduleGetFunction(&asked.main, asked.module, name.c_str()),
              "cuModuleGetFunction", name);
  if (!error && sharedBytes)
    error = check(api->funcSetAttribute(asked.main, kMaxDynamicSharedSizeBytes,
                                        sharedBytes),
                  "cuFuncSetAttribute", name);
  if (!error)
    error =
        check(api->occupancy(&asked.resident, asked.main, threads, sharedBytes),
              "cuOccupancyMaxActiveBlocksPerMultiprocessor", name);
  if (!error)
    error = check(
        api->funcGetAttribute(&asked.localBytes, kLocalSizeBytes, asked.main),
        "cuFuncGetAttribute", name);
  if (error) {
    if (asked.module)
      api->moduleUnload(asked.module);
    return std::move(error);
  }
  return asked;
}

void CudaDriver::keepAsked(Loaded &loaded, const AskedModule &asked) {
  api->moduleUnload(loaded.module);
  loaded.module = asked.module;
  loaded.main = asked.main;
}

llvm::Error CudaDriver::foldResidentBlocks(Loaded &loaded, bool plainFits) {
  const std::string &name = loaded.kernel->info.name;
  const TileConfig &tile = loaded.kernel->info.tile;
  // The tile's blocks per SM in one block, or fewer: the first whose PTX
  // the JIT, told the block size (.maxntid), gives registers without
  // spilling, and that fits an SM. Otherwise the plain PTX runs its blocks
  // side by side, as many as are resident; where not even one of its
  // blocks fits (ptxas gave layer_norm_bwd f32 n = 12288 136 registers a
  // thread, 512 threads a block), the tile's own block size comes last and
  // is kept even if it spills: it is the one that launches. A module that
  // fails to load is only a chance lost.
  std::string lastFailure;
  for (int64_t fold = maxFoldedBlocks(tile); fold > (plainFits ? 1 : 0);
       --fold) {
    Loaded folded = loaded;
    folded.foldedBlocks = fold;
    llvm::Expected<AskedModule> bounded = [&]() -> llvm::Expected<AskedModule> {
      llvm::Expected<std::string> ptx =
          withMaxThreads(loaded.kernel->ptx, name, folded.threadsPerBlock());
      if (!ptx)
        return ptx.takeError();
      return loadAsking(*ptx, name, folded.threadsPerBlock(),
                        folded.sharedBytes());
    }();
    if (!bounded) {
      std::string why = llvm::toString(bounded.takeError());
      lastFailure = why;
      if (logJit())
        llvm::errs() << llvm::formatv("tilefuse: {0}: a block of {1} threads "
                                      "failed: {2}\n",
                                      name, folded.threadsPerBlock(), why);
      continue; // a smaller block may load (its shared memory, say)
    }
    bool keep =
        bounded->resident > 0 && (bounded->localBytes == 0 || fold == 1);
    if (logJit())
      llvm::errs() << llvm::formatv(
          "tilefuse: {0}: {1} blocks in one of {2} threads: {3} resident, {4} "
          "bytes of local memory: {5}\n",
          name, fold, folded.threadsPerBlock(), bounded->resident,
          bounded->localBytes, keep ? "kept" : "dropped");
    if (keep) {
      keepAsked(loaded, *bounded);
      loaded.foldedBlocks = fold;
      loaded.blocksPerSM = fold > 1 ? 1
                                    : std::clamp<int64_t>(bounded->resident, 1,
                                                          tile.blocksPerSM);
      return llvm::Error::success();
    }
    api->moduleUnload(bounded->module);
  }
  if (plainFits)
    return llvm::Error::success();
  return llvm::createStringError(llvm::formatv(
      "{0}: no block of {1} threads fits on an SM, with the registers the "
      "PTX JIT chose or bounded to that block size{2}",
      name, tile.threadsPerBlock(),
      lastFailure.empty() ? "" : " (the bounded module: " + lastFailure + ")"));
}

llvm::Error CudaDriver::raiseOccupancy(Loaded &loaded) {
  const std::string &name = loaded.kernel->info.name;
  const TileConfig &tile = loaded.kernel->info.tile;
  int64_t goal = blocksPerSMGoal(tile);
  if (goal == 0)
    return llvm::Error::success();
  int threads = tile.threadsPerBlock(), resident = 0;
  if (llvm::Error error =
          check(api->occupancy(&resident, loaded.main, threads, 0),
                "cuOccupancyMaxActiveBlocksPerMultiprocessor", name))
    return error;
  auto load = [&](int64_t ask) -> llvm::Expected<AskedModule> {
    llvm::Expected<std::string> ptx =
        withMinBlocksPerSM(loaded.kernel->ptx, name, ask);
    if (!ptx)
      return ptx.takeError();
    return loadAsking(*ptx, name, threads, 0);
  };
  // The goal, and where asking for it spills, one block more than fit. A
  // module that fails to load is only a chance lost: the plain one stays.
  for (int64_t ask = goal; ask > resident;) {
    llvm::Expected<AskedModule> asked = load(ask);
    if (!asked) {
      std::string why = llvm::toString(asked.takeError());
      if (logJit())
        llvm::errs() << llvm::formatv("tilefuse: {0}: asking ptxas for {1} "
                                      "blocks per SM failed: {2}\n",
                                      name, ask, why);
      return llvm::Error::success();
    }
    bool keep = asked->localBytes == 0 && asked->resident > resident;
    if (logJit())
      llvm::errs() << llvm::formatv(
          "tilefuse: {0}: {1} blocks per SM resident; asked ptxas for {2}: "
          "{3} resident, {4} bytes of local memory: {5}\n",
          name, resident, ask, asked->resident, asked->localBytes,
          keep ? "kept" : "dropped");
    if (keep) {
      keepAsked(loaded, *asked);
      return llvm::Error::success();
    }
    api->moduleUnload(asked->module);
    if (asked->localBytes == 0 || ask == resident + 1)
      break;
    ask = resident + 1;
  }
  return llvm::Error::success();
}

llvm::Error CudaDriver::loadModule(void **module, const std::string &ptx,
                                   const std::string &name) {
  if (!api->moduleLoadDataEx)
    return check(api->moduleLoadData(module, ptx.c_str()), "cuModuleLoadData",
                 name);
  // The PTX JIT's own words: in full in the error, and with
  // TILEFUSE_LOG=jit its report on stderr.
  std::string info(kJitLogBytes, '\0'), errors(kJitLogBytes, '\0');
  int options[] = {kJitInfoLogBuffer, kJitInfoLogBufferSizeBytes,
                   kJitErrorLogBuffer, kJitErrorLogBufferSizeBytes,
                   kJitLogVerbose};
  void *values[] = {info.data(), reinterpret_cast<void *>(kJitLogBytes),
                    errors.data(), reinterpret_cast<void *>(kJitLogBytes),
                    reinterpret_cast<void *>(uintptr_t(logJit()))};
  llvm::Error error =
      check(api->moduleLoadDataEx(module, ptx.c_str(), std::size(options),
                                  options, values),
            "cuModuleLoadDataEx", name);
  info.resize(std::strlen(info.c_str()));
  errors.resize(std::strlen(errors.c_str()));
  if (logJit() && !info.empty())
    llvm::errs() << "tilefuse: PTX JIT of " << name << ":\n" << info << "\n";
  if (error && !errors.empty())
    return llvm::createStringError(llvm::toString(std::move(error)) +
                                   "\nPTX JIT log:\n" + errors);
  return error;
}

llvm::Error CudaDriver::launchOne(void *function, const std::string &name,
                                  unsigned blocks, unsigned threads,
                                  unsigned sharedBytes, void *stream,
                                  std::vector<void *> &params,
                                  const std::vector<Buffer> &buffers) {
  countKernelLaunch();
  if (api->setBuffers) {
    std::vector<TilefuseEmulatorBuffer> described;
    for (const Buffer &buffer : buffers)
      described.push_back({buffer.name, buffer.base, buffer.bytes});
    api->setBuffers(described.data(), described.size());
  }
  return check(api->launchKernel(function, blocks, 1, 1, threads, 1, 1,
                                 sharedBytes, stream, params.data(), nullptr),
               "cuLaunchKernel", name);
}

/// cuLaunchKernel takes the address of each parameter's value.
static void *parameterAddress(void *const &slot) {
  return const_cast<void *>(static_cast<const void *>(&slot));
}

llvm::Error CudaDriver::launch(std::shared_ptr<const GpuKernel> kernel,
                               llvm::ArrayRef<void *> arguments,
                               llvm::ArrayRef<void *> workspaces, int64_t rows,
                               int device, void *stream,
                               llvm::ArrayRef<Buffer> extents) {
  const KernelInfo &info = kernel->info;
  size_t inputs = info.inputs.size();
  size_t columnOutputs = llvm::count_if(info.outputs, [](const PortInfo &p) {
    return p.kind == PortInfo::Kind::Col;
  });
  if (arguments.size() != inputs + info.outputs.size() ||
      workspaces.size() != columnOutputs ||
      (!extents.empty() &&
       extents.size() != arguments.size() + workspaces.size()))
    return llvm::createStringError(llvm::formatv(
        "{0}: expected {1} arguments and {2} workspaces, got {3} and {4}",
        info.name, inputs + info.outputs.size(), columnOutputs,
        arguments.size(), workspaces.size()));
  llvm::Expected<Loaded> loaded = functions(device, kernel);
  if (!loaded)
    return loaded.takeError();
  llvm::Expected<int64_t> blockCount = blocks(*loaded, rows, device);
  if (!blockCount)
    return blockCount.takeError();
  int64_t partialRowCount = partialRowsOf(info.tile, *blockCount);

  std::vector<void *> params, columnOutputPointers;
  // What each launch touches (when described): the main kernel every
  // tensor and workspace, the finalize the workspaces and their outputs.
  std::vector<Buffer> buffers, finalizeExtents, finalizeOutputs;
  auto extent = [&](size_t i) -> const Buffer * {
    return extents.empty() ? nullptr : &extents[i];
  };
  for (size_t i = 0; i < inputs; ++i) {
    bool byValue = info.inputs[i].kind == PortInfo::Kind::Scalar &&
                   info.inputs[i].binding == PortInfo::Binding::Value;
    params.push_back(byValue ? arguments[i] : parameterAddress(arguments[i]));
    if (!byValue && extent(i))
      buffers.push_back(*extent(i));
  }
  size_t workspace = 0;
  for (size_t i = 0; i < info.outputs.size(); ++i) {
    void *const &output = arguments[inputs + i];
    if (extent(inputs + i))
      buffers.push_back(*extent(inputs + i));
    if (info.outputs[i].kind != PortInfo::Kind::Col) {
      params.push_back(parameterAddress(output));
      continue;
    }
    if (const Buffer *partials = extent(arguments.size() + workspace)) {
      buffers.push_back(*partials);
      finalizeExtents.push_back(*partials);
      finalizeOutputs.push_back(*extent(inputs + i));
    }
    params.push_back(parameterAddress(workspaces[workspace++]));
    columnOutputPointers.push_back(output);
  }
  params.push_back(&rows);

  if (*blockCount > 0)
    if (llvm::Error error = launchOne(
            loaded->main, info.name, *blockCount, loaded->threadsPerBlock(),
            loaded->sharedBytes(), stream, params, buffers))
      return error;
  if (!loaded->finalize)
    return llvm::Error::success();
  finalizeExtents.insert(finalizeExtents.end(), finalizeOutputs.begin(),
                          finalizeOutputs.end());
  return launchFinalize(kernel, workspaces, columnOutputPointers,
                        partialRowCount, rows, device, stream,
                        finalizeExtents);
}

llvm::Error CudaDriver::launchFinalize(std::shared_ptr<const GpuKernel> kernel,
                                       llvm::ArrayRef<void *> workspaces,
                                       llvm::ArrayRef<void *> columnOutputs,
                                       int64_t partialRows, int64_t rows,
                                       int device, void *stream,
                                       llvm::ArrayRef<Buffer> extents) {
  const KernelInfo &info = kernel->info;
  size_t columns = workspaces.size();
  if (columnOutputs.size() != columns ||
      (!extents.empty() && extents.size() != 2 * columns))
    return llvm::createStringError(llvm::formatv(
        "{0}: expected as many column outputs (and extents for each and "
        "its workspace) as workspaces, got {1} workspaces, {2} outputs and "
        "{3} extents",
        info.name, columns, columnOutputs.size(), extents.size()));
  llvm::Expected<Loaded> loaded = functions(device, kernel);
  if (!loaded)
    return loaded.takeError();
  if (!loaded->finalize)
    return llvm::createStringError(
        llvm::formatv("{0} has no column reduction to finalize", info.name));
  // (partials, output) per column reduction, then partial rows and rows.
  std::vector<void *> params;
  std::vector<Buffer> buffers;
  for (size_t i = 0; i < columns; ++i) {
    params.push_back(parameterAddress(workspaces[i]));
    params.push_back(parameterAddress(columnOutputs[i]));
    if (!extents.empty()) {
      buffers.push_back(extents[i]);
      buffers.push_back(extents[columns + i]);
    }
  }
  params.push_back(&partialRows);
  params.push_back(&rows);
  int64_t columnsPerBlock = finalizeColumns(info.n);
  unsigned blocks = (info.n + columnsPerBlock - 1) / columnsPerBlock;
  return launchOne(loaded->finalize, info.name + kFinalizeSuffix, blocks,
                   kFinalizeThreads, 0, stream, params, buffers);
}

llvm::Error
CudaDriver::launchMultiTensor(std::shared_ptr<const GpuKernel> kernel,
                              const MultiTensorCall &call, int device,
                              void *stream) {
  const KernelInfo &info = kernel->info;
  if (llvm::Error error = checkMultiTensorCall(info, call))
    return error;
  llvm::Expected<Loaded> loaded = functions(device, kernel);
  if (!loaded)
    return loaded.takeError();
  llvm::Expected<int> sms = attribute(device, kMultiprocessorCount);
  if (!sms)
    return sms.takeError();

  int64_t columns = multiTensorColumns(info);
  int64_t scalars = multiTensorScalars(info);
  int64_t words = multiTensorTableWords(scalars + !info.skipIf.empty());
  int64_t capacity = multiTensorCapacity(words, columns);
  int64_t chunk = info.tile.chunkElements;

  // What each column points to, for the emulator: its name, bytes per
  // element, and whether it is a one-element scalar.
  struct Column {
    std::string name;
    uint64_t elementBytes;
    bool scalar;
  };
  std::vector<Column> columnInfo;
  for (const PortInfo &port : info.inputs)
    if (port.kind == PortInfo::Kind::Full)
      columnInfo.push_back({port.name, dtypeBytes(port.dtype), false});
    else if (port.binding == PortInfo::Binding::PerTensor)
      columnInfo.push_back({port.name, dtypeBytes(port.pointee), true});
  for (const PortInfo &port : info.outputs)
    if (port.updates.empty())
      columnInfo.push_back({port.name, dtypeBytes(port.dtype), false});

  // The parameters after the table: each scalar's value or pointer, then
  // the skip flag's pointer (cuLaunchKernel takes their addresses).
  std::vector<void *> scalarSlots(call.scalars.begin(), call.scalars.end());
  void *skipIf = call.skipIf;
  std::vector<void *> tail;
  std::vector<Buffer> shared;
  size_t scalar = 0;
  for (const PortInfo &port : info.inputs) {
    if (port.kind != PortInfo::Kind::Scalar ||
        port.binding == PortInfo::Binding::PerTensor)
      continue;
    void *&slot = scalarSlots[scalar++];
    if (port.binding == PortInfo::Binding::Value) {
      tail.push_back(slot);
    } else {
      tail.push_back(&slot);
      shared.push_back({port.name.c_str(), slot, dtypeBytes(port.pointee)});
    }
  }
  if (skipIf) {
    tail.push_back(&skipIf);
    shared.push_back({"skip_if", skipIf, dtypeBytes(info.skipIf)});
  }

  std::vector<int64_t> pending;
  for (size_t t = 0; t < call.numel.size(); ++t)
    if (call.numel[t] > 0)
      pending.push_back(t);
  for (size_t first = 0; first < pending.size(); first += capacity) {
    llvm::ArrayRef<int64_t> tensors =
        llvm::ArrayRef(pending).slice(first, std::min<size_t>(
                                                 capacity, pending.size() - first));
    std::vector<int64_t> table =
        multiTensorTable(call, columns, tensors, words);
    int64_t chunks = 0;
    for (int64_t t : tensors)
      chunks += (call.numel[t] + chunk - 1) / chunk;
    std::vector<void *> params = {table.data()};
    params.insert(params.end(), tail.begin(), tail.end());
    std::vector<Buffer> buffers;
    std::vector<std::string> names;
    if (api->setBuffers) {
      names.reserve(tensors.size() * columns);
      buffers = shared;
      for (int64_t t : tensors)
        for (int64_t c = 0; c < columns; ++c) {
          const Column &column = columnInfo[c];
          names.push_back(llvm::formatv("{0}[{1}]", column.name, t));
          uint64_t elements = column.scalar ? 1 : call.numel[t];
          buffers.push_back({names.back().c_str(),
                             call.pointers[t * columns + c],
                             elements * column.elementBytes});
        }
    }
    unsigned blocks = std::min<int64_t>(chunks, loaded->blocksPerSM * *sms);
    if (llvm::Error error = launchOne(loaded->main, info.name, blocks,
                                      info.tile.threadsPerRow, 0, stream,
                                      params, buffers))
      return error;
  }
  return llvm::Error::success();
}
