// Attributes: IR_BAD_ATTR for unknown, duplicate, missing and ill-typed attributes.

// expect: IR_BAD_ATTR 6:25
graph @g {
  %x = input : f32[2]
  %y = sml.softmax(%x) {dim = 0} : f32[2]
  return out = %y
}

// -----
// expect: IR_BAD_ATTR 14:35
graph @g {
  %x = input : f32[2]
  %y = sml.softmax(%x) {axis = 0, axis = 0} : f32[2]
  return out = %y
}

// -----
// expect: IR_BAD_ATTR 22:3
graph @g {
  %x = input : f32[4]
  %v, %i = sml.topk(%x) : f32[2], i64[2]
  return out = %v
}

// -----
// expect: IR_BAD_ATTR 30:3
graph @g {
  %x = input : f32[4]
  %v, %i = sml.topk(%x) {k = 1.5} : f32[2], i64[2]
  return out = %v
}

// -----
// expect: IR_BAD_ATTR 38:3
graph @g {
  %x = input : f32[4]
  %v, %i = sml.topk(%x) {k = -1} : f32[0], i64[0]
  return out = %v
}

// -----
// expect: IR_BAD_ATTR 46:3
graph @g {
  %x = input : f32[2]
  %y = sml.gelu(%x) {approximate = "fast"} : f32[2]
  return out = %y
}

// -----
// expect: IR_BAD_ATTR 54:3
graph @g {
  %x = input : f32[2]
  %y = sml.cast(%x) {dtype = f8} : f8[2]
  return out = %y
}

// -----
// expect: IR_BAD_ATTR 62:3
graph @g {
  %x = input : f32[2, 3]
  %y = sml.softmax(%x) {axis = 2} : f32[2, 3]
  return out = %y
}

// -----
// expect: IR_BAD_ATTR 70:3
graph @g {
  %x = input : f32[2, 3]
  %y = sml.transpose(%x) {perm = [0, 0]} : f32[2, 2]
  return out = %y
}

// -----
// expect: IR_INVALID_DIM 78:41
graph @g {
  %x = input : f32[8]
  %y = sml.slice(%x) {axis = 0, start = seq/2} : f32[7]
  return out = %y
}
