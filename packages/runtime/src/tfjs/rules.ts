import * as tf from '@tensorflow/tfjs-core';

import { binary, cast, compare, gelu, nanPropagating, silu, unary, where } from './rules-elementwise.js';
import { argmax, attention, groupedMatmul, layerNorm, linear, matmul, max, mean, quantizedLinear, rmsNorm, rotary, softmax, sum } from './rules-nn.js';
import {
  broadcastTo,
  concat,
  constant,
  gather,
  indexSelect,
  iota,
  randomUniform,
  reshape,
  scatterAdd,
  slice,
  topk,
  transpose,
} from './rules-shape.js';
import { type TfRuleTable, decomposed } from './rule.js';

// NOTE: the key list repeats `OPS` and the ONNX/MLIR tables on purpose (the duplicates report lists it):
// each backend's exhaustive per-op rule table is its own, and `satisfies` checks it against the registry.
/**
 * How the tfjs executor runs every op of the IR registry: a complete mapped type over `OpKey`
 * checked with `satisfies`, so adding an op to `OPS` fails this build until it has a lowering or an
 * `unsupported(reason)` entry. Every op currently lowers; composites (norms, rotary, attention,
 * gelu, silu, any-axis softmax/topk, scatterAdd, iota, groupedMatmul) are built from tfjs kernels, and the
 * executor rounds f16/bf16 and wraps i8/u8 results after each non-exact op. See each lowering's
 * doc for its caveats (NaN handling, int32 ranges, random streams).
 */
export const TFJS_RULES = {
  constant,
  iota,
  randomUniform,
  add: binary<'add'>(tf.add),
  sub: binary<'sub'>(tf.sub),
  mul: binary<'mul'>(tf.mul),
  div: binary<'div'>(tf.div),
  pow: binary<'pow'>(tf.pow),
  maximum: nanPropagating<'maximum'>(tf.maximum),
  minimum: nanPropagating<'minimum'>(tf.minimum),
  neg: unary<'neg'>(tf.neg),
  abs: unary<'abs'>(tf.abs),
  exp: unary<'exp'>(tf.exp),
  log: unary<'log'>(tf.log),
  sqrt: unary<'sqrt'>(tf.sqrt),
  rsqrt: unary<'rsqrt'>(tf.rsqrt),
  tanh: unary<'tanh'>(tf.tanh),
  sigmoid: unary<'sigmoid'>(tf.sigmoid),
  silu: unary<'silu'>(silu),
  gelu,
  sin: unary<'sin'>(tf.sin),
  cos: unary<'cos'>(tf.cos),
  equal: compare<'equal'>(tf.equal),
  notEqual: compare<'notEqual'>(tf.notEqual),
  less: compare<'less'>(tf.less),
  lessEqual: compare<'lessEqual'>(tf.lessEqual),
  greater: compare<'greater'>(tf.greater),
  greaterEqual: compare<'greaterEqual'>(tf.greaterEqual),
  where,
  cast,
  matmul,
  linear,
  groupedMatmul,
  quantizedLinear,
  sum,
  mean,
  max,
  argmax,
  softmax,
  rmsNorm,
  layerNorm,
  reshape,
  transpose,
  broadcastTo,
  concat,
  slice,
  gather,
  indexSelect,
  scatterAdd,
  topk,
  rotary,
  attention,
  // Serving composites: expanded into their primitive graphs (`decompose`) at prepare.
  loraBank: decomposed(),
  quantizedLoraBank: decomposed(),
  loraLinear: decomposed(),
  cachedAttention: decomposed(),
  loraBankLinear: decomposed(),
  skipRmsNorm: decomposed(),
  gatheredLoraLinear: decomposed(),
  loraScatterAdd: decomposed(),
  groupedLoraMatmul: decomposed(),
} as const satisfies TfRuleTable;
