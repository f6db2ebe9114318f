//===- Passes.td - tilefuse compiler passes ----------------*- tablegen -*-===//

#ifndef TILEFUSE_COMPILER_PASSES_TD
#define TILEFUSE_COMPILER_PASSES_TD

include "mlir/Pass/PassBase.td"

def FuseSpecialize : Pass<"fuse-specialize", "::tilefuse::fuse::KernelOp"> {
  let summary = "Bind storage dtypes, the row length n and the alignment class";
  let description = [{
    Full and per-column float tensors (x, weight, y, dweight) are stored in
    `dtype`; arithmetic stays in the type the fusion declares (f32), so a cast
    is inserted after each such input and before each such output. Per-row
    statistics (mean, rstd, lse, loss) stay in the declared type, as PyTorch
    keeps them. `fuse.row_length` becomes the constant `n`. `rows` and every
    scalar stay runtime arguments: a new batch size or learning rate never
    recompiles. The choices are recorded in `fuse.specialization`.

    A kernel may store ports in different dtypes (bf16 parameters with f32
    optimizer state, a bf16 input with an f32 weight): `dtype` then lists
    overrides after the default, `bf16,exp_avg=f32,exp_avg_out=f32`, by
    input or output name. `fuse.round_to_storage` becomes the two casts to
    the storage dtype of the input it names and back. The default
    `declared` keeps every port's declared type (mixed dtypes; the
    narrowest full or per-column float sets the vector width).

    `abi` (KernelABI.h, KernelAbi::str) changes how the kernel is called:
    scalars read through pointers to one-element tensors
    (`pointer:NAME:DTYPE`), and multi-tensor kernels (`multi-tensor`, with
    `n=0`: elementwise fusions of full tensors and scalars, run over tables
    of tensors of any size) with per-tensor scalars
    (`per-tensor:NAME:DTYPE`), outputs written over an input
    (`inplace:OUTPUT:INPUT`) and a skip flag (`skip-if:DTYPE`).
  }];
  let options = [
    Option<"dtype", "dtype", "std::string", /*default=*/"\"f32\"",
           "Storage dtype of full and per-column float tensors: f32, f16, bf16, f64 "
           "or declared, then optional per-port overrides: bf16,exp_avg=f32">,
    Option<"n", "n", "int64_t", /*default=*/"0", "The row length n (> 0)">,
    Option<"aligned", "aligned", "bool", /*default=*/"true",
           "Pointers are 16-byte aligned and n is a multiple of the vector width">,
    Option<"abi", "abi", "std::string", /*default=*/"\"\"",
           "How the kernel is called (KernelAbi::str); empty for the default">,
  ];
  let dependentDialects = ["::tilefuse::fuse::FuseDialect"];
}

def FuseDifferentiate : Pass<"fuse-differentiate", "::mlir::ModuleOp"> {
  let summary = "Derive each kernel's backward kernel (reverse-mode autodiff)";
  let description = [{
    Replaces each `fuse.kernel @f` with its derived forward (the per-row
    statistics the backward reads appended to its outputs) followed by
    `@f_bwd` (a trailing `_fwd` becomes `_bwd`), which takes the gradients
    `d<output>` of `outputs`, the forward inputs it reads and the saved
    statistics, and returns `d<input>` for each of `inputs`. What is saved
    and what is recomputed, and each adjoint rule, are documented in
    `tilefuse/Compiler/Differentiate.h`.
  }];
  let options = [
    Option<"kernelName", "kernel", "std::string", /*default=*/"\"\"",
           "Only this kernel (default: every kernel)">,
    ListOption<"outputs", "outputs", "std::string",
               "Outputs given a gradient (default: every float output)">,
    ListOption<"inputs", "inputs", "std::string",
               "Inputs to differentiate (default: every full, per-row and "
               "per-column float input)">,
  ];
  let dependentDialects = ["::tilefuse::fuse::FuseDialect"];
}

def FuseSelectTiles : Pass<"fuse-select-tiles", "::tilefuse::fuse::KernelOp"> {
  let summary = "Choose the TileConfig of a specialized kernel for a target";
  let description = [{
    Records the tile configuration in `fuse.tile` (see TileConfig.h for the
    heuristic). Any field can be overridden; an override the target cannot
    run is an error, never a silent change.
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"sm_90\"",
           "sm_80, sm_86, sm_89, sm_90 or cpu">,
    Option<"threadsPerRow", "threads-per-row", "int64_t", /*default=*/"0",
           "Threads that share one row (power of two, 0 = heuristic)">,
    Option<"rowsPerBlock", "rows-per-block", "int64_t", /*default=*/"0",
           "Rows one thread block handles at a time (0 = heuristic)">,
    Option<"vectorWidth", "vector-width", "int64_t", /*default=*/"0",
           "Elements per vector access (0 = heuristic)">,
    Option<"rowOnChip", "row-on-chip", "std::string", /*default=*/"\"auto\"",
           "Keep each row in registers (true), stream it in chunks (false), or let the heuristic decide (auto)">,
  ];
}

def FuseMergeReductions : Pass<"fuse-merge-reductions", "::tilefuse::fuse::KernelOp"> {
  let summary = "Merge dependent row reductions into one pass over a streamed row";
  let description = [{
    A row that does not stay on chip is read once per reduction level.
    Three dependent forms have a one-pass form, which this pass substitutes:

    ```mlir
    %m = fuse.reduce max %x : !fuse.full<f32> to !fuse.row<f32>
    %d = fuse.sub %x, (fuse.broadcast %m) ...
    %s = fuse.reduce sum (fuse.exp %d) : !fuse.full<f32> to !fuse.row<f32>
    // becomes (online softmax: the running sum is rescaled as the max grows)
    %m, %s = fuse.max_sum_exp %x : !fuse.full<f32> to !fuse.row<f32>

    %mu = fuse.reduce mean %x : ...
    %d = fuse.sub %x, (fuse.broadcast %mu) ...
    %v = fuse.reduce mean|sum (fuse.mul %d, %d) : ...
    // becomes (moments merged a chunk at a time by Chan's formula)
    %mu, %v = fuse.moments mean|sum %x : !fuse.full<f32> to !fuse.row<f32>

    %m = fuse.reduce max %x : ...
    %d = fuse.sub %x, (fuse.broadcast %m) ...
    %s = fuse.reduce sum (fuse.mul %w, %d) : ...   // %w of %x's pass or earlier
    // becomes (each thread sums w * (x - m) about its running max m and
    // moves the sum when m grows: minus the growth times its sum of w)
    %m2, %s, %sw = fuse.max_deviation %x, %w : !fuse.full<f32> to !fuse.row<f32>
    ```
    The last is a loss against probability targets (sum(w * (x - max)));
    a sum of `%d` itself takes a `%w` of 1 (label smoothing's sum of
    log-probabilities, which sum(x) - n * max loses to overflow in rows of
    huge logits);
    the max it no longer waits for then merges with its sum of exp, and
    stays for its other uses. Its terms stay relative to a maximum, as in
    two passes: sum(w * x) - max * sum(w) loses the digits of logits near
    1e4, and centering on the row's first element those of a row whose
    first logit is masked (-1e9 or the dtype's lowest). Its updates keep
    sum(w), which a row sum of `%w` in the same pass then takes (a loss's
    sum of class weights, or of weighted targets). A sum of exp and a sum
    about the max of the same input share one running max in the
    lowering.
    Values the two reductions' inputs feed elsewhere (softmax's `exp(x -
    max)` in its output) stay and are computed in a later pass. Kernels
    tiled with the row on chip are left alone (there a second pass reads
    registers, and two passes take fewer instructions than the merged
    updates) unless a thread keeps more than 32 elements of the row and
    merging leaves one pass over it: the merged updates then free the
    registers that held the row for the second pass (TileConfig.h).
    Untiled kernels are rewritten (for tests).
  }];
  let dependentDialects = ["::tilefuse::fuse::FuseDialect"];
}

def FuseReciprocalDivisions : Pass<"fuse-reciprocal-divisions", "::tilefuse::fuse::KernelOp"> {
  let summary = "Divide a full value by a per-row value through its reciprocal";
  let description = [{
    An IEEE division is an SFU seed and about eight refining instructions
    per element on a GPU (a libm-exact vector division on the CPU); a
    division by a per-row value (softmax's `e / sum(e)`) repeats it n times
    for one divisor. This pass computes the reciprocal once per row and
    multiplies:
    ```mlir
    %sf = fuse.broadcast %s : !fuse.row<f32> to !fuse.full<f32>
    %y = fuse.div %e, %sf : !fuse.full<f32>
    // becomes
    %one = fuse.constant 1.0 : !fuse.row<f32>
    %r = fuse.div %one, %s : !fuse.row<f32>
    %rf = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f32>
    %y = fuse.mul %e, %rf : !fuse.full<f32>
    ```
    The product rounds twice: at most 1.5 ulp from the quotient (half an
    ulp for the division), far inside every numerics tolerance. Divisions
    by scalars stay divisions, so that the optimizers round as
    `torch.optim` does (the f32 AdamW step matches `torch.optim.AdamW` bit
    for bit); the built-in soft-capping multiplies by a reciprocal the host
    passes (`softcap_reciprocal`).
  }];
  let dependentDialects = ["::tilefuse::fuse::FuseDialect"];
}

def FuseStageRows : Pass<"fuse-stage-rows", "::tilefuse::fuse::KernelOp"> {
  let summary = "Keep a streamed row's re-read inputs in shared memory between passes";
  let description = [{
    A row that does not stay in registers is read from global memory once
    per pass over it (after fuse-merge-reductions: the norms' backward, a
    softmax, RMSNorm's reduction and output). For the full inputs that more
    than one pass reads, this pass records in `fuse.tile` how many chunks
    per thread a block keeps in dynamic shared memory (`staged_chunks`) and
    that memory's size (`stage_bytes`): as many as the target lets a block
    opt into, less the reductions' static workgroup memory. The lowering
    writes those chunks to shared memory in the first pass that loads them
    and reads them back in the later ones; the rest of the row is read from
    global memory again. GPU targets only; rows kept in registers, rows read
    in one pass and multi-tensor kernels are left alone (the fields are
    dropped). Runs after fuse-select-tiles and fuse-merge-reductions.
  }];
}

def FuseLowerToGPU : Pass<"fuse-lower-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Lower tiled fuse kernels to gpu.func kernels (see KernelABI.h)";
  let description = [{
    Each `fuse.kernel` with a GPU `fuse.tile` becomes a `gpu.func` in the
    `gpu.module @tilefuse_kernels`, written with scf loops, vector values,
    128-bit `llvm.load`/`llvm.store` on global pointers, `gpu.shuffle xor`
    and workgroup memory for row reductions, and per-row-group partials plus
    a `<name>_finalize` kernel for column reductions.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect", "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect", "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect", "::mlir::NVVM::NVVMDialect",
  ];
}

def FuseLowerToCPU : Pass<"fuse-lower-to-cpu", "::mlir::ModuleOp"> {
  let summary = "Lower tiled fuse kernels to host functions (see KernelABI.h)";
  let description = [{
    Each `fuse.kernel` with the `cpu` `fuse.tile` becomes a `func.func` that
    runs a range of rows (the runtime splits rows across threads), plus a
    `<name>_finalize` function for column reductions.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::func::FuncDialect",
    "::mlir::LLVM::LLVMDialect", "::mlir::math::MathDialect",
    "::mlir::scf::SCFDialect", "::mlir::vector::VectorDialect",
  ];
}

def FuseApproximateMath : Pass<"fuse-approximate-math"> {
  let summary = "Replace f32 exp, tanh and erf with polynomial approximations";
  let description = [{
    On the CPU the row program keeps math on vectors; there `math.exp` and
    friends would become one libm call per element, while MLIR's polynomial
    approximations are vector arithmetic (swiglu ~3x, softmax ~4x, GeGLU
    ~20x faster than with libm). exp flushes results below FLT_MIN to 0;
    `log` stays with libm (its polynomial clamps subnormal inputs). Only f32
    operands are rewritten; f64 math still calls libm. The GPU pipeline
    keeps libdevice and PTX's own approximations. f32 log1p and expm1 use
    Kahan's corrections around the polynomial exp and libm's log; f64 log1p
    and expm1 call libm (convert-math-to-llvm would compute them as
    log(1 + x) and exp(x) - 1).
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::func::FuncDialect",
    "::mlir::math::MathDialect", "::mlir::vector::VectorDialect",
  ];
}

#endif // TILEFUSE_COMPILER_PASSES_TD
