//===- TorchRunner.h - run a fusion on PyTorch tensors ----------*- C++ -*-===//
//
// The one place that turns tensors into kernel arguments: picks the target
// from the tensors' device (TILEFUSE_TARGET=cpu forces the CPU;
// TILEFUSE_TARGET=emulate runs CPU tensors' GPU code in the PTX emulator),
// the specialization from (storage dtype, n, 16-byte alignment), checks
// every tensor against the kernel's interface, allocates the outputs, and
// runs the kernel on the CPU or launches it on the caller's CUDA stream.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_PYTHON_TORCHRUNNER_H
#define TILEFUSE_PYTHON_TORCHRUNNER_H

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <string_view>

namespace tilefuse {
class Fusion;
struct PortInfo;

namespace torch_ops {

/// The torch dtype of a fuse element type name (f32, bf16, i64, ...).
at::ScalarType scalarType(const std::string &dtype);

/// Whether a call on `device` takes the GPU path: a CUDA device, or CPU
/// tensors under TILEFUSE_TARGET=emulate (the PTX emulator). Errors (an
/// unknown TILEFUSE_TARGET) name `op`.
bool runsGPUCode(std::string_view op, const at::Device &device);

/// Runs `fusion` over a [..., n] iteration space of shape `shape` (rows =
/// the product of the leading dimensions). `tensors` are its full, per-row
/// and per-column inputs and `scalars` its scalar inputs, each in
/// declaration order; `storage` is the dtype of its full and per-column
/// float tensors, or nullopt when every port keeps the type the fusion
/// declares (DSL fusions). `out` may give outputs to write in place (by
/// output index; an undefined tensor is allocated). With `storagePerTensor`,
/// each float tensor given (inputs and `out`) is stored in its own dtype
/// instead, `storage` being the default: the kernel is specialized for that
/// mix (bf16 parameters with f32 state). `scalarTensors`, when given, has
/// one entry per scalar input: a one-element tensor binds that scalar by
/// pointer (read on the device: no synchronization, and a new value never
/// recompiles), and `scalars` then holds only the others. Errors name `op`.
std::vector<at::Tensor>
runFusion(std::string_view op, Fusion &fusion, at::TensorList tensors,
          c10::ArrayRef<c10::Scalar> scalars,
          std::optional<at::ScalarType> storage, at::IntArrayRef shape,
          at::TensorList out = {}, bool storagePerTensor = false,
          c10::ArrayRef<std::optional<at::Tensor>> scalarTensors = {});

/// One input of a multi-tensor call, per input of the fusion.
struct MultiTensorInput {
  enum class Kind {
    Tensors,   // a full input: one tensor per row set
    Value,     // a scalar by value
    Pointer,   // a scalar in a one-element tensor, shared by all row sets
    PerTensor, // a scalar in a one-element tensor per row set
  };
  Kind kind;
  at::TensorList tensors;
  c10::Scalar value;
};

/// Runs the elementwise `fusion` over row sets (the i-th tensor of every
/// list; KernelABI.h's multi-tensor kernels): one launch per (dtype,
/// alignment class) and table's worth of tensors, on the GPU, or one
/// parallel loop on the CPU. `inplace` pairs (output, input) indices: the
/// output overwrites that input's tensors. When `skipIf` (one element) is
/// nonzero the call changes nothing. Returns the tensors of each output not
/// written in place: `out`'s (one list per such output, tensors laid out as
/// their row sets) when given, else new ones. Errors name `op`.
std::vector<std::vector<at::Tensor>>
runMultiTensor(std::string_view op, Fusion &fusion,
               c10::ArrayRef<MultiTensorInput> inputs,
               c10::ArrayRef<std::pair<size_t, size_t>> inplace,
               const std::optional<at::Tensor> &skipIf,
               c10::ArrayRef<at::TensorList> out = {});

/// A built-in fusion (kernels_dsl), built once per compute type: f64 for
/// float64 tensors, else f32. Later calls cost one atomic load.
class BuiltinFusion {
public:
  explicit constexpr BuiltinFusion(const char *name) : name(name) {}
  /// The fusion for tensors of `storage`.
  Fusion &operator()(at::ScalarType storage);

private:
  const char *name;
  std::once_flag built[2];
  Fusion *fusions[2] = {};
};

/// Fusions by the handle registerFusion gave: traced by the DSL (every port
/// typed as declared: no storage dtype) or written as IR and run with the
/// storage dtype of the registration (f32, f16, bf16 or f64); with the
/// (output, input) pairs it writes in place and the scalar inputs it reads
/// through pointers.
struct RegisteredFusion {
  Fusion &fusion;
  std::optional<at::ScalarType> storage;
  const std::vector<std::pair<size_t, size_t>> &inplace;
  const std::vector<bool> &pointerScalars;
  /// The dtype `port` of the fusion or of its derived kernels has in
  /// tensors: the storage dtype for full and per-column floats.
  at::ScalarType dtypeOf(const PortInfo &port) const;
};
/// What runFusion checks of a call to `registered` before it compiles, on
/// metadata alone (symbolic shapes too), for Meta kernels: the counts of
/// tensors and of scalars (by value or by pointer), the [..., n] shape,
/// and each tensor's device, dtype, shape and layout, the tensors of `out`
/// (by output index, undefined where a new one is made) as outputs. Errors
/// name `op`.
void checkFusionInputs(std::string_view op, const RegisteredFusion &registered,
                       at::TensorList tensors, size_t scalars,
                       c10::SymIntArrayRef shape, at::TensorList out = {});
/// Whether `written`, which a fusion updates in place, may share memory
/// with `other`, another of its arguments (`otherWritten`: updated too):
/// not partly, and wholly only when `other` is read-only (each element is
/// read before it is written), as PyTorch's in-place ops refuse.
bool mayAliasWritten(const at::Tensor &written, const at::Tensor &other,
                     bool otherWritten);
/// A scalar given by value for `port`: a number its dtype holds (an int
/// port takes no float, as torch's int arguments), symbolic ones unchecked
/// (their values come when the call runs). Errors name `op` and the port.
void checkScalar(std::string_view op, const PortInfo &port,
                 const c10::Scalar &scalar);
int64_t registerFusion(std::shared_ptr<Fusion> fusion,
                       std::optional<at::ScalarType> storage = std::nullopt,
                       std::vector<std::pair<size_t, size_t>> inplace = {},
                       std::vector<bool> pointerScalars = {});
RegisteredFusion registeredFusion(std::string_view op, int64_t handle);

} // namespace torch_ops
} // namespace tilefuse

#endif // TILEFUSE_PYTHON_TORCHRUNNER_H
