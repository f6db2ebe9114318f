//===- KernelABI.h - how the runtime calls a compiled fusion ----*- C++ -*-===//
//
// GPU kernel `@<name>` (one gpu.func), parameters in this order:
//   1. each input, in declaration order: a global pointer for a full,
//      per-row or per-column tensor (row-major [rows, n], [rows], [n]); the
//      value itself for a scalar;
//   2. each output: a global pointer; for a column-reduction output, the f32
//      partials workspace [row_groups, n] instead;
//   3. rows (i64).
//   Launch: block = threads_per_row * rows_per_block threads;
//   grid = ceil(rows / rows_per_block) blocks, capped at blocks_per_sm * SMs
//   when blocks_per_sm > 0; row_groups = grid * rows_per_block.
// Column reductions then run `@<name>_finalize`: for each column-reduction
//   output, (partials, output) pointers, then row_groups (i64) and rows (i64);
//   one thread per column, blocks of kFinalizeThreads; it combines the
//   partials in row-group order, so results do not vary run to run.
//
// CPU function `@<name>`: the same parameters (plain pointers), then
//   row_begin, row_end, row_group (i64): it runs rows [row_begin, row_end)
//   and accumulates column reductions into partials row `row_group`; a
//   kernel with column reductions is given at most kCpuRowsPerPartial rows
//   per row group, so that no partial sums many rows in sequence.
//   `@<name>_finalize` as on the GPU, run once for all columns.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_KERNELABI_H
#define TILEFUSE_COMPILER_KERNELABI_H

#include <cstdint>

namespace tilefuse {
constexpr int64_t kFinalizeThreads = 256;
constexpr int64_t kCpuRowsPerPartial = 64;
constexpr const char *kFinalizeSuffix = "_finalize";
constexpr const char *kGPUModuleName = "tilefuse_kernels";
} // namespace tilefuse

#endif // TILEFUSE_COMPILER_KERNELABI_H
