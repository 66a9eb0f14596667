import { UNARY, binary, cast, compare, gelu, nanPropagating, rsqrt, silu, where } from './rules-elementwise.js';
import { gather, indexSelect, scatterAdd, topk } from './rules-index.js';
import { argmax, groupedMatmul, layerNorm, linear, matmul, max, mean, rmsNorm, softmax, sum } from './rules-linalg.js';
import { attention, rotary } from './rules-nn.js';
import { attentionFused, linearWeightMajor, rmsNormFused, rotaryFused, skipRmsNormFused } from './rules-fused.js';
import { quantizedLinear } from './rules-quant.js';
import { broadcastTo, concat, constant, iota, randomUniform, reshape, slice, transpose } from './rules-shape.js';
import { type OnnxRuleTable, decomposed } from './rule.js';

// NOTE: the key list repeats `OPS` and the tfjs/MLIR tables on purpose (the duplicates report lists it):
// each backend's exhaustive per-op rule table is its own, and `satisfies` checks it against the registry.
/**
 * How every op of the IR registry lowers to standard ONNX (opset `ONNX_OPSET`, default domain
 * only): a complete mapped type over `OpKey` checked with `satisfies`, so adding an op to `OPS`
 * fails this build until it has a lowering or an `unsupported(reason)` entry. Every op currently
 * lowers; `quantizedLinear` uses onnxruntime's `com.microsoft` MatMulNBits where it can (the one
 * exception to "default domain only"); composites (rmsNorm, gelu, silu, rotary, attention, groupedMatmul, NaN-aware max/argmax/
 * topk) are built from standard ops.
 */
export const ONNX_RULES = {
  constant,
  iota,
  randomUniform,
  add: binary<'add'>('Add'),
  sub: binary<'sub'>('Sub'),
  mul: binary<'mul'>('Mul'),
  div: binary<'div'>('Div'),
  pow: binary<'pow'>('Pow'),
  maximum: nanPropagating<'maximum'>('Max'),
  minimum: nanPropagating<'minimum'>('Min'),
  neg: UNARY.neg,
  abs: UNARY.abs,
  exp: UNARY.exp,
  log: UNARY.log,
  sqrt: UNARY.sqrt,
  rsqrt,
  tanh: UNARY.tanh,
  sigmoid: UNARY.sigmoid,
  silu,
  gelu,
  sin: UNARY.sin,
  cos: UNARY.cos,
  equal: compare('equal'),
  notEqual: compare('notEqual'),
  less: compare('less'),
  lessEqual: compare('lessEqual'),
  greater: compare('greater'),
  greaterEqual: compare('greaterEqual'),
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
  // Serving composites: expanded into their primitive graphs (`decompose`) before lowering.
  loraBank: decomposed(),
  quantizedLoraBank: decomposed(),
  loraLinear: decomposed(),
  cachedAttention: decomposed(),
  loraBankLinear: decomposed(),
  // The standard table has no skip norm: the add and the norm's decomposed lowering.
  skipRmsNorm: decomposed(),
  gatheredLoraLinear: decomposed(),
  loraScatterAdd: decomposed(),
  groupedLoraMatmul: decomposed(),
} as const satisfies OnnxRuleTable;

/**
 * `ONNX_RULES` with onnxruntime's fused kernels: rmsNorm as `SimplifiedLayerNormalization`, the
 * residual add + rmsNorm op `skipRmsNorm` as `com.microsoft` SkipSimplifiedLayerNormalization
 * (`skipRmsNormFused`), rotary as `com.microsoft` RotaryEmbedding and causal
 * attention as `com.microsoft` GroupQueryAttention where their semantics provably match
 * (`rmsNormFused`, `rotaryFused`, `attentionFused`), and linears with run-time weights in the
 * weight-major form for several rows (`linearWeightMajor`). Opt-in (the executor's `rules`): on
 * SmolLM2-shaped engine programs the fused kernels measured no faster than the default table and
 * the weight-major linear trades single-row decode (−9%) for multi-row steps (+28–39%);
 * docs/onnx.md has the numbers. Its models run on onnxruntime only.
 */
export const ONNX_FUSED_RULES = {
  ...ONNX_RULES,
  linear: linearWeightMajor,
  rmsNorm: rmsNormFused,
  skipRmsNorm: skipRmsNormFused,
  rotary: rotaryFused,
  attention: attentionFused,
} as const satisfies OnnxRuleTable;
