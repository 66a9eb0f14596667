// Op names and arity: IR_UNKNOWN_OP, IR_OPERAND_COUNT, and result counts (IR_MALFORMED_GRAPH).

// expect: IR_UNKNOWN_OP 6:8
graph @g {
  %x = input : f32[2]
  %y = sml.frobnicate(%x) : f32[2]
  return out = %y
}

// -----
// expect: IR_UNKNOWN_OP 14:8
graph @g {
  %x = input : f32[2]
  %y = neg(%x) : f32[2]
  return out = %y
}

// -----
// expect: IR_UNKNOWN_OP 22:8
graph @g {
  %x = input : f32[2]
  %y = sml.rmsNorm(%x) : f32[2]
  return out = %y
}

// -----
// expect: IR_OPERAND_COUNT 30:8
graph @g {
  %x = input : f32[2]
  %y = sml.add(%x) : f32[2]
  return out = %y
}

// -----
// expect: IR_OPERAND_COUNT 38:8
graph @g {
  %x = input : f32[2]
  %y = sml.neg(%x, %x) : f32[2]
  return out = %y
}

// -----
// expect: IR_OPERAND_COUNT 45:8
graph @g {
  %y = sml.concat() {axis = 0} : f32[2]
  return out = %y
}

// -----
// expect: IR_OPERAND_COUNT 53:8
graph @g {
  %x = input : f32[2]
  %y = sml.constant(%x) {value = [1]} : f32[]
  return out = %y
}

// -----
// expect: IR_MALFORMED_GRAPH 61:3
graph @g {
  %x = input : f32[4]
  %v = sml.topk(%x) {k = 2} : f32[2]
  return out = %v
}
