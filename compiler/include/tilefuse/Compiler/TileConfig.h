//===- TileConfig.h - how a specialized kernel maps onto a target -*- C++ -*-===//
//
// The heuristic, per target. Notation: n is the row length, b the bytes of
// the storage dtype, V the vector width in elements.
//
// GPU (sm_80 / sm_90):
//  - V = 16 / b (one 128-bit access) in the aligned class when n % V == 0,
//    else 1 (scalar accesses, masked tail).
//  - threads_per_row = the power of two nearest above ceil(n / V) / 4, in
//    [1, 512]: about four vectors per thread keeps loads in flight; past 512
//    threads a thread gets under 128 registers and long rows spill.
//    Occupancy: a fusion with a row reduction doubles it (up to 512) until
//    a thread's chunks of all full inputs hold at most 32 elements. ptxas
//    gives a row kept on chip about 2.3 registers per such element (it
//    keeps the widened values and what the passes derive from them): 32
//    elements take 72-98 registers, so two or three 256-thread blocks share
//    an SM, where 64 (two bf16 inputs of 4096 at 128 threads) took 151-163
//    and one block ran per SM. A fusion that loads 16-byte vectors and
//    reduces its rows without writing a full row (the cross-entropy
//    losses) starts from 32 elements a thread instead of four vectors (8
//    vectors of f32 with one full input, at most 8 chunks): rows of fewer
//    threads, so more rows per SM and fewer warps per barrier. f32 n = 8192
//    took 512 threads a row and one or two blocks per SM (62-78
//    registers); at 256 threads, four (60-64, some after the runtime's
//    second JIT): the traffic model's
//    cross_entropy_fwd 71% -> 100%, the weighted one 34% -> 100%. At n =
//    1000 a row is one warp, reduced by shuffles alone. A fusion that
//    writes a full row holds more than its loads for its last pass: there
//    the same rule took cross_entropy_weighted_capped_fwd_grad f32 n = 4096
//    from 80 registers to 255 (76% -> 45%), so it keeps four vectors.
//    Fewer idle vectors: a fusion with a row reduction that keeps its row
//    on chip takes half or a quarter of those threads where that leaves
//    fewer vector slots of the last chunk idle and the row still fits in
//    registers (below): at bf16 n = 5120 (640 vectors) the rule above gave
//    the backward norms 512 threads of 2 chunks (3 of 8 slots of the
//    second idle, one 512-thread block per SM); 128 threads of 5 chunks
//    fill them (two rows a block, 113-145 registers, no spill on
//    sm_80/86/90). The traffic model, timing every tile of 64-512
//    threads at nine lengths of 1000-16384 (TILEFUSE_TILE): rms_norm_bwd
//    and layer_norm_bwd at bf16 n = 3072 46%, 43% -> 94%, 93%; 5120 36%,
//    34% -> 93%, 95%; 6144 43%, 40% -> 96%, 95%; f32 5120 79%, 74% ->
//    98%, 97%; rms_norm_fwd f32 5120 89% -> 100%, layer_norm_fwd 5120
//    79% (bf16), 57% (f32) -> 100%, cross_entropy_fwd and _fwd_grad bf16
//    5120 78%, 86% -> 98%, 100%; no cell of the table moved.
//    At most 256 threads: a row kept on chip takes 256 threads rather than
//    512 where a row of 256 still stays on chip (with one full input, bf16
//    n of 8193-16384 and f32 4097-8192; with two, as in the backward
//    norms, bf16 n = 8192): twice the row groups an SM holds for the bytes
//    a thread keeps. Both rules apply only to a row the rule above keeps
//    on chip, and keep at most 112 elements a thread (the most any tile
//    they chose in the model kept) within the compile work below. The traffic model, side by side: of the 528 cells of
//    every built-in at n = 2048-16384 (eight lengths) 26 rose, none fell
//    (layer_norm_fwd bf16 12288 and 16384 52%, 65% -> 100%, the
//    cross-entropy forwards at bf16 12288-16384 32-87% -> 35-100%, the
//    backward norms at f32 6144 89-96% -> 98%); of the table's 396 cells 8
//    rose (the probability-target cross-entropy forwards at bf16 8192
//    40-92% -> 83-100%, rms_norm_bwd bf16 8192 57% -> 88%) and one fell
//    (layer_norm_bwd bf16 8192 53% -> 49%, 165 registers); cells at >= 85%
//    254 -> 259. Where 256 threads do not keep the row (the backward
//    norms at bf16 12288-16384, two full inputs; the probability targets
//    at 16384) it stays at 512.
//    One warp a row: a fusion that reduces its rows without writing a full
//    row or reducing columns, loads 16-byte vectors and makes one pass over
//    a row where it made more once its reductions merge (the cross-entropy
//    losses; shape.mergesToOnePass) gives a row of at most 16384 elements
//    (kMaxWarpRowLength) at most 32 threads: its lanes meet in butterfly
//    shuffles alone, with no barrier and no shared memory, and eight rows
//    share a block. A row the rules above gave more threads would keep more
//    than 32 elements a thread in one: it streams, in its one merged pass
//    (kept on chip at f32 n = 1000 with two inputs, the probability-target
//    loss spilled 8 bytes on sm_80 and sm_86, ptxas 13.0). A reduction that
//    was one pass already keeps the rules above: in one warp a row a plain
//    bf16 row sum of 16384 took 235 registers on sm_80 (LLVM unrolled its
//    short loop whole), 40 in the rules' rows of 256 threads. The traffic
//    model, against the rules above, for the six losses at bf16 and f32 n =
//    1000-16384 (nine lengths, 108 cells): 55 rose, 9 fell, cells at >= 85%
//    47 -> 67. cross_entropy_fwd bf16
//    2048-6144 74-98% -> 100%; the weighted one bf16 2048-16384 53-90% ->
//    96-100% (f32 84-98% -> 100% where lower); the probability-target one
//    bf16 78-99% -> 100%, its soft-capped form bf16 46-85% -> 75-87% (f32
//    16384 79% -> 100%); the weighted soft-capped one bf16 45-51% ->
//    52-56%. Soft-capped forms bound by their instructions lost 1-4 points
//    (class indices at 2048-8192, the weighted f32 at 2048-4096, the
//    probability-target f32 1000 100% -> 98%): the merged online updates
//    cost more than two passes over registers. Past 16384 one warp a row
//    would still gain in the model (8192 rows; the weighted loss bf16 32000
//    84% -> 100%) but needs some 4000 rows to give every SM 30 warps, and
//    long-vocabulary losses are often computed a chunk of rows at a time: a
//    chunk of linear cross-entropy over 128256 classes is about 1000 rows
//    (256 MiB of bf16 logits), where 512 threads a row fill the chip and one
//    warp a row would leave most of it idle. A loss whose second
//    pass stays (no merged form) keeps the rules above: its row stays in
//    registers rather than being staged 8 rows a block.
//    A row a warp holds: a fusion with row reductions (other than the
//    loss forwards above, which keep their own rule; a loss with its
//    gradient writes a full row and takes this one) whose row one warp
//    keeps on chip (the bounds of "fewer idle vectors" below: at most 8
//    chunks, in registers) in at most 32 elements of each full input a
//    thread (n <= 1024 in 16-byte vectors of 16- and 32-bit elements)
//    takes one warp, where the rules above gave rows of 513-1024 elements
//    (float32, or two 16-bit full inputs) two. A row of more full inputs
//    that would leave registers in one warp keeps the rules above. The
//    traffic model at n = 1000 (the tile forced first, one warp against
//    the rule's for each such fusion): rms_norm_fwd (and its variants) f32
//    95% -> 100%, layer_norm_fwd f32 93% -> 100%; the class-index losses
//    with gradient f32 78% -> 88% (soft-capped), 68% -> 100% (class
//    weights), 59% -> 83% (both); the soft-capped probability-target one
//    bf16 67% -> 91%; the backward norms bf16 62-85% -> 85-86%; no cell
//    fell. Plain ptxas (13.0) of layer_norm_fwd f32 in one warp spills 8
//    bytes at n = 1024 on sm_80 and 12 at n = 644-764 on sm_86, at the 64
//    registers it picks (none at 1000); the losses with gradient take up
//    to 255 registers (cross_entropy_weighted_capped_fwd_grad f32 n =
//    960-1024, 128 in two warps) and the backward norms f32 1000 153-167
//    (80-96): the model's gain there wants a GPU's timing.
//  - rows_per_block = max(1, 256 / threads_per_row): blocks of at least 256
//    threads, so short rows (n < 1024) pack several rows per block.
//  - chunks = ceil(n / (V * threads_per_row)): the vectors each thread owns.
//  - row_on_chip when the fusion has a row reduction, chunks <= 8, and
//    chunks * V * (full inputs) is at most half the registers a thread gets
//    (65536 / threads per block, at most 255), 3/8 with column reductions
//    (keeping 56-64 elements of 128 registers, the backward norms spilled
//    8-156 bytes in 11 of 18 shapes at n = 13312-16384, none at 48; they
//    stream and stage there), unless the row was narrowed to one warp
//    (above): the row stays in registers across the fusion's passes;
//    longer rows (a
//    128k-256k vocabulary) stream in chunks and recompute instead of
//    failing. A fusion without row reductions makes one pass, so it streams:
//    unrolling would only lengthen live ranges.
//  - staging (fuse-stage-rows, after the passes that change how many times
//    a row is read): a streamed row whose full inputs are read in more than
//    one pass keeps its first `staged_chunks` chunks per thread of those
//    inputs in dynamic shared memory, written by the first pass that loads
//    them and read back by the later ones, so HBM sees each byte once. A
//    thread reads back only the slots it wrote itself (no barrier). As many
//    chunks as the chip lets one block opt into (sm_80 163 KiB, sm_86/89
//    99 KiB, sm_90 227 KiB, less the reductions' static workgroup memory):
//    an f32 row of 32000 fits whole, a bf16 row of 128256 in 28 of its 32
//    chunks. Occupancy: such a block takes the SM's shared memory, so one
//    512-thread block runs per SM (and says so to ptxas, `.minnctapersm 1`,
//    which otherwise gave it 64 registers, for two blocks, and spilled);
//    its loops over staged chunks are unrolled
//    4 times (512 threads x 4 x 16 bytes = 32 KiB of loads in flight per
//    SM), which is what a streamed row needs to stay at the bandwidth limit;
//    where a block runs alone on its SM, the pass that stages a row of at
//    most 32 chunks a thread loads 8 vectors an iteration, as do later
//    passes over a row staged whole with one full input (kStagedLoads, 64
//    KiB; why, in RowProgramEmitter.cpp).
//  - column partials on chip (fuse-stage-rows too): a fusion with a column
//    reduction keeps the partial of every column a thread owns in dynamic
//    shared memory across the rows of its persistent loop (read-modified-
//    written per row by the one thread that owns it, no barrier) and writes
//    it to global memory once, at the end; they go first, staged inputs get
//    what is left. Where they do not all fit beside the reductions'
//    workgroup memory and a block has one row group, the first chunks of
//    each partial that fit stay on chip and the rest are
//    read-modified-written in the block's row of the global partials.
//  - a fusion with a column reduction runs a persistent grid
//    (blocks_per_sm blocks per SM, striding over rows) so that the partials
//    it leaves for the final reduction are bounded; others launch one
//    row group per row. Its blocks per SM (fewer when they do not fit):
//    2, or, with row reductions, enough that their row groups' full inputs
//    make 64 KiB per SM, up to 4. Such a block waits for a row group's
//    loads, reduces the row across its warps (barriers) and only then
//    loads the next: on an H200 a row of bf16 n = 4096 took ~2.0 us a
//    block (the traffic model charges 1.7 us plus the issue), and two
//    blocks of those rows, 32 KiB of loads per SM, reached 60-67% of 4.8
//    TB/s. 64 KiB a round trip is a 132nd of 4.8 TB/s for 1.8 us, a
//    little more than the loads need (stores share the bandwidth). Each
//    block writes a row of partials: more blocks than that would only add
//    bytes.
//  - folded blocks (foldsResidentBlocks): where every partial stays on chip
//    and nothing is staged, the runtime runs the blocks an SM would hold as
//    one block of their row groups, one block per SM, so an SM writes one
//    row of partials instead of 2-4 (layer_norm_bwd bf16 n = 4096: 1.13x
//    -> 1.04x the ideal bytes). The lowering leaves the block size open
//    (row groups = block size / threads_per_row, at most 15 where a row
//    spans warps: one named barrier, 1 + the group, per row group; barrier
//    0 is the block's, before the partials combine). Row groups of whole
//    warps loop over their own rows and end at their own last row; narrower
//    ones share warps, so they run the block's trips, clamped. The runtime
//    loads the PTX again with `.maxntid` for the tile's blocks per SM,
//    then one fewer, keeping the first that ptxas fits without spilling
//    (bf16 n = 4096: 4 blocks of 256 threads spill 52-60 bytes at 64
//    registers, 3 fit in 80), else the blocks stay apart. The traffic
//    model: the backward norms at bf16 n = 1000 55-57% -> 64-85%, at 4096
//    85-90% (88-91% apart, each block its own row of partials).
//  - a wide row in shared memory (stagesWideRow): a fusion with column
//    reductions whose row the rules above keep in registers at more than 32
//    elements a thread, in a row of several warps, streams it through
//    shared memory instead (row_on_chip false; fuse-stage-rows stages it
//    whole beside the partials) where a block's rows of full inputs are at
//    most half the 64 KiB an SM wants in flight, two blocks' staged rows and
//    partials fit in shared memory, and the row fills an even number of
//    chunks exactly. Kept in registers, such a row took 128-191 registers
//    and one row group ran per SM; staged, 70-100 and two blocks. The
//    traffic model, the four backward norms at bf16 and f32, n =
//    1000-16384 (ten lengths, 80 cells): at bf16 n = 8192 rms_norm_bwd 88%
//    -> 94%, its Llama variant 85% -> 94%, layer_norm_bwd 49% -> 92% and
//    its recentered form 48% -> 92% (1.04x -> 1.09x the ideal bytes: two
//    blocks an SM write two rows of partials, and staged blocks do not
//    fold); no other cell moved. The last two conditions are measured, not
//    derived: staged regardless (forced), rows with a masked last chunk
//    (bf16 n = 6152-8184, a review's sweep: 26-39 KiB in flight per SM, the
//    staging pass's loop not unrolled) fell 25-42 points, rows of 3 or 5
//    chunks a thread (bf16 n = 3072, 5120, 6144, 10240) up to 60, and
//    none rose but rms_norm_bwd bf16 n = 12288 (3 chunks of 512 threads:
//    66% -> 95%; its Llama variant 64% -> 65%, layer_norm_bwd 61% -> 32%);
//    f32 rows of 3072-6144 lost 1-3.
//  - wide rows on chip (keepsWideRowOnChip): where a thread keeps more than
//    32 elements of a row on chip (threads_per_row could not grow past
//    512, or the rules above took fewer threads), holding the row's
//    widened values across its passes costs the SM its second block (2.3
//    registers an element, above). Two remedies:
//    - fuse-merge-reductions merges its dependent reductions where that
//      leaves one pass over the row (elsewhere a row on chip makes its
//      passes over registers: fewer instructions than the merged online
//      updates). cross_entropy_fwd bf16 n = 32000 took 116 registers in two
//      passes (one 512-thread block per SM; 57% of HBM in the traffic
//      model) and 62 merged (two blocks; 100%). Where 32 elements or fewer
//      are kept, merging cost more instructions than it saved registers in
//      most kernels (the soft-capped, weighted and probability-target
//      cross-entropy forwards, 2-22 points lower in the model), and where a
//      second pass stays (cross_entropy_fwd_grad, layer_norm_fwd) it only
//      added instructions. A wide row's sums about the max
//      (fuse.max_deviation: the probability-target losses, and the
//      class-index losses' label smoothing) merge with the rest: the
//      weighted class-index loss at bf16 n = 32000 took 128 registers in
//      two passes (44% of HBM) and 40 merged (75%). Forced to a wide row
//      on chip (256 threads at bf16 n = 8192, where the rule gives one
//      warp a row), the soft-capped probability-target loss fell 85% ->
//      71% merged (80 -> 60 registers, 3 -> 4 blocks per SM, bound by
//      its instructions).
//    - the lowering holds the 16-bit loads packed (two elements a register)
//      between passes and computes the per-element values again in each,
//      where every value a pass before the last computes is cheap (casts,
//      arithmetic, selects, floor; no transcendental or division; the last
//      pass's own values are never held): rms_norm_fwd bf16 n = 32000 took 114
//      registers and 62 so (73% -> 100% in the model), layer_norm_fwd 128
//      and 64 (65% -> 100%). Where a pass holds an exp (the cross-entropy
//      kernels), recomputing the casts and differences around it freed no
//      register and cost 1-12 points; at 32 elements or fewer, the norms
//      lost 1-6 points where the blocks per SM did not change (bf16 n =
//      4096 and 8192).
//  - registers (the runtime, after the driver's PTX JIT): a kernel launched
//    one row group per row and staging nothing (blocksPerSMGoal) aims at
//    1024 resident threads per SM (64 registers a thread). Where the JIT
//    left fewer blocks resident, the runtime loads the PTX again with
//    `.minnctapersm` asking for that many, and where that spills, for one
//    block more than fit; it keeps the first that spilled nothing and fits
//    more blocks (CudaDriver); a module that fails to load leaves the
//    plain one. Left to its own heuristic, ptxas often takes more
//    registers than the goal's blocks leave: rms_norm_fwd bf16 n = 4096
//    took 80 (3 blocks of 256; 48 KiB of loads in flight per SM in the
//    traffic model) and fits in 64 without spilling (4 blocks, 64 KiB
//    modeled). Kernels that would spill stay as they were.
// CPU: V = 8 f32 lanes (one AVX2 register) when n % 8 == 0, else 1; one
// "thread" per row; rows_per_task = max(1, 65536 / n) rows per task of the
// runtime's thread pool; row_on_chip as on the GPU but without the
// register bound.
//
// Limits on compile work (diagnostics of fuse-specialize and
// fuse-select-tiles, so every tool, the runtime and the fuzzer get them):
//  - n <= 2^40 (kMaxRowLength);
//  - a row on chip unrolls at most 64 chunks per thread
//    (kMaxUnrolledChunks), whatever row-on-chip says;
//  - the lowering emits about ops * passes * unrolled chunks (* V on a GPU,
//    where math runs per element) operations: at most 2^17
//    (kMaxEmittedOps), some 25 times the largest built-in;
//  - a kernel holds at most 2^13 fuse ops (kMaxKernelOps; the largest
//    built-in has about 100): the lowering and fuse-differentiate recurse
//    along chains of ops, and a chain of 50000 overflowed the stack.
//
// Multi-tensor kernels (elementwise, over a table of tensors of any size;
// KernelABI.h) cut every tensor into chunks of 65536 elements, as Apex's
// multi_tensor_apply does: large enough that a block's per-chunk work (the
// table walk, the per-tensor scalars) is amortized over 128 elements per
// thread, small enough that a 100M-element tensor spreads over ~1500
// chunks and any grid balances within one chunk.
//  - GPU: blocks of 512 threads (threads_per_row; rows_per_block = 1), V as
//    for rows (16-byte vectors in the aligned class, where every pointer is
//    16-byte aligned; tails of fewer than V elements run scalar), chunks =
//    65536 / (512 * V) vectors per thread per chunk, a persistent grid of
//    at most 4 blocks per SM striding over the launch's chunks.
//  - CPU: V = 8 (then a scalar tail), each task of the thread pool runs
//    65536 consecutive elements of the table's tensors (rows_per_task).
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_COMPILER_TILECONFIG_H
#define TILEFUSE_COMPILER_TILECONFIG_H

#include "tilefuse/Compiler/KernelABI.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Support/LLVM.h"

#include <string>

namespace tilefuse {
namespace fuse {
class KernelOp;
} // namespace fuse

constexpr int64_t kMaxRowLength = int64_t(1) << 40;
constexpr int64_t kMaxUnrolledChunks = 64;
constexpr int64_t kMaxEmittedOps = int64_t(1) << 17;
constexpr int64_t kMaxKernelOps = int64_t(1) << 13;
/// How many times a loop over staged chunks is unrolled at least (above).
constexpr int64_t kStagedUnroll = 4;
/// Vectors of full inputs a loop over staged chunks loads an iteration at
/// most (above; why, in RowProgramEmitter.cpp).
constexpr int64_t kStagedLoads = 8;

struct TileConfig {
  std::string target; // "sm_80", "sm_90", ..., or "cpu"
  int64_t threadsPerRow = 1;
  int64_t rowsPerBlock = 1;
  int64_t vectorWidth = 1;
  int64_t chunks = 1;
  bool rowOnChip = true;
  /// 0: one row group per row; otherwise a persistent grid of this many
  /// blocks per SM.
  int64_t blocksPerSM = 0;
  /// CPU only: rows per task of the thread pool (multi-tensor: elements).
  int64_t rowsPerTask = 0;
  /// Multi-tensor kernels: the elements of a chunk (0 otherwise).
  int64_t chunkElements = 0;
  /// Streamed rows (fuse-stage-rows): the chunks per thread of each re-read
  /// full input kept in dynamic shared memory, and that memory's bytes per
  /// block (0: nothing staged).
  int64_t stagedChunks = 0;
  int64_t stageBytes = 0;
  /// The chunks per thread of each column partial kept in that memory
  /// across the rows (fuse-stage-rows): all of them (`chunks`), none, or,
  /// where a block has one row group, the first ones (the rest are
  /// read-modified-written in global memory per row).
  int64_t partialChunks = 0;

  bool isGPU() const { return target != "cpu"; }
  int64_t threadsPerBlock() const { return threadsPerRow * rowsPerBlock; }

  mlir::DictionaryAttr toAttr(mlir::MLIRContext *context) const;
  /// The config recorded on a kernel by fuse-select-tiles; emits an error
  /// and fails when there is none.
  static mlir::FailureOr<TileConfig> fromKernel(fuse::KernelOp kernel);
};

/// What tile selection needs to know about a specialized kernel.
struct KernelShape {
  int64_t n = 0;
  unsigned storageBytes = 4;
  bool aligned = true;
  bool hasColumnReduction = false;
  /// The bytes a column's partials take (one element per column reduction,
  /// of its input's element type).
  int64_t columnPartialBytes = 0;
  bool hasRowReduction = false;
  int64_t fullInputs = 0;
  /// The bytes of one element of every full input together (each in its
  /// own storage dtype).
  int64_t fullInputBytes = 0;
  /// Whether an output is a full row (else the rows reduce to per-row
  /// values and column reductions).
  bool writesFullRow = false;
  /// Operations in the kernel body, and the passes over a row it makes.
  int64_t ops = 0;
  int64_t passes = 1;
  /// Whether the kernel makes more than one pass over a row and one once
  /// fuse-merge-reductions merges its reductions (set by fuse-select-tiles).
  bool mergesToOnePass = false;
  /// A multi-tensor kernel (n is not fixed).
  bool multiTensor = false;
};

/// The ABI fuse-specialize recorded on a kernel (the default when it
/// recorded none); emits an error and fails for a malformed record.
mlir::FailureOr<KernelAbi> getKernelAbi(fuse::KernelOp kernel);

/// Whether `target` names a chip tilefuse emits PTX for, or the CPU.
bool isKnownTarget(llvm::StringRef target);

/// The heuristic above.
TileConfig chooseTileConfig(const KernelShape &shape, llvm::StringRef target);

/// The dynamic shared memory one block of `target` may opt into (bytes).
int64_t maxSharedBytesPerBlock(llvm::StringRef target);

/// Whether a block of `config` holding `staticSharedBytes` of workgroup
/// memory besides its dynamic shared memory (`stageBytes`) leaves no room
/// for a second one on the SM: ptxas is then told so (`.minnctapersm 1`)
/// and may give a thread every register the block size allows. Left to
/// itself, ptxas aimed at two 512-thread blocks (64 registers) and spilled.
bool runsAloneOnSM(const TileConfig &config, int64_t staticSharedBytes);

/// Whether a thread keeps more than 32 elements of a GPU row on chip (the
/// wide rows paragraph above): fuse-merge-reductions merges its reductions
/// where that leaves one pass, the lowering holds its 16-bit loads packed
/// between passes.
bool keepsWideRowOnChip(const KernelShape &shape, const TileConfig &config);

/// Whether the runtime folds the blocks of a persistent grid that would
/// share an SM into one block of as many row groups (the column partials
/// paragraph above): a fusion with column reductions whose partials all
/// stay on chip and which stages no input. The lowering then leaves the
/// block size open (row groups = block size / threads_per_row), and the
/// row groups of a row wider than a warp meet at their own named barrier.
bool foldsResidentBlocks(const TileConfig &config);

/// The most row groups a folded block holds: 1024 threads, and at most 15
/// named barriers (1-15; barrier 0 is the block's) where a row spans warps.
/// A tile with more row groups a block (an override) does not fold.
int64_t maxFoldedRowGroups(const TileConfig &config);

/// The most of the tile's blocks one folded block holds: its blocks per SM,
/// as far as maxFoldedRowGroups allows (64-thread rows: 3 blocks of 4 row
/// groups, 768 threads, where 4 would need 16 barriers).
int64_t maxFoldedBlocks(const TileConfig &config);

/// The blocks per SM the runtime asks the PTX JIT for (`.minnctapersm`)
/// where fewer are resident (the registers paragraph above): 1024 threads'
/// worth; 0 (ask for nothing) for persistent grids, whose blocks per SM
/// the tile sets, for blocks that stage rows in shared memory (which
/// bounds them), for blocks of 1024 threads, and on the CPU.
int64_t blocksPerSMGoal(const TileConfig &config);

/// The static workgroup memory lowering gives a block's row reductions to
/// combine a row's warps: a slot per warp of each row group for each state
/// value the busiest pass combines (moments take 4), f32, or f64 where a
/// row reduction is of f64 or i64 (f32 slots would round or cut it); none
/// without row reductions or where a row takes at most 32 threads (its
/// shuffles combine it). fuse-stage-rows leaves it room beside the staged
/// chunks; defined beside the lowering (LowerToGPU.cpp), which allocates it.
struct ReductionWorkgroup {
  mlir::Type slotType;
  /// The state values of the busiest pass (at least 1), and the slots.
  int64_t stateValues = 1;
  int64_t slots = 0;
  int64_t bytes() const;
};
ReductionWorkgroup reductionWorkgroup(fuse::KernelOp kernel,
                                      const TileConfig &config);

/// Bytes per element of `elementType` in memory: a mask (i1) takes one, as
/// a torch.bool does.
int64_t storageBytes(mlir::Type elementType);

/// The bytes `chunks` chunks per thread of one row group take in shared
/// memory as `elementType` (a multiple of 16, so that every region starts
/// 16-byte aligned): a staged input, or a column reduction's partials.
int64_t sharedRegionBytes(const TileConfig &config, int64_t chunks,
                          mlir::Type elementType);

/// Fails, with an error naming `pass`, for a kernel of more than
/// kMaxKernelOps operations.
mlir::LogicalResult checkKernelOpLimit(fuse::KernelOp kernel,
                                       llvm::StringRef pass);

/// The shape of a kernel that fuse-specialize has run on; emits an error and
/// fails otherwise.
mlir::FailureOr<KernelShape> getKernelShape(fuse::KernelOp kernel);

/// The pass over a row after which each value of `kernel` is available:
/// inputs at level 0, a row reduction's result one level above its input,
/// anything else at the highest level of its operands.
llvm::DenseMap<mlir::Value, int> rowLevels(fuse::KernelOp kernel);

/// The level of the pass that computes `rowReduction` (the highest of its
/// operands' levels: fuse.max_deviation reads two values).
int reducedLevel(mlir::Operation *rowReduction,
                 const llvm::DenseMap<mlir::Value, int> &levels);

/// The level of the pass that stores the full outputs and accumulates the
/// column reductions (the highest of their inputs' levels).
int finalPassLevel(fuse::KernelOp kernel,
                   const llvm::DenseMap<mlir::Value, int> &levels);

/// The levels at which the lowering makes a pass over a streamed row: each
/// level with row reductions of an input at that level, and the final level
/// (that of the full outputs and column reductions).
llvm::SmallVector<int> passLevels(fuse::KernelOp kernel);

/// Per pass (in passLevels' order), the per-chunk values the pass computes
/// or loads: what its row reductions read and, in the final pass, the full
/// outputs and what the column reductions read, with the full and
/// per-column values they come from (inputs included; per-row values come
/// from earlier passes).
llvm::SmallVector<llvm::SmallVector<mlir::Value>>
passChunkValues(fuse::KernelOp kernel);

/// Whether fuse-merge-reductions leaves `kernel` one pass over its row
/// (tried on a copy; MergeReductions.cpp).
bool mergesIntoOnePass(fuse::KernelOp kernel);

/// The full inputs (as entry-block arguments) that a streamed row program
/// reads in more than one of its passes: what staging keeps on chip.
llvm::SmallVector<mlir::BlockArgument> rereadFullInputs(fuse::KernelOp kernel);

} // namespace tilefuse

#endif // TILEFUSE_COMPILER_TILECONFIG_H
