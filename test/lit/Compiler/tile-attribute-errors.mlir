// A hand-written fuse.tile whose column partials or shared memory the
// lowering cannot place, or whose rows' lanes butterfly shuffles cannot
// combine, is refused, naming what does not fit, before anything is
// emitted.
// RUN: not tilefuse-opt %s -split-input-file --fuse-lower-to-cpu 2>&1 | FileCheck %s --check-prefix=CPU
// RUN: not tilefuse-opt %s -split-input-file --fuse-lower-to-gpu 2>&1 | FileCheck %s --check-prefix=GPU

// The CPU has no shared memory.
// CPU: error: malformed fuse.tile: partial_chunks = 2 must be 0 on the CPU or without stage_bytes, at most chunks (8), and all of them where rows_per_block > 1
fuse.kernel @cpu(%x: !fuse.full<f32>) -> (s: !fuse.col<f32>) attributes {fuse.specialization = {aligned = true, dtype = f32, n = 64 : i64}, fuse.tile = {chunks = 8 : i64, partial_chunks = 2 : i64, row_on_chip = false, rows_per_task = 1024 : i64, stage_bytes = 16384 : i64, target = "cpu", vector_width = 8 : i64}} {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %s : !fuse.col<f32>
}

// -----

// Split across 64 row groups of a block.
// GPU: error: malformed fuse.tile: partial_chunks = 2 must be 0 on the CPU or without stage_bytes, at most chunks (4), and all of them where rows_per_block > 1
fuse.kernel @split(%x: !fuse.full<f32>) -> (s: !fuse.col<f32>) attributes {fuse.specialization = {aligned = true, dtype = f32, n = 64 : i64}, fuse.tile = {blocks_per_sm = 4 : i64, chunks = 4 : i64, partial_chunks = 2 : i64, row_on_chip = false, rows_per_block = 64 : i64, stage_bytes = 8192 : i64, staged_chunks = 0 : i64, target = "sm_90", threads_per_row = 4 : i64, vector_width = 4 : i64, warps = 8 : i64}} {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %s : !fuse.col<f32>
}

// -----

// More chunks than the row has.
// GPU: error: malformed fuse.tile: partial_chunks = 5 must be 0 on the CPU or without stage_bytes, at most chunks (4)
fuse.kernel @more(%x: !fuse.full<f32>) -> (s: !fuse.col<f32>) attributes {fuse.specialization = {aligned = true, dtype = f32, n = 64 : i64}, fuse.tile = {blocks_per_sm = 4 : i64, chunks = 4 : i64, partial_chunks = 5 : i64, row_on_chip = false, rows_per_block = 1 : i64, stage_bytes = 8192 : i64, staged_chunks = 0 : i64, target = "sm_90", threads_per_row = 4 : i64, vector_width = 4 : i64, warps = 1 : i64}} {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.col<f32>
  fuse.yield %s : !fuse.col<f32>
}

// -----

// A stage_bytes that fills the block's shared memory (227 KiB on sm_90,
// more than its 28 staged chunks take) leaves no room for the row
// reduction's workgroup slots (16 warps a row).
// GPU: error: the staged chunks (232448 bytes) and the row reductions' slots (64) exceed the shared memory a block of sm_90 may have
fuse.kernel @slots(%x: !fuse.full<f32>) -> (s: !fuse.row<f32>) attributes {fuse.specialization = {aligned = true, dtype = f32, n = 131072 : i64}, fuse.tile = {blocks_per_sm = 0 : i64, chunks = 64 : i64, row_on_chip = false, rows_per_block = 1 : i64, stage_bytes = 232448 : i64, staged_chunks = 28 : i64, target = "sm_90", threads_per_row = 512 : i64, vector_width = 4 : i64, warps = 16 : i64}} {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %s : !fuse.row<f32>
}

// -----

// Three warps a row: butterfly shuffles need a power of two (lane l would
// read warp l % 3, and the shuffles would count warp 0 twice).
// GPU: error: malformed fuse.tile: threads_per_row = 96 must be a power of two and threads_per_row * rows_per_block (1) at most 1024
fuse.kernel @three_warps(%x: !fuse.full<f32>) -> (s: !fuse.row<f32>) attributes {fuse.specialization = {aligned = true, dtype = f32, n = 384 : i64}, fuse.tile = {blocks_per_sm = 0 : i64, chunks = 1 : i64, row_on_chip = true, rows_per_block = 1 : i64, target = "sm_90", threads_per_row = 96 : i64, vector_width = 4 : i64, warps = 3 : i64}} {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %s : !fuse.row<f32>
}

// -----

// Too many threads a block.
// GPU: error: malformed fuse.tile: threads_per_row = 512 must be a power of two and threads_per_row * rows_per_block (4) at most 1024
fuse.kernel @too_many(%x: !fuse.full<f32>) -> (s: !fuse.row<f32>) attributes {fuse.specialization = {aligned = true, dtype = f32, n = 2048 : i64}, fuse.tile = {blocks_per_sm = 0 : i64, chunks = 1 : i64, row_on_chip = true, rows_per_block = 4 : i64, target = "sm_90", threads_per_row = 512 : i64, vector_width = 4 : i64, warps = 64 : i64}} {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %s : !fuse.row<f32>
}

// -----

// A negative threads_per_row (2^63 as an unsigned power of two) is refused
// before its product with rows_per_block wraps.
// GPU: error: malformed fuse.tile: threads_per_row = -9223372036854775808 must be a power of two and threads_per_row * rows_per_block (1) at most 1024
fuse.kernel @negative(%x: !fuse.full<f32>) -> (s: !fuse.row<f32>) attributes {fuse.specialization = {aligned = true, dtype = f32, n = 384 : i64}, fuse.tile = {blocks_per_sm = 0 : i64, chunks = 1 : i64, row_on_chip = true, rows_per_block = 1 : i64, target = "sm_90", threads_per_row = -9223372036854775808 : i64, vector_width = 4 : i64, warps = 3 : i64}} {
  %s = fuse.reduce sum %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %s : !fuse.row<f32>
}
