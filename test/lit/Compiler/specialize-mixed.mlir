// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=bf16,state=f32,state_out=f32 n=64}))' | FileCheck %s --check-prefix=MIXED
// RUN: tilefuse-opt %s --pass-pipeline='builtin.module(fuse.kernel(fuse-specialize{dtype=declared,param=bf16 n=64}))' | FileCheck %s --check-prefix=DECLARED
// Per-port storage: bf16 parameters with f32 state. A rounding to an
// input's storage becomes a cast to it and back, or nothing when that input
// is stored in the compute type.

// MIXED-LABEL: fuse.kernel @mixed
// MIXED-SAME: (%param: !fuse.full<bf16>, %state: !fuse.full<f32>)
// MIXED-SAME: -> (param_out: !fuse.full<bf16>, state_out: !fuse.full<f32>)
// MIXED-SAME: fuse.specialization = {aligned = true, dtype = bf16, n = 64 : i64, ports = {state = f32, state_out = f32}}
// MIXED: %[[P:.+]] = fuse.cast %param : !fuse.full<bf16> to !fuse.full<f32>
// MIXED: %[[SUM:.+]] = fuse.add %[[P]], %state : !fuse.full<f32>
// MIXED: %[[DOWN:.+]] = fuse.cast %[[SUM]] : !fuse.full<f32> to !fuse.full<bf16>
// MIXED: %[[UP:.+]] = fuse.cast %[[DOWN]] : !fuse.full<bf16> to !fuse.full<f32>
// MIXED-NOT: fuse.round_to_storage
// MIXED: %[[OUT:.+]] = fuse.cast %[[UP]] : !fuse.full<f32> to !fuse.full<bf16>
// MIXED: fuse.yield %[[OUT]], %[[SUM]] : !fuse.full<bf16>, !fuse.full<f32>
// The declared types with an override: the same kernel; the narrowest
// stored dtype, bf16, is the specialization's dtype.
// DECLARED-LABEL: fuse.kernel @mixed
// DECLARED-SAME: (%param: !fuse.full<bf16>, %state: !fuse.full<f32>)
// DECLARED-SAME: -> (param_out: !fuse.full<f32>, state_out: !fuse.full<f32>)
// DECLARED-SAME: fuse.specialization = {aligned = true, dtype = bf16, n = 64 : i64, ports = {param = bf16}}
// DECLARED: %[[P:.+]] = fuse.cast %param : !fuse.full<bf16> to !fuse.full<f32>
// DECLARED: %[[SUM:.+]] = fuse.add %[[P]], %state : !fuse.full<f32>
// DECLARED: %[[DOWN:.+]] = fuse.cast %[[SUM]] : !fuse.full<f32> to !fuse.full<bf16>
// DECLARED: %[[UP:.+]] = fuse.cast %[[DOWN]] : !fuse.full<bf16> to !fuse.full<f32>
// DECLARED-NOT: fuse.round_to_storage
// DECLARED: fuse.yield %[[UP]], %[[SUM]] : !fuse.full<f32>, !fuse.full<f32>
fuse.kernel @mixed(%param: !fuse.full<f32>, %state: !fuse.full<f32>) -> (param_out: !fuse.full<f32>, state_out: !fuse.full<f32>) {
  %0 = fuse.add %param, %state : !fuse.full<f32>
  %1 = fuse.round_to_storage %0 of %param : !fuse.full<f32>, !fuse.full<f32>
  %2 = fuse.round_to_storage %0 of %state : !fuse.full<f32>, !fuse.full<f32>
  fuse.yield %1, %2 : !fuse.full<f32>, !fuse.full<f32>
}
