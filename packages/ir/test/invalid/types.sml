// Types: IR_UNKNOWN_DTYPE, IR_INVALID_DIM, and disagreements with inference (IR_TYPE_MISMATCH,
// IR_SHAPE_MISMATCH, IR_DTYPE_MISMATCH).

// expect: IR_UNKNOWN_DTYPE 6:16
graph @g {
  %x = input : f8[2]
  return out = %x
}

// -----
// expect: IR_UNKNOWN_DTYPE 13:16
graph @g {
  %x = input : float32[2]
  return out = %x
}

// -----
// expect: IR_INVALID_DIM 20:16
graph @g {
  %x = input : f32[-1]
  return out = %x
}

// -----
// expect: IR_INVALID_DIM 27:20
graph @g {
  %x = input : f32[seq/2]
  return out = %x
}

// -----
// expect: IR_INVALID_DIM 34:20
graph @g {
  %x = input : f32[2.5]
  return out = %x
}

// -----
// expect: IR_INVALID_DIM 41:20
graph @g {
  %x = input : f32[seq +]
  return out = %x
}

// -----
// expect: IR_TYPE_MISMATCH 49:3
graph @g {
  %x = input : f32[2, 3]
  %y = sml.neg(%x) : f32[3, 2]
  return out = %y
}

// -----
// expect: IR_TYPE_MISMATCH 57:3
graph @g {
  %x = input : f32[seq, 3]
  %y = sml.sum(%x) {axes = [1]} : f32[seq, 1]
  return out = %y
}

// -----
// expect: IR_TYPE_MISMATCH 65:3
graph @g {
  %x = input : f32[2]
  %y = sml.cast(%x) {dtype = i32} : f32[2]
  return out = %y
}

// -----
// expect: IR_SHAPE_MISMATCH 74:3
graph @g {
  %x = input : f32[2, 3]
  %w = param : f32[4, 5]
  %y = sml.matmul(%x, %w) : f32[2, 5]
  return out = %y
}

// -----
// expect: IR_SHAPE_MISMATCH 83:3
graph @g {
  %a = input : f32[batch]
  %b = input : f32[seq]
  %y = sml.add(%a, %b) : f32[batch]
  return out = %y
}

// -----
// expect: IR_DTYPE_MISMATCH 92:3
graph @g {
  %a = input : f32[2]
  %b = input : f16[2]
  %y = sml.add(%a, %b) : f32[2]
  return out = %y
}

// -----
// expect: IR_DTYPE_MISMATCH 100:3
graph @g {
  %a = input : i32[2]
  %y = sml.exp(%a) : i32[2]
  return out = %y
}
