// Truncated inputs: IR_PARSE_ERROR at the end of the text.

// expect: IR_PARSE_ERROR 4:1

// -----
// expect: IR_PARSE_ERROR 7:6
graph
// -----
// expect: IR_PARSE_ERROR 10:11
graph @g {
// -----
// expect: IR_PARSE_ERROR 14:21
graph @g {
  %x = input : f32[2
// -----
// expect: IR_PARSE_ERROR 19:31
graph @g {
  %x = input : f32[2]
  %y = sml.softmax(%x) {axis =
// -----
// expect: IR_PARSE_ERROR 25:1
graph @g {
  %x = input : f32[2]
  return out = %x
