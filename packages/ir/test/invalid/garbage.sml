// Text after the graph: IR_PARSE_ERROR where the extra text starts.

// expect: IR_PARSE_ERROR 8:1
graph @g {
  %x = input : f32[2]
  return out = %x
}
graph @h {
  return
}

// -----
// expect: IR_PARSE_ERROR 16:3
graph @g {
  return
} trailing

// -----
// expect: IR_PARSE_ERROR 22:2
graph @g {
  return
}}
