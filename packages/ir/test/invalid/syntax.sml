// Syntax errors: IR_PARSE_ERROR at the offending token (file line:column).
// Each case is parsed on its own; cases are separated by `// -----` lines.

// expect: IR_PARSE_ERROR 5:1
grahp @g {
  return
}

// -----
// expect: IR_PARSE_ERROR 11:7
graph g {
  return
}

// -----
// expect: IR_PARSE_ERROR 18:3
graph @g
  %x = input : f32[2]
  return out = %x
}

// -----
// expect: IR_PARSE_ERROR 25:3
graph @g {
  x = input : f32[2]
  return out = %x
}

// -----
// expect: IR_PARSE_ERROR 32:6
graph @g {
  %x input : f32[2]
  return out = %x
}

// -----
// expect: IR_PARSE_ERROR 39:14
graph @g {
  %x = input f32[2]
  return out = %x
}

// -----
// expect: IR_PARSE_ERROR 47:3
graph @g {
  %x = input : f32[2
  return out = %x
}

// -----
// expect: IR_PARSE_ERROR 53:23
graph @g {
  %x = input : f32[2, ]
  return out = %x
}

// -----
// expect: IR_PARSE_ERROR 59:8
graph @"unterminated {
  return
}

// -----
// expect: IR_PARSE_ERROR 65:8
graph @"bad \q escape" {
  return
}

// -----
// expect: IR_PARSE_ERROR 73:19
graph @g {
  %x = input : f32[2]
  %y = sml.neg(%x : f32[2]
  return out = %y
}

// -----
// expect: IR_PARSE_ERROR 81:30
graph @g {
  %x = input : f32[2]
  %y = sml.softmax(%x) {axis 0} : f32[2]
  return out = %y
}

// -----
// expect: IR_PARSE_ERROR 89:44
graph @g {
  %x = input : f32[2]
  %y = sml.matmul(%x, %x) {transposeA = yes} : f32[2]
  return out = %y
}

// -----
// expect: IR_PARSE_ERROR 97:32
graph @g {
  %x = input : f32[2, 2]
  %y = sml.softmax(%x) {axis = last} : f32[2, 2]
  return out = %y
}

// -----
// expect: IR_PARSE_ERROR 105:3
graph @g {
  %x = input : f32[2]
  %y = sml.neg(%x) : f32[2], f32[2]
  return out = %y
}

// -----
// expect: IR_PARSE_ERROR 114:3
graph @g {
  %x = input : f32[2]
  return a = %x
  return b = %x
}

// -----
// expect: IR_PARSE_ERROR 122:3
graph @g {
  %x = input : f32[2]
  return out = %x
  %y = sml.neg(%x) : f32[2]
}

// -----
// expect: IR_PARSE_ERROR 128:3
graph @g {
  %x, %y = input : f32[2], f32[2]
  return out = %x
}

// -----
// expect: IR_PARSE_ERROR 136:14
graph @g {
  %x = input : f32[2]
  return out %x
}
