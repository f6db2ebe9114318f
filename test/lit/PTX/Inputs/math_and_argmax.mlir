// The primitives added for the DSL surface (log1p, expm1, sin, cos, floor,
// round) and a row argmax, in one fusion.
module {
  fuse.kernel @math_and_argmax(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>, index: !fuse.row<i64>) {
    %0 = fuse.log1p %x : !fuse.full<f32>
    %1 = fuse.expm1 %x : !fuse.full<f32>
    %2 = fuse.sin %x : !fuse.full<f32>
    %3 = fuse.cos %x : !fuse.full<f32>
    %4 = fuse.floor %x : !fuse.full<f32>
    %5 = fuse.round %x : !fuse.full<f32>
    %6 = fuse.add %0, %1 : !fuse.full<f32>
    %7 = fuse.mul %2, %3 : !fuse.full<f32>
    %8 = fuse.sub %4, %5 : !fuse.full<f32>
    %9 = fuse.add %6, %7 : !fuse.full<f32>
    %10 = fuse.add %9, %8 : !fuse.full<f32>
    %11 = fuse.arg_reduce max %x : !fuse.full<f32> to !fuse.row<i64>
    fuse.yield %10, %11 : !fuse.full<f32>, !fuse.row<i64>
  }
}
