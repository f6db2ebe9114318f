// RUN: tilefuse-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{unsupported element type 'i8' for a full fuse value: expected f16, bf16, f32, f64, i1, i32 or i64}}
fuse.kernel @bad_element(%x: !fuse.full<i8>) -> (y: !fuse.full<i8>) {
  fuse.yield %x : !fuse.full<i8>
}

// -----

// expected-error @+1 {{unknown fuse type 'matrix': expected full, row, col or scalar}}
fuse.kernel @bad_kind(%x: !fuse.matrix<f32>) -> (y: !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}

// -----

fuse.kernel @kind_mismatch(%x: !fuse.full<f32>, %r: !fuse.row<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.add' op kind mismatch: operand #1 (per-row f32) is per-row but the result is full; widen the narrower one with fuse.broadcast}}
  %y = fuse.add %x, %r : (!fuse.full<f32>, !fuse.row<f32>) -> !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @dtype_mismatch(%x: !fuse.full<f32>, %b: !fuse.full<bf16>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.mul' op element type mismatch: operand #1 (full bf16) has 'bf16' but the result has 'f32'; convert with fuse.cast}}
  %y = fuse.mul %x, %b : (!fuse.full<f32>, !fuse.full<bf16>) -> !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @float_only(%i: !fuse.full<i32>) -> (y: !fuse.full<i32>) {
  // expected-error @+1 {{'fuse.exp' op requires a floating-point element type, got 'i32'}}
  %y = fuse.exp %i : !fuse.full<i32>
  fuse.yield %y : !fuse.full<i32>
}

// -----

fuse.kernel @mask_arithmetic(%m: !fuse.full<i1>) -> (y: !fuse.full<i1>) {
  // expected-error @+1 {{'fuse.add' op does not take i1 masks; use fuse.select, or fuse.cast the mask to a number first}}
  %y = fuse.add %m, %m : !fuse.full<i1>
  fuse.yield %y : !fuse.full<i1>
}

// -----

fuse.kernel @cmp_result(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.cmp' op result must be an i1 mask of the operands' kind ('!fuse.full<i1>'), got '!fuse.full<f32>'}}
  %m = fuse.cmp lt, %x, %x : (!fuse.full<f32>, !fuse.full<f32>) -> !fuse.full<f32>
  fuse.yield %m : !fuse.full<f32>
}

// -----

fuse.kernel @cmp_operands(%x: !fuse.full<f32>, %r: !fuse.row<f32>) -> (y: !fuse.full<i1>) {
  // expected-error @+1 {{'fuse.cmp' op kind mismatch: operand #1 (per-row f32) is per-row but operand #0 is full}}
  %m = fuse.cmp lt, %x, %r : (!fuse.full<f32>, !fuse.row<f32>) -> !fuse.full<i1>
  fuse.yield %m : !fuse.full<i1>
}

// -----

fuse.kernel @bad_predicate(%x: !fuse.full<f32>) -> (y: !fuse.full<i1>) {
  // expected-error @+1 {{unknown comparison 'less': expected eq, ne, lt, le, gt or ge}}
  %m = fuse.cmp less, %x, %x : !fuse.full<f32>
  fuse.yield %m : !fuse.full<i1>
}

// -----

fuse.kernel @select_condition(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.select' op condition must be an i1 mask, got element type 'f32'}}
  %y = fuse.select %x, %x, %x : (!fuse.full<f32>, !fuse.full<f32>, !fuse.full<f32>) -> !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @select_condition_kind(%m: !fuse.row<i1>, %x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.select' op kind mismatch: the condition is per-row but the result is full}}
  %y = fuse.select %m, %x, %x : (!fuse.row<i1>, !fuse.full<f32>, !fuse.full<f32>) -> !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @cast_kind(%x: !fuse.full<f32>) -> (y: !fuse.row<bf16>) {
  // expected-error @+1 {{'fuse.cast' op cannot change the kind (full to per-row); use fuse.broadcast or fuse.reduce}}
  %y = fuse.cast %x : !fuse.full<f32> to !fuse.row<bf16>
  fuse.yield %y : !fuse.row<bf16>
}

// -----

fuse.kernel @cast_to_mask(%x: !fuse.full<f32>) -> (y: !fuse.full<i1>) {
  // expected-error @+1 {{'fuse.cast' op cannot cast to i1; compare with fuse.cmp instead}}
  %y = fuse.cast %x : !fuse.full<f32> to !fuse.full<i1>
  fuse.yield %y : !fuse.full<i1>
}

// -----

fuse.kernel @broadcast_narrows(%x: !fuse.full<f32>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.broadcast' op cannot broadcast a full value to per-row: a broadcast widens scalar to any kind, or per-row and per-column to full}}
  %y = fuse.broadcast %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}

// -----

fuse.kernel @broadcast_row_to_col(%r: !fuse.row<f32>) -> (y: !fuse.col<f32>) {
  // expected-error @+1 {{'fuse.broadcast' op cannot broadcast a per-row value to per-column}}
  %y = fuse.broadcast %r : !fuse.row<f32> to !fuse.col<f32>
  fuse.yield %y : !fuse.col<f32>
}

// -----

fuse.kernel @broadcast_dtype(%r: !fuse.row<f32>) -> (y: !fuse.full<f16>) {
  // expected-error @+1 {{'fuse.broadcast' op cannot change the element type ('f32' to 'f16'); use fuse.cast}}
  %y = fuse.broadcast %r : !fuse.row<f32> to !fuse.full<f16>
  fuse.yield %y : !fuse.full<f16>
}

// -----

fuse.kernel @reduce_row(%r: !fuse.row<f32>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.reduce' op cannot reduce a per-row value: reductions take a full [rows, n] value}}
  %y = fuse.reduce sum %r : !fuse.row<f32> to !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}

// -----

fuse.kernel @reduce_to_scalar(%x: !fuse.full<f32>) -> (y: !fuse.scalar<f32>) {
  // expected-error @+1 {{'fuse.reduce' op result must be per-row (a row reduction) or per-column (a column reduction), got scalar}}
  %y = fuse.reduce sum %x : !fuse.full<f32> to !fuse.scalar<f32>
  fuse.yield %y : !fuse.scalar<f32>
}

// -----

fuse.kernel @reduce_dtype(%x: !fuse.full<bf16>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.reduce' op result element type 'f32' differs from the input's 'bf16'; cast before reducing}}
  %y = fuse.reduce sum %x : !fuse.full<bf16> to !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}

// -----

fuse.kernel @reduce_mask(%m: !fuse.full<i1>) -> (y: !fuse.row<i1>) {
  // expected-error @+1 {{'fuse.reduce' op cannot reduce an i1 mask; fuse.cast it to a number first}}
  %y = fuse.reduce max %m : !fuse.full<i1> to !fuse.row<i1>
  fuse.yield %y : !fuse.row<i1>
}

// -----

fuse.kernel @mean_of_integers(%i: !fuse.full<i64>) -> (y: !fuse.row<i64>) {
  // expected-error @+1 {{'fuse.reduce' op mean requires a floating-point element type, got 'i64'}}
  %y = fuse.reduce mean %i : !fuse.full<i64> to !fuse.row<i64>
  fuse.yield %y : !fuse.row<i64>
}

// -----

fuse.kernel @gather_float_index(%x: !fuse.full<f32>, %t: !fuse.row<f32>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.gather' op index must have element type i32 or i64, got 'f32'}}
  %y = fuse.gather %x[%t] : !fuse.full<f32>, !fuse.row<f32> -> !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}

// -----

fuse.kernel @gather_full_index(%x: !fuse.full<f32>, %t: !fuse.full<i64>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.gather' op index must be per-row (one column per row), got full}}
  %y = fuse.gather %x[%t] : !fuse.full<f32>, !fuse.full<i64> -> !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}

// -----

fuse.kernel @gather_from_row(%r: !fuse.row<f32>, %t: !fuse.row<i64>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.gather' op source must be full [rows, n], got per-row}}
  %y = fuse.gather %r[%t] : !fuse.row<f32>, !fuse.row<i64> -> !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}

// -----

fuse.kernel @gather_result(%x: !fuse.full<f32>, %t: !fuse.row<i32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.gather' op result must be '!fuse.row<f32>', got '!fuse.full<f32>'}}
  %y = fuse.gather %x[%t] : !fuse.full<f32>, !fuse.row<i32> -> !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @iota_type(%x: !fuse.full<f32>) -> (y: !fuse.full<i32>) {
  // expected-error @+1 {{'fuse.iota' op yields the column index: its type must be !fuse.col<i32> or !fuse.col<i64>, got '!fuse.full<i32>'}}
  %y = fuse.iota : !fuse.full<i32>
  fuse.yield %y : !fuse.full<i32>
}

// -----

fuse.kernel @row_length_type(%x: !fuse.full<f32>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.row_length' op yields n as a number: its type must be a scalar float or integer, got '!fuse.row<f32>'}}
  %y = fuse.row_length : !fuse.row<f32>
  fuse.yield %y : !fuse.row<f32>
}

// -----

fuse.kernel @constant_type(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.constant' op value of type 'f64' does not match the element type 'f32'}}
  %c = "fuse.constant"() {value = 1.0 : f64} : () -> !fuse.full<f32>
  fuse.yield %c : !fuse.full<f32>
}

// -----

fuse.kernel @too_few_outputs(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>, rstd: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.yield' op yields 1 values but kernel @too_few_outputs declares 2 outputs}}
  fuse.yield %x : !fuse.full<f32>
}

// -----

fuse.kernel @output_type(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>, rstd: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.yield' op output #1 'rstd' is declared '!fuse.row<f32>' but the yielded value is '!fuse.full<f32>'}}
  fuse.yield %x, %x : !fuse.full<f32>, !fuse.full<f32>
}

// -----

// expected-error @+1 {{'fuse.kernel' op declares 'x' twice; input and output names must be unique}}
fuse.kernel @duplicate_name(%x: !fuse.full<f32>) -> (x: !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}

// -----

// expected-error @+1 {{'fuse.kernel' op must declare at least one output}}
"fuse.kernel"() ({
^bb0(%x: !fuse.full<f32>):
  fuse.yield
}) {sym_name = "no_outputs", function_type = (!fuse.full<f32>) -> (), input_names = ["x"], output_names = []} : () -> ()

// -----

// expected-error @+1 {{'fuse.kernel' op input 'x' has type 'f32', not a fuse value type}}
fuse.kernel @builtin_input(%x: f32) -> (y: !fuse.full<f32>) {
  %y = fuse.constant full 0.0 : f32
  fuse.yield %y : !fuse.full<f32>
}

// -----

// expected-error @+1 {{'fuse.kernel' op name 'two words' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)}}
fuse.kernel @bad_output_name(%x: !fuse.full<f32>) -> ("two words": !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}

// -----

// A kernel name becomes a PTX entry point: "<lambda>" made the NVPTX backend
// abort (LLVM ERROR: Symbol name with unsupported characters).
// expected-error @+1 {{'fuse.kernel' op kernel name '<lambda>' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)}}
fuse.kernel @"<lambda>"(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  fuse.yield %x : !fuse.full<f32>
}

// -----

// expected-error @+1 {{'fuse.kernel' op has 2 input names for 1 inputs}}
"fuse.kernel"() ({
^bb0(%x: !fuse.full<f32>):
  fuse.yield %x : !fuse.full<f32>
}) {sym_name = "names", function_type = (!fuse.full<f32>) -> (!fuse.full<f32>), input_names = ["x", "w"], output_names = ["y"]} : () -> ()

// -----

fuse.kernel @round_of_a_scalar(%x: !fuse.full<f32>, %s: !fuse.scalar<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.round_to_storage' op 'of' must name a full or per-column float input of the kernel (a stored tensor)}}
  %y = fuse.round_to_storage %x of %s : !fuse.full<f32>, !fuse.scalar<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @arg_reduce_kind(%x: !fuse.full<f32>) -> (y: !fuse.row<i64>) {
  // expected-error @+1 {{'fuse.arg_reduce' op kind must be max or min, got sum}}
  %y = fuse.arg_reduce sum %x : !fuse.full<f32> to !fuse.row<i64>
  fuse.yield %y : !fuse.row<i64>
}

// -----

fuse.kernel @round_of_a_computed_value(%x: !fuse.full<f32>) -> (y: !fuse.full<f32>) {
  %0 = fuse.exp %x : !fuse.full<f32>
  // expected-error @+1 {{'fuse.round_to_storage' op 'of' must name a full or per-column float input of the kernel (a stored tensor)}}
  %y = fuse.round_to_storage %x of %0 : !fuse.full<f32>, !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @arg_reduce_input(%x: !fuse.full<i1>) -> (y: !fuse.row<i64>) {
  // expected-error @+1 {{'fuse.arg_reduce' op input must be a full float or integer (not i1) value, got '!fuse.full<i1>'}}
  %y = fuse.arg_reduce max %x : !fuse.full<i1> to !fuse.row<i64>
  fuse.yield %y : !fuse.row<i64>
}

// -----

fuse.kernel @round_an_index(%x: !fuse.full<f32>, %i: !fuse.full<i64>) -> (y: !fuse.full<i64>) {
  // expected-error @+1 {{'fuse.round_to_storage' op rounds a float value, got 'i64'}}
  %y = fuse.round_to_storage %i of %x : !fuse.full<i64>, !fuse.full<f32>
  fuse.yield %y : !fuse.full<i64>
}

// -----

fuse.kernel @arg_reduce_result(%x: !fuse.full<f32>) -> (y: !fuse.col<i64>) {
  // expected-error @+1 {{'fuse.arg_reduce' op result must be !fuse.row<i32> or !fuse.row<i64> (one column per row), got '!fuse.col<i64>'}}
  %y = fuse.arg_reduce max %x : !fuse.full<f32> to !fuse.col<i64>
  fuse.yield %y : !fuse.col<i64>
}

// -----

fuse.kernel @fma_kinds(%x: !fuse.full<f32>, %r: !fuse.row<f32>) -> (y: !fuse.full<f32>) {
  // expected-error @+1 {{'fuse.fma' op kind mismatch}}
  %y = fuse.fma %x, %r, %x : (!fuse.full<f32>, !fuse.row<f32>, !fuse.full<f32>) -> !fuse.full<f32>
  fuse.yield %y : !fuse.full<f32>
}

// -----

fuse.kernel @rounding_of_integers(%i: !fuse.full<i32>) -> (y: !fuse.full<i32>) {
  // expected-error @+1 {{'fuse.floor' op requires a floating-point element type, got 'i32'}}
  %y = fuse.floor %i : !fuse.full<i32>
  fuse.yield %y : !fuse.full<i32>
}

// -----

fuse.kernel @moments_kind(%x: !fuse.full<f32>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.moments' op kind must be sum or mean, got max}}
  %m, %v = fuse.moments max %x : !fuse.full<f32> to !fuse.row<f32>
  fuse.yield %v : !fuse.row<f32>
}

// -----

fuse.kernel @max_deviation_input(%x: !fuse.row<f32>, %w: !fuse.row<f32>) -> (y: !fuse.row<f32>) {
  // expected-error @+1 {{'fuse.max_deviation' op input must be a full float value, got '!fuse.row<f32>'}}
  %m, %d, %s = fuse.max_deviation %x, %w : !fuse.row<f32> to !fuse.row<f32>
  fuse.yield %d : !fuse.row<f32>
}

// -----

fuse.kernel @max_deviation_result(%x: !fuse.full<f32>, %w: !fuse.full<f32>) -> (y: !fuse.row<f16>) {
  // expected-error @+1 {{'fuse.max_deviation' op results must be '!fuse.row<f32>', got '!fuse.row<f16>'}}
  %m, %d, %s = fuse.max_deviation %x, %w : !fuse.full<f32> to !fuse.row<f16>
  fuse.yield %d : !fuse.row<f16>
}

// -----

fuse.kernel @max_sum_exp_input(%x: !fuse.full<i32>) -> (y: !fuse.row<i32>) {
  // expected-error @+1 {{'fuse.max_sum_exp' op input must be a full float value, got '!fuse.full<i32>'}}
  %m, %s = fuse.max_sum_exp %x : !fuse.full<i32> to !fuse.row<i32>
  fuse.yield %s : !fuse.row<i32>
}

// -----

fuse.kernel @max_sum_exp_result(%x: !fuse.full<f32>) -> (y: !fuse.row<f64>) {
  // expected-error @+1 {{'fuse.max_sum_exp' op results must be '!fuse.row<f32>', got '!fuse.row<f64>'}}
  %m, %s = fuse.max_sum_exp %x : !fuse.full<f32> to !fuse.row<f64>
  fuse.yield %s : !fuse.row<f64>
}
