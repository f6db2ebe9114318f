fuse.kernel @k(%x: !fuse.full<f32>, %r: !fuse.row<f32>) -> (y: !fuse.full<f32>) {
  %y = fuse.add %x, %r : (!fuse.full<f32>, !fuse.row<f32>) -> !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}
