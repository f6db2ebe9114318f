//===- module.cpp - tilefuse._C: the DSL builder, built-ins, runtime ------===//
//
// The Python package reaches the compiler and runtime through this module
// (the DSL builder, fusions and their kernels' interfaces) and through the
// tilefuse:: torch ops (TorchOps.cpp), which run kernels on tensors.
// Diagnostics and runtime errors become Python exceptions carrying their
// messages.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Compiler/Builder.h"
#include "tilefuse/Emulator/Emulator.h"
#include "tilefuse/Compiler/KernelABI.h"
#include "tilefuse/Kernels/Builtins.h"
#include "tilefuse/Runtime/CudaDriver.h"
#include "tilefuse/Runtime/Fusion.h"
#include "tilefuse/Runtime/Runtime.h"
#include "tilefuse/Torch/OpSourceHash.h"

#include "TorchRunner.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/raw_ostream.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>

namespace py = pybind11;
using namespace tilefuse;

namespace {

/// Collects diagnostics emitted while it lives.
class Diagnostics {
public:
  Diagnostics()
      : handler(&Runtime::global().context(), [this](mlir::Diagnostic &d) {
          if (!text.empty())
            text += "\n";
          text += d.str();
          return mlir::success();
        }) {}
  const std::string &str() const { return text; }

private:
  std::string text;
  mlir::ScopedDiagnosticHandler handler;
};

std::string takeMessage(llvm::Error error) {
  return llvm::toString(std::move(error));
}

dsl::Kind parseKind(const std::string &kind) {
  std::optional<dsl::Kind> parsed = fuse::symbolizeValueKind(kind);
  if (!parsed)
    throw py::value_error("unknown kind '" + kind +
                          "': expected full, row, col or scalar");
  return *parsed;
}

dsl::DType parseDType(const std::string &dtype) {
  std::optional<dsl::DType> parsed =
      llvm::StringSwitch<std::optional<dsl::DType>>(dtype)
          .Case("f32", dsl::DType::F32)
          .Case("f16", dsl::DType::F16)
          .Case("bf16", dsl::DType::BF16)
          .Case("f64", dsl::DType::F64)
          .Case("i1", dsl::DType::I1)
          .Case("i32", dsl::DType::I32)
          .Case("i64", dsl::DType::I64)
          .Default(std::nullopt);
  if (!parsed)
    throw py::value_error("unknown dtype '" + dtype +
                          "': expected f32, f16, bf16, f64, i1, i32 or i64");
  return *parsed;
}

std::string typeString(mlir::Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return text;
}

py::list portList(const std::vector<PortInfo> &ports) {
  py::list list;
  for (const PortInfo &port : ports) {
    list.append(py::make_tuple(port.name, PortInfo::kindName(port.kind).str(),
                               port.dtype));
  }
  return list;
}

/// A fusion the builder finished or a built-in.
struct PyFusion {
  explicit PyFusion(std::shared_ptr<Fusion> fusion) : fusion(fusion) {}

  /// (name, kind, dtype) of the kernel's inputs or outputs.
  py::list ports(bool outputs) const {
    return portList(outputs ? fusion->outputs() : fusion->inputs());
  }

  std::shared_ptr<CpuKernel> compileCpu(const std::string &dtype, int64_t n,
                                        bool aligned) {
    auto kernel = fusion->cpuKernel(dtype, n, aligned);
    if (!kernel)
      throw std::runtime_error(takeMessage(kernel.takeError()));
    // Kernels are immutable; pybind11 holders are not const-qualified.
    return std::const_pointer_cast<CpuKernel>(*kernel);
  }

  std::shared_ptr<GpuKernel> compileGpu(const std::string &dtype, int64_t n,
                                        bool aligned, const std::string &chip) {
    auto kernel = fusion->gpuKernel(dtype, n, aligned, chip);
    if (!kernel)
      throw std::runtime_error(takeMessage(kernel.takeError()));
    return std::const_pointer_cast<GpuKernel>(*kernel);
  }

  std::shared_ptr<Fusion> fusion;
};

class Builder;

/// A value being traced.
struct PyValue {
  dsl::Value value;
  std::string kind() const {
    return stringifyValueKind(value.kind()).str();
  }
  std::string dtype() const {
    return typeString(
        llvm::cast<fuse::ValueType>(value.get().getType()).getElementType());
  }
};

class Builder {
public:
  Builder(const std::string &name, const std::string &compute)
      : builder(std::make_unique<dsl::FusionBuilder>(
            Runtime::global().context(), name, parseDType(compute))) {}

  dsl::FusionBuilder &get() {
    if (!builder)
      throw std::runtime_error("this fusion builder has already finished");
    return *builder;
  }

  std::unique_ptr<PyFusion> finish() {
    Diagnostics diagnostics;
    auto module = get().finish();
    builder.reset();
    if (mlir::failed(module))
      throw py::value_error(diagnostics.str());
    return std::make_unique<PyFusion>(
        std::make_shared<Fusion>(std::move(*module)));
  }

private:
  std::unique_ptr<dsl::FusionBuilder> builder;
};


} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tilefuse's compiler and runtime";

  py::class_<PyValue>(m, "Value")
      .def_property_readonly("kind", &PyValue::kind)
      .def_property_readonly("dtype", &PyValue::dtype);

  py::class_<PyFusion>(m, "Fusion")
      .def_property_readonly("ir", [](const PyFusion &f) { return f.fusion->ir(); })
      .def_property_readonly("fingerprint", [](const PyFusion &f) { return f.fusion->fingerprint(); })
      .def("launch_handle", [](const PyFusion &f,
                               std::vector<std::pair<size_t, size_t>> inplace,
                               std::vector<bool> pointers) {
        return torch_ops::registerFusion(f.fusion, std::nullopt,
                                         std::move(inplace), std::move(pointers));
      }, py::arg("inplace") = std::vector<std::pair<size_t, size_t>>{},
      py::arg("pointers") = std::vector<bool>{},
      "A new handle for tilefuse::launch_fusion, launch_fusion_ and "
      "launch_multi_tensor to run this fusion (its ports typed as declared); "
      "launch_fusion_ and launch_multi_tensor write the (output, input) index "
      "pairs `inplace` into their inputs (launch_fusion writes every output "
      "to a new tensor). It reads the scalar "
      "inputs flagged in `pointers` (one flag per input) from one-element "
      "tensors.")
      .def("derivative", [](const PyFusion &f) {
        llvm::Expected<FusionDerivative &> derivative = f.fusion->derivative();
        if (!derivative)
          throw std::runtime_error(takeMessage(derivative.takeError()));
        return py::dict(
            py::arg("differentiable") = derivative->differentiable(),
            py::arg("saved_outputs") = derivative->savedOutputs(),
            py::arg("forward_outputs") = portList(derivative->forward().outputs()));
      }, "How autograd runs this fusion: the inputs with gradients, the "
         "derived forward's outputs and which of them the backward reads.")
      .def_property_readonly("inputs", [](const PyFusion &f) { return f.ports(false); })
      .def_property_readonly("outputs", [](const PyFusion &f) { return f.ports(true); })
      .def("compile_cpu", &PyFusion::compileCpu, py::arg("dtype"), py::arg("n"),
           py::arg("aligned"))
      .def("compile_gpu", &PyFusion::compileGpu, py::arg("dtype"), py::arg("n"),
           py::arg("aligned"), py::arg("chip"));

  py::class_<GpuKernel, std::shared_ptr<GpuKernel>>(m, "GpuKernel")
      .def_property_readonly("name", [](const GpuKernel &k) { return k.info.name; })
      .def_property_readonly("n", [](const GpuKernel &k) { return k.info.n; })
      .def_property_readonly("ptx", [](const GpuKernel &k) { return py::bytes(k.ptx); })
      .def_property_readonly("inputs", [](const GpuKernel &k) { return portList(k.info.inputs); })
      .def_property_readonly("outputs", [](const GpuKernel &k) { return portList(k.info.outputs); })
      .def_property_readonly("threads_per_row", [](const GpuKernel &k) { return k.info.tile.threadsPerRow; })
      .def_property_readonly("rows_per_block", [](const GpuKernel &k) { return k.info.tile.rowsPerBlock; })
      .def_property_readonly("blocks_per_sm", [](const GpuKernel &k) { return k.info.tile.blocksPerSM; })
      .def_property_readonly("staged_chunks", [](const GpuKernel &k) { return k.info.tile.stagedChunks; })
      .def_property_readonly("stage_bytes", [](const GpuKernel &k) { return k.info.tile.stageBytes; })
      .def_property_readonly("finalize_name", [](const GpuKernel &k) {
        return k.info.name + kFinalizeSuffix;
      })
      .def_property_readonly("finalize_threads", [](const GpuKernel &) { return kFinalizeThreads; });

  py::class_<CpuKernel, std::shared_ptr<CpuKernel>>(m, "CpuKernel")
      .def_property_readonly("name", [](const CpuKernel &k) { return k.info().name; })
      .def_property_readonly("n", [](const CpuKernel &k) { return k.info().n; })
      .def_property_readonly("inputs", [](const CpuKernel &k) { return portList(k.info().inputs); })
      .def_property_readonly("outputs", [](const CpuKernel &k) { return portList(k.info().outputs); });

  auto wrap = [](dsl::Value value) { return PyValue{value}; };
  py::class_<Builder>(m, "Builder")
      .def(py::init<const std::string &, const std::string &>(),
           py::arg("name"), py::arg("compute") = "f32")
      .def("input", [=](Builder &b, const std::string &name, const std::string &kind,
                        const std::string &dtype) {
        return wrap(b.get().input(name, parseKind(kind), parseDType(dtype)));
      })
      .def("output", [](Builder &b, const std::string &name, const PyValue &v) {
        b.get().output(name, v.value);
      })
      .def("constant", [=](Builder &b, double value, const std::string &dtype) {
        return wrap(b.get().constant(value, parseDType(dtype)));
      })
      .def("scalar_like", [=](Builder &b, double value, const PyValue &like) {
        return wrap(b.get().scalar(value, like.value));
      })
      .def("row_length", [=](Builder &b) { return wrap(b.get().rowLength()); })
      .def("iota", [=](Builder &b) { return wrap(b.get().iota()); })
      .def("reduce", [=](Builder &b, const std::string &kind, const PyValue &v,
                         bool columns) {
        std::optional<fuse::ReduceKind> parsed = fuse::symbolizeReduceKind(kind);
        if (!parsed)
          throw py::value_error("unknown reduction '" + kind + "'");
        return wrap(b.get().reduce(*parsed, v.value,
                                   columns ? dsl::Kind::Col : dsl::Kind::Row));
      })
      .def("arg_reduce", [=](Builder &b, const std::string &kind, const PyValue &v) {
        std::optional<fuse::ReduceKind> parsed = fuse::symbolizeReduceKind(kind);
        if (!parsed || (*parsed != fuse::ReduceKind::Max &&
                        *parsed != fuse::ReduceKind::Min))
          throw py::value_error("unknown arg reduction '" + kind +
                                "': expected max or min");
        return wrap(b.get().argReduce(*parsed, v.value));
      })
      .def("gather", [=](Builder &b, const PyValue &source, const PyValue &index) {
        return wrap(b.get().gather(source.value, index.value));
      })
      .def("binary", [=](Builder &b, const std::string &op, const PyValue &l,
                         const PyValue &r) {
        static const char *const known[] = {"add", "sub", "mul", "div",
                                            "pow", "maximum", "minimum"};
        if (!llvm::is_contained(known, op))
          throw py::value_error("unknown binary op '" + op + "'");
        return wrap(b.get().binary(op, l.value, r.value));
      })
      .def("unary", [=](Builder &b, const std::string &op, const PyValue &x) {
        static const char *const known[] = {
            "neg",  "abs",     "exp",   "log",   "sqrt", "rsqrt",
            "tanh", "erf",     "sigmoid", "log1p", "expm1", "sin",
            "cos",  "floor",   "round"};
        if (!llvm::is_contained(known, op))
          throw py::value_error("unknown unary op '" + op + "'");
        return wrap(b.get().unary(op, x.value));
      })
      .def("compare", [=](Builder &b, const std::string &predicate,
                          const PyValue &l, const PyValue &r) {
        std::optional<fuse::CmpPredicate> parsed =
            fuse::symbolizeCmpPredicate(predicate);
        if (!parsed)
          throw py::value_error("unknown comparison '" + predicate + "'");
        return wrap(b.get().compare(*parsed, l.value, r.value));
      })
      .def("where", [=](Builder &b, const PyValue &c, const PyValue &x,
                        const PyValue &y) {
        return wrap(b.get().select(c.value, x.value, y.value));
      })
      .def("fma", [=](Builder &b, const PyValue &x, const PyValue &y,
                      const PyValue &z) {
        return wrap(b.get().fma(x.value, y.value, z.value));
      })
      .def("composite", [=](Builder &b, const std::string &op, const PyValue &x) {
        b.get(); // a finished builder raises
        using Composite = dsl::Value (*)(dsl::Value);
        static const std::pair<const char *, Composite> composites[] = {
            {"sign", dsl::sign},       {"relu", dsl::relu},
            {"square", dsl::square},   {"softmax", dsl::softmax},
            {"log_softmax", dsl::logSoftmax}, {"logsumexp", dsl::logsumexp}};
        for (auto [name, composite] : composites)
          if (op == name)
            return wrap(composite(x.value));
        throw py::value_error("unknown composite op '" + op + "'");
      })
      .def("clamp", [=](Builder &b, const PyValue &x, std::optional<PyValue> min,
                        std::optional<PyValue> max) {
        b.get();
        auto value = [](const std::optional<PyValue> &v) {
          return v ? std::optional<dsl::Value>(v->value) : std::nullopt;
        };
        return wrap(dsl::clamp(x.value, value(min), value(max)));
      })
      .def("softplus", [=](Builder &b, const PyValue &x, const PyValue &beta,
                           const PyValue &threshold) {
        b.get();
        return wrap(dsl::softplus(x.value, beta.value, threshold.value));
      })
      .def("cast", [=](Builder &b, const PyValue &x, const std::string &dtype) {
        return wrap(b.get().castTo(x.value, b.get().elementType(parseDType(dtype))));
      })
      .def("finish", &Builder::finish);

  m.def("builtin", [](const std::string &name, const std::string &compute) {
    auto fusion = kernels::builtinFusion(name, parseDType(compute));
    if (!fusion)
      throw py::value_error(takeMessage(fusion.takeError()));
    return std::make_unique<PyFusion>(*fusion);
  }, py::arg("name"), py::arg("compute") = "f32",
  "The built-in fusion `name`, computing in `compute` (f32, or f64 for "
  "float64 tensors).");
  m.def("builtin_names", [] {
    std::vector<std::string> names;
    for (llvm::StringRef name : kernels::builtinNames())
      names.push_back(name.str());
    return names;
  });
  m.def("compile_count", [] { return Runtime::global().compileCount(); });
  m.def("kernel_launches", [] { return kernelLaunches(); },
        "Kernel launches so far: CPU kernel runs (one parallel loop each) "
        "and GPU launches.");
  m.def("cache_directory", [] { return Runtime::global().cache().directory(); });
  m.def("cache_writes_to_disk", [] { return Runtime::global().cache().writesToDisk(); });
  m.def("compiler_version", [] { return compilerVersion(); });
  m.def("op_source_hash", [] { return std::string(TILEFUSE_OP_SOURCE_HASH); },
        "The SHA-256 of the tilefuse:: ops' C++ sources and the built-ins'.");
  m.def("cuda_driver_error", []() -> std::string {
    llvm::Expected<CudaDriver &> driver = CudaDriver::global();
    return driver ? "" : takeMessage(driver.takeError());
  }, "Why the CUDA driver cannot be used, or '' when it can (loads it).");
  m.def("target", [] {
    const TargetSelection &target = selectedTarget();
    if (!target.error.empty())
      throw py::value_error(target.error);
    const char *kind = target.kind == TargetSelection::Kind::Cpu ? "cpu"
                       : target.kind == TargetSelection::Kind::Emulate
                           ? "emulate"
                           : "";
    return py::make_tuple(kind, target.chip);
  }, "TILEFUSE_TARGET as (kind, chip): ('', '') when unset, ('cpu', ''), or "
     "('emulate', 'sm_90'/'sm_80').");
  m.def("emulator_device", [] {
    // The emulator picks its chip from TILEFUSE_TARGET when it is loaded.
    if (selectedTarget().kind == TargetSelection::Kind::Emulate)
      if (llvm::Expected<CudaDriver &> driver = CudaDriver::global(); !driver)
        throw std::runtime_error(takeMessage(driver.takeError()));
    return py::make_tuple(emulator::deviceChip(),
                          emulator::deviceMultiprocessors());
  }, "The emulated chip and its SM count.");
  m.def("emulator_launches", [] {
    py::list launches;
    for (const emulator::LaunchRecord &record : emulator::takeLaunches()) {
      py::list buffers;
      for (const emulator::BufferTraffic &buffer : record.buffers) {
        py::dict entry;
        entry["name"] = buffer.name;
        entry["bytes"] = buffer.bytes;
        entry["loaded_bytes"] = buffer.loadedBytes;
        entry["stored_bytes"] = buffer.storedBytes;
        entry["loads"] = buffer.loads;
        entry["stores"] = buffer.stores;
        buffers.append(entry);
      }
      py::dict instructions;
      for (size_t c = 0; c < emulator::kInstructionClasses; ++c)
        instructions[emulator::className(
            static_cast<emulator::InstructionClass>(c))] =
            record.instructions[c];
      py::dict launch;
      launch["kernel"] = record.kernel;
      launch["chip"] = record.chip;
      launch["grid"] = py::make_tuple(record.grid[0], record.grid[1],
                                      record.grid[2]);
      launch["block"] = py::make_tuple(record.block[0], record.block[1],
                                       record.block[2]);
      launch["buffers"] = buffers;
      launch["instructions"] = instructions;
      launch["barriers"] = record.barriers;
      launch["shuffles"] = record.shuffles;
      launch["declared_registers"] = record.declaredRegisters;
      launch["shared_bytes"] = record.sharedBytes;
      launch["seconds"] = record.seconds;
      launches.append(launch);
    }
    return launches;
  }, "The PTX emulator's launches since the last call (and forgets them).");
  m.def("emulator_set_approximation", [](const std::string &mode) {
    std::optional<emulator::Approximation> parsed =
        emulator::parseApproximation(mode);
    if (!parsed)
      throw py::value_error("tilefuse.emulator.set_approximation: mode must "
                            "be 'exact', 'high' or 'low', got '" + mode + "'");
    emulator::setApproximation(*parsed);
  }, "What the emulator's f32 .approx instructions return from now on.");
}
