// A row reduction over four full inputs, its result written as a full row.
module {
  fuse.kernel @four_inputs(%a: !fuse.full<f32>, %b: !fuse.full<f32>, %c: !fuse.full<f32>, %d: !fuse.full<f32>) -> (o: !fuse.full<f32>) {
    %0 = fuse.mul %a, %b : !fuse.full<f32>
    %1 = fuse.mul %c, %d : !fuse.full<f32>
    %2 = fuse.add %0, %1 : !fuse.full<f32>
    %3 = fuse.reduce sum %2 : !fuse.full<f32> to !fuse.row<f32>
    %4 = fuse.broadcast %3 : !fuse.row<f32> to !fuse.full<f32>
    %5 = fuse.sub %2, %4 : !fuse.full<f32>
    fuse.yield %5 : !fuse.full<f32>
  }
}
