// Two kernels in one module that both call libdevice's sin (whose
// argument reduction reads a table, a module-scope global) and, streamed,
// both stage their rows in the dynamic shared memory tilefuse_stage.
module {
  fuse.kernel @sine_centered(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
    %0 = fuse.sin %x : !fuse.full<f32>
    %1 = fuse.reduce mean %0 : !fuse.full<f32> to !fuse.row<f32>
    %2 = fuse.broadcast %1 : !fuse.row<f32> to !fuse.full<f32>
    %3 = fuse.sub %0, %2 : !fuse.full<f32>
    fuse.yield %3 : !fuse.full<f32>
  }
  fuse.kernel @sine_scaled(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
    %0 = fuse.sin %x : !fuse.full<f32>
    %1 = fuse.reduce max %0 : !fuse.full<f32> to !fuse.row<f32>
    %2 = fuse.broadcast %1 : !fuse.row<f32> to !fuse.full<f32>
    %3 = fuse.div %0, %2 : !fuse.full<f32>
    fuse.yield %3 : !fuse.full<f32>
  }
}
