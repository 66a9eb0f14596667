// Values: IR_UNDEFINED_VALUE for uses before definition, IR_DUPLICATE_NAME for redefinitions.

// expect: IR_UNDEFINED_VALUE 6:20
graph @g {
  %x = input : f32[2]
  %y = sml.add(%x, %z) : f32[2]
  return out = %y
}

// -----
// expect: IR_UNDEFINED_VALUE 14:20
graph @g {
  %x = input : f32[2]
  %y = sml.add(%x, %y) : f32[2]
  return out = %y
}

// -----
// expect: IR_UNDEFINED_VALUE 22:16
graph @g {
  %x = input : f32[2]
  return out = %nothing
}

// -----
// expect: IR_DUPLICATE_NAME 29:3
graph @g {
  %x = input : f32[2]
  %x = sml.neg(%x) : f32[2]
  return out = %x
}

// -----
// expect: IR_DUPLICATE_NAME 37:3
graph @g {
  %x = input : f32[4]
  %v, %v = sml.topk(%x) {k = 2} : f32[2], i64[2]
  return out = %v
}

// -----
// expect: IR_DUPLICATE_NAME
graph @g {
  %x = input : f32[2]
  return out = %x, out = %x
}
