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
// RUN: not tilefuse-compile %s --n=64 --threads-per-row=2 --rows-per-block=4611686018427387904 2>&1 | FileCheck %s --check-prefix=OVERFLOW
// RUN: not tilefuse-compile %t.missing.mlir 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not tilefuse-compile %s --n=abc 2>&1 | FileCheck %s --check-prefix=NOTINT
// RUN: not tilefuse-compile %s --n=99999999999999999999999 2>&1 | FileCheck %s --check-prefix=BIGINT
// RUN: echo 'garbage {' | not tilefuse-compile --n=4 2>&1 | FileCheck %s --check-prefix=PARSE
// RUN: echo 'module {}' | not tilefuse-compile --n=4 2>&1 | FileCheck %s --check-prefix=EMPTY
// Limits on compile work (TileConfig.h): each of these once ran for minutes
// or until memory ran out.
// RUN: not tilefuse-compile %S/../fusions/rms_norm_fwd.mlir --n=65536 --target=cpu --row-on-chip=true --emit=llvm 2>&1 | FileCheck %s --check-prefix=UNROLL-CPU
// RUN: not tilefuse-compile %S/../fusions/rms_norm_fwd.mlir --n=1099511627776 --target=sm_80 --row-on-chip=true 2>&1 | FileCheck %s --check-prefix=UNROLL-GPU
// RUN: not tilefuse-compile %s --n=1099511627777 2>&1 | FileCheck %s --check-prefix=HUGE
// RUN: not tilefuse-compile %S/Inputs/many-ops.mlir --n=16384 --threads-per-row=32 --dtype=bf16 --row-on-chip=true 2>&1 | FileCheck %s --check-prefix=OPS
// RUN: tilefuse-compile %S/Inputs/many-ops.mlir --n=16384 --threads-per-row=32 --dtype=bf16 --row-on-chip=false --emit=tiled | FileCheck %s --check-prefix=STREAMED

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
// MISSING: error: cannot open input file '{{.*}}.missing.mlir': No such file or directory
// NOTINT: for the -n option: 'abc' value invalid for long argument!
// BIGINT: for the -n option: '99999999999999999999999' value invalid for long argument!
// PARSE: error: custom op 'garbage' is unknown
// EMPTY: error: no fuse.kernel to compile
// OVERFLOW: error: fuse-select-tiles: threads-per-row must be a power of two and threads-per-row * rows-per-block at most 1024, got 2 * 4611686018427387904
// UNROLL-CPU: error: fuse-select-tiles: row-on-chip=true would unroll 8192 chunks per thread (n = 65536); at most 64 are unrolled: use row-on-chip=false or auto{{$}}
// UNROLL-GPU: error: fuse-select-tiles: row-on-chip=true would unroll 536870912 chunks per thread (n = 1099511627776); at most 64 are unrolled: use row-on-chip=false or auto or more threads-per-row
// HUGE: error: fuse-specialize: n must be at most 2^40 = 1099511627776, got 1099511627777
// OPS: error: fuse-select-tiles: kernel @many_ops would emit about 167936 operations (164 ops x 2 passes x 64 unrolled chunks x 8 lanes); the limit is 131072: split the fusion or use row-on-chip=false
// STREAMED: row_on_chip = false
// CHIP-NOT: LLVM ERROR
module {
  fuse.kernel @k(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
    fuse.yield %x : !fuse.full<f32>
  }
}
