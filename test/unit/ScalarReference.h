//===- ScalarReference.h - scalar references of the reference fusions -*- C++ -*-===//
//
// What the numerics tests of every target share: plain scalar C++
// references of the reference fusions (test/lit/fusions), computed in double
// from the same storage-rounded inputs; random inputs; host buffers laid out
// as KernelABI.h says (aligned or not); and the comparison with per-dtype
// tolerances. CpuNumericsTest runs the CPU JIT against them,
// EmulatedNumericsTest the PTX in the emulator.
//
// Tolerances, on |kernel - reference| <= atol + rtol * |reference|:
//   f32: atol 1e-5, rtol 1e-5    (f32 arithmetic, reordered sums)
//   f16: atol 2e-3, rtol 2e-3    (one rounding of the output: 2^-11)
//   bf16: atol 1.6e-2, rtol 1.6e-2 (one rounding of the output: 2^-8)
// NaN must be NaN, and an infinity the same infinity, as in PyTorch.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_TEST_SCALARREFERENCE_H
#define TILEFUSE_TEST_SCALARREFERENCE_H

#include "tilefuse/Compiler/Pipeline.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tilefuse::testing {

enum class Dtype { F32, F16, BF16 };

const char *dtypeName(Dtype dtype);
size_t dtypeBytes(Dtype dtype);
/// `value` rounded to nearest even in `dtype`, as raw bits.
uint32_t toBits(float value, Dtype dtype);
float fromBits(uint32_t bits, Dtype dtype);
float roundTo(float value, Dtype dtype);

/// `value` as fuse.round_to_storage of an input stored in `dtype` leaves
/// it: rounded to that dtype; unchanged for f32, the compute type (the
/// references compute in double).
double storedAs(Dtype dtype, double value);

/// Host values of one kernel input or output, by name. Floats are kept as
/// double (already rounded to their storage type), indices as int64.
struct Values {
  std::map<std::string, std::vector<double>> floats;
  std::map<std::string, std::vector<int64_t>> ints;
  std::map<std::string, double> scalars;
  std::map<std::string, int64_t> intScalars;
  /// The storage dtype of each float input.
  std::map<std::string, Dtype> storage;
};

constexpr int64_t kIgnoreIndex = -100;

using Reference = std::function<void(const Values &, int64_t rows, int64_t n,
                                     Values &out)>;
/// The reference of each reference fusion, by name.
const std::map<std::string, Reference> &references();

/// Fusions that are variants of another one (the same kinds, reductions and
/// lowering paths, other math: the RMSNorm castings, GeGLU, AdamW amsgrad):
/// the sweeps run them at fewer shapes, leaving long rows and misaligned
/// pointers to the fusion they vary.
bool isVariant(const std::string &name);

/// Random inputs for a kernel, rounded to their storage types; statistics
/// inputs (rstd, mean, lse) are computed from the data, as the forward pass
/// would have saved them.
Values makeInputs(const KernelInfo &info, int64_t rows, uint32_t seed);

/// Host storage of one tensor, `offset` bytes past a 64-byte boundary (one
/// element, for the unaligned class: element-aligned, as a tensor's data is,
/// never 16-byte aligned).
struct HostBuffer {
  std::vector<uint8_t> bytes;
  size_t offset = 0, size = 0;
  void *data() { return bytes.data() + offset; }
};
HostBuffer makeBuffer(size_t bytes, size_t misalignment);

size_t elementCount(PortInfo::Kind kind, int64_t rows, int64_t n);
bool isFloatDtype(const std::string &dtype);
Dtype dtypeOf(const std::string &dtype);
/// Bytes of one element of a port's dtype.
size_t elementBytes(const std::string &dtype);

/// A kernel's arguments in KernelABI order (per input then output: a
/// buffer's address, or a scalar's), with the buffers behind them.
struct Arguments {
  std::vector<HostBuffer> buffers; // inputs, then outputs
  std::vector<float> floatScalars;
  std::vector<int64_t> intScalars;
  std::vector<void *> pointers;
  size_t firstOutput = 0;
};
/// Buffers for `info` over `rows` rows holding `in`, 64-byte aligned or one
/// element past it; outputs allocated, uninitialized.
Arguments makeArguments(const KernelInfo &info, const Values &in, int64_t rows,
                        bool aligned);
/// The outputs a kernel left in `arguments`.
Values readOutputs(const KernelInfo &info, Arguments &arguments, int64_t rows);

struct Tolerance {
  double atol, rtol;
};
Tolerance toleranceFor(const std::string &storage);

/// Counts mismatches (GoogleTest failures); reports the first few.
void expectClose(const std::string &what, const std::vector<double> &actual,
                 const std::vector<double> &expected, Tolerance tolerance,
                 double scale = 1.0);

/// The cross-entropy fusions (kernels_dsl/lib/CrossEntropy.h) by name:
/// class indices or probabilities, soft-capped or not, what they compute.
struct CrossEntropyForm {
  bool probs, weighted, capped, forward, backward;
};
CrossEntropyForm crossEntropyForm(const std::string &name);
/// The cross-entropy fusions beyond the plain forward and backward: the
/// same math, so the sweeps cover them more thinly.
bool isCrossEntropyVariant(const std::string &name);
/// The max, log-sum and mass a cross-entropy forward pass saves, from the
/// logits in `in`, for a backward pass.
void saveCrossEntropyStats(const std::string &name, Values &in, int64_t rows,
                           int64_t n);
/// Half of each row's logits -inf and row 5 all -inf, targets moved into the
/// unmasked half, with `labelSmoothing`; asserts that the reference's loss
/// of row 0 is finite exactly when there is no smoothing (as torch's), for
/// kernels that compute it on unmasked logits (not soft-capped).
void maskHalfOfEachRow(const KernelInfo &info, Values &in, int64_t rows,
                       double labelSmoothing);

/// Column reductions sum `rows` terms: the tolerance grows with sqrt(rows).
double columnScale(const PortInfo &port, int64_t rows);

/// A NaN in row 2 and +Inf in row 4 of the kernel's first full float input
/// (rows >= 5, n >= 10): they must propagate as in PyTorch.
void addNaNAndInf(const KernelInfo &info, Values &in);

/// Compares every output in `actual` with `reference` of `in`, rounded to
/// the output's storage type.
void expectMatchesReference(const KernelInfo &info, const Reference &reference,
                            const Values &in, const Values &actual,
                            int64_t rows);

struct Case {
  std::string fusion;
  Dtype dtype;
  int64_t n;
  int64_t rows;
  bool aligned;
};
std::string caseName(const Case &c);

} // namespace tilefuse::testing

#endif // TILEFUSE_TEST_SCALARREFERENCE_H
