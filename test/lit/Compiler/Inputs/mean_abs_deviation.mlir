fuse.kernel @mean_abs_deviation(%x: !fuse.full<f32>) -> (deviation: !fuse.row<f32>) {
  %0 = fuse.reduce mean %x : !fuse.full<f32> to !fuse.row<f32>
  %1 = fuse.broadcast %0 : !fuse.row<f32> to !fuse.full<f32>
  %2 = fuse.sub %x, %1 : !fuse.full<f32>
  %3 = fuse.abs %2 : !fuse.full<f32>
  %4 = fuse.reduce mean %3 : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %4 : !fuse.row<f32>
}
