//===- KernelABI.h - how the runtime calls a compiled fusion ----*- C++ -*-===//
//
// GPU kernel `@<name>` (one gpu.func), parameters in this order:
//   1. each input, in declaration order: a global pointer for a full,
//      per-row or per-column tensor (row-major [rows, n], [rows], [n]); the
//      value itself for a scalar;
//   2. each output: a global pointer; for a column-reduction output, the
//      partials workspace [partial_rows, n] (its compute dtype) instead: a
//      row per block when the partials stay on chip (TileConfig.h), else a
//      row per row group;
//   3. rows (i64).
//   Launch: block = threads_per_row * rows_per_block threads;
//   grid = ceil(rows / rows_per_block) blocks, capped at blocks_per_sm * SMs
//   when blocks_per_sm > 0; row_groups = grid * rows_per_block.
// Column reductions then run `@<name>_finalize`: for each column-reduction
//   output, (partials, output) pointers, then partial_rows (i64) and rows
//   (i64);
//   blocks of kFinalizeThreads threads, ceil(n / finalizeColumns(n)) of
//   them: finalizeSlices(n) threads per column each combine a contiguous
//   share of the partial rows, in order, then the shares are combined in
//   order, so results do not vary run to run.
//
// CPU function `@<name>`: the same parameters (plain pointers), then
//   row_begin, row_end, row_group (i64): it runs rows [row_begin, row_end)
//   and accumulates column reductions into partials row `row_group`; a
//   kernel with column reductions is given at most kCpuRowsPerPartial rows
//   per row group, so that no partial sums many rows in sequence.
//   `@<name>_finalize`: the same parameters, run once for all columns, each
//   combining every row group's partial in order.
//
// A scalar bound by pointer (KernelAbi::scalarPointers) is passed as a
//   global pointer to a one-element tensor of the pointee dtype instead of
//   its value; the kernel reads it once per row (per tensor, multi-tensor)
//   and converts it to the declared type.
//
// Multi-tensor kernels (KernelAbi::multiTensor: full tensors and scalars,
// elementwise ops only) run one program over many tensors of any sizes.
//   The table: 64-bit words; [0] = T, its tensors; then for tensor t, at
//   1 + t * (L + 1), its element count and L pointers, its columns: each
//   full input, each output not written in place, each per-tensor scalar,
//   in declaration order (an in-place output uses its input's pointer).
//   GPU kernel `@<name>`: the table by value in the parameter space
//   (`.param .align 8 .b8 table[8 * W]`, W = multiTensorTableWords(P)),
//   then each scalar input not bound per tensor (its value or pointer) in
//   declaration order, then the skip flag's pointer if any: P parameters
//   besides the table. The table travels as kernel parameters, as in Apex's
//   and PyTorch's multi_tensor_apply: a launch needs no device allocation
//   or host-to-device copy, and CUDA-graph capture records it by value.
//   Launch: blocks of threads_per_row threads; each tensor is cut into
//   chunks of chunk_elements, numbered across the table in order; block b
//   of a grid of G runs the chunks c with c % G == b; G = min(chunks,
//   blocks_per_sm * SMs). A table holds multiTensorCapacity(W, L) tensors;
//   more tensors take more launches, never another compilation.
//   CPU function `@<name>`: (table pointer, the same scalars and flag, then
//   t_begin, e_begin, t_last, e_end (i64)): elements [e_begin, numel) of
//   tensor t_begin, every element of the tensors between, and [0, e_end)
//   of tensor t_last (one range when t_begin == t_last); the runtime cuts
//   the table into tasks of rows_per_task elements on its thread pool.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_KERNELABI_H
#define TILEFUSE_COMPILER_KERNELABI_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace tilefuse {
constexpr int64_t kFinalizeThreads = 256;
/// Columns a finalize block combines: 32 (a warp reads 32 consecutive f32
/// columns of a partial row, a 128-byte line), halved down to 8 (a 32-byte
/// sector) while there would be fewer than kFinalizeBlocks blocks (two per
/// SM of an H200): the finalize is latency-bound, and more threads per
/// column mean fewer partial rows, fewer round trips to memory, per thread
/// (n = 1000: 125 blocks of 8 columns, not 32 of 32; n = 4096: 256 of 16).
constexpr int64_t kFinalizeBlocks = 256;
constexpr int64_t finalizeColumns(int64_t n) {
  int64_t columns = 32;
  while (columns > 8 && (n + columns - 1) / columns < kFinalizeBlocks)
    columns /= 2;
  return columns;
}
/// Threads per column in a finalize block.
constexpr int64_t finalizeSlices(int64_t n) {
  return kFinalizeThreads / finalizeColumns(n);
}
/// Partial rows a finalize thread loads per iteration, the last group's
/// past its share not at all: each load's round trip to memory otherwise
/// waits for the previous one. A share of up to 16 partial rows (9-13 at
/// n = 1000, where the finalize was latency-bound) is one group.
constexpr int64_t kFinalizeGroup = 16;
constexpr int64_t kCpuRowsPerPartial = 64;
constexpr const char *kFinalizeSuffix = "_finalize";
constexpr const char *kGPUModuleName = "tilefuse_kernels";
/// On a multi-tensor gpu.func: the type of its table, passed by value
/// (Pipeline.cpp sets llvm.byval once the function is LLVM).
constexpr const char *kParamTableAttr = "tilefuse.param_table";

/// How the runtime passes a kernel its arguments beyond the default ABI
/// (KernelABI.h): scalars read through pointers (device-side scalars), and
/// multi-tensor launches over a table of tensors. Part of a kernel's
/// specialization; no field depends on a tensor's size.
struct KernelAbi {
  /// Scalar inputs read from a one-element tensor, by input name, with the
  /// tensor's dtype (f32, f64, i64, ...): the value stays on the device, so
  /// a new value needs no recompilation, no synchronization, and works
  /// under CUDA-graph capture.
  std::map<std::string, std::string> scalarPointers;
  /// The kernel runs over a table of tensors (elementwise fusions only).
  bool multiTensor = false;
  /// Multi-tensor: scalar inputs given one pointer per tensor (a table
  /// column), by name, with the pointee's dtype.
  std::map<std::string, std::string> perTensorScalars;
  /// Multi-tensor: output name -> the full input it overwrites in place
  /// (one table column serves both).
  std::map<std::string, std::string> inplace;
  /// Multi-tensor: the dtype of a flag read through a pointer; when it is
  /// nonzero the launch changes nothing ("" for none). GradScaler's
  /// found_inf.
  std::string skipIf;

  bool isDefault() const {
    return scalarPointers.empty() && !multiTensor && skipIf.empty();
  }
  /// The canonical text: "" for the default ABI, else fields joined by ','
  /// ("multi-tensor", "pointer:NAME:DTYPE", "per-tensor:NAME:DTYPE",
  /// "inplace:OUTPUT:INPUT", "skip-if:DTYPE"). fuse-specialize's `abi`
  /// option and the cache key use it.
  std::string str() const;
  /// Parses str()'s form; nullopt for malformed text.
  static std::optional<KernelAbi> parse(llvm::StringRef text);
};

/// Bytes of one element of a dtype the ABI names (f64, i64, f32, i32, f16,
/// bf16; others, such as a mask, take a byte).
uint64_t dtypeBytes(llvm::StringRef dtype);

/// The kernel parameter space every CUDA driver accepts (4 KiB; CUDA 12.1
/// drivers allow 32 KiB on Volta and later, with PTX ISA 8.1).
constexpr int64_t kMaxKernelParamBytes = 4096;

/// 64-bit words of a multi-tensor GPU kernel's table parameter, given its
/// other parameters (each counted as 8 bytes).
constexpr int64_t multiTensorTableWords(int64_t otherParameters) {
  return (kMaxKernelParamBytes - 8 * otherParameters) / 8;
}

/// Tensors one table holds when each has `columns` pointers: a word for
/// the count, then per tensor its element count and its pointers.
constexpr int64_t multiTensorCapacity(int64_t tableWords, int64_t columns) {
  return (tableWords - 1) / (columns + 1);
}
} // namespace tilefuse

#endif // TILEFUSE_COMPILER_KERNELABI_H
