fuse.kernel @sum_sq(%x: !fuse.full<f64>) -> (s: !fuse.row<f64>) {
  %0 = fuse.mul %x, %x : !fuse.full<f64>
  %1 = fuse.reduce sum %0 : !fuse.full<f64> to !fuse.row<f64>
  fuse.yield %1 : !fuse.row<f64>
}
