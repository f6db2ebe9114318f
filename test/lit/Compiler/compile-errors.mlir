// Every bad request is a diagnostic and a non-zero exit, never an LLVM ERROR.
// RUN: not tilefuse-compile %s --n=64 --target=sm_75 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: not tilefuse-compile %s --n=64 --dtype=fp8 2>&1 | FileCheck %s --check-prefix=DTYPE
// RUN: not tilefuse-compile %s --n=0 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not tilefuse-compile %s --n=64 --target=cpu --emit=ptx 2>&1 | FileCheck %s --check-prefix=CPUPTX
// RUN: not tilefuse-compile %s --n=64 --emit=cubin 2>&1 | FileCheck %s --check-prefix=EMIT
// RUN: not tilefuse-compile %s --n=64 --threads-per-row=3 2>&1 | FileCheck %s --check-prefix=TPR
// RUN: not tilefuse-compile %s --n=64 --threads-per-row=1024 --rows-per-block=2 2>&1 | FileCheck %s --check-prefix=BLOCK
// RUN: not tilefuse-compile %s --n=60 --dtype=bf16 --vector-width=16 2>&1 | FileCheck %s --check-prefix=VECTOR
// RUN: not tilefuse-compile %s --n=62 --vector-width=4 2>&1 | FileCheck %s --check-prefix=DIVISIBLE
// RUN: not tilefuse-compile %s --n=64 --row-on-chip=maybe 2>&1 | FileCheck %s --check-prefix=ONCHIP
// RUN: not tilefuse-compile %S/Inputs/invalid-kernel.mlir --n=64 2>&1 | FileCheck %s --check-prefix=VERIFY

// CHIP: error: unknown target 'sm_75': expected sm_80, sm_86, sm_89, sm_90 or cpu
// DTYPE: error: fuse-specialize: unsupported dtype 'fp8': expected f32, f16, bf16, f64 or declared
// ZERO: error: fuse-specialize: n must be positive, got 0
// CPUPTX: error: --emit=ptx needs a GPU target, not cpu
// EMIT: error: unknown --emit='cubin': expected fuse, specialized, tiled, loops, llvm or ptx
// TPR: error: fuse-select-tiles: threads-per-row must be a power of two and threads-per-row * rows-per-block at most 1024, got 3 * 85
// BLOCK: error: fuse-select-tiles: threads-per-row must be a power of two and threads-per-row * rows-per-block at most 1024, got 1024 * 2
// VECTOR: error: fuse-select-tiles: vector-width must be a power of two <= 8, got 16
// DIVISIBLE: error: fuse-select-tiles: vector-width 4 needs the aligned class and n divisible by it (n = 62)
// ONCHIP: error: fuse-select-tiles: row-on-chip must be true, false or auto, got 'maybe'
// VERIFY: error: 'fuse.add' op kind mismatch
// CHIP-NOT: LLVM ERROR
module {
  fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
    fuse.yield %x : !fuse.full<f32>
  }
}
