// A momentum step, the shape of an optimizer update: two tensors updated
// in place, a learning rate, a per-tensor step count.
fuse.kernel @momentum(%param: !fuse.full<f32>, %grad: !fuse.full<f32>, %buf: !fuse.full<f32>, %lr: !fuse.scalar<f32>, %momentum: !fuse.scalar<f32>, %step: !fuse.scalar<f32>) -> (param_out: !fuse.full<f32>, buf_out: !fuse.full<f32>) {
  %mb = fuse.broadcast %momentum : !fuse.scalar<f32> to !fuse.full<f32>
  %0 = fuse.mul %buf, %mb : !fuse.full<f32>
  %1 = fuse.add %0, %grad : !fuse.full<f32>
  %2 = fuse.div %lr, %step : !fuse.scalar<f32>
  %3 = fuse.broadcast %2 : !fuse.scalar<f32> to !fuse.full<f32>
  %4 = fuse.mul %1, %3 : !fuse.full<f32>
  %5 = fuse.sub %param, %4 : !fuse.full<f32>
  fuse.yield %5, %1 : !fuse.full<f32>, !fuse.full<f32>
}
