import type { OpKey } from '@stageml/ir';
import { type MlirRule, unsupported } from './rule.js';
import { binaryRule, broadcastToRule, castRule, compareRule, geluRule, unaryRule, whereRule } from './rules/elementwise.js';
import { constantRule, gatherRule, indexSelectRule, iotaRule, scatterAddRule } from './rules/indexing.js';
import { groupedMatmulRule, linearRule, matmulRule } from './rules/linalg.js';
import { decomposed } from './rules/decomposed.js';
import { attentionRule } from './rules/nn.js';
import { argmaxRule, layerNormRule, maxRule, meanRule, rmsNormRule, softmaxRule, sumRule } from './rules/reduce.js';
import { concatRule, reshapeRule, sliceRule, transposeRule } from './rules/shape.js';
import { topkRule } from './rules/topk.js';

/**
 * How every registry op lowers to MLIR. The table is a complete mapped type over `OpKey`: adding
 * an op to `OPS` fails this file's typecheck until it has a rule or an `unsupported(reason)` entry.
 */
export const mlirRules = {
  constant: constantRule,
  iota: iotaRule,
  randomUniform: unsupported(
    'random ops draw from a seeded stream on every execution, which has no counterpart in the func/arith/linalg dialects; keep them on the host executor or feed samples as an input',
  ),
  add: binaryRule('add'),
  sub: binaryRule('sub'),
  mul: binaryRule('mul'),
  div: binaryRule('div'),
  pow: binaryRule('pow'),
  maximum: binaryRule('maximum'),
  minimum: binaryRule('minimum'),
  neg: unaryRule('neg'),
  abs: unaryRule('abs'),
  exp: unaryRule('exp'),
  log: unaryRule('log'),
  sqrt: unaryRule('sqrt'),
  rsqrt: unaryRule('rsqrt'),
  tanh: unaryRule('tanh'),
  sigmoid: unaryRule('sigmoid'),
  silu: unaryRule('silu'),
  gelu: geluRule,
  sin: unaryRule('sin'),
  cos: unaryRule('cos'),
  equal: compareRule('equal'),
  notEqual: compareRule('notEqual'),
  less: compareRule('less'),
  lessEqual: compareRule('lessEqual'),
  greater: compareRule('greater'),
  greaterEqual: compareRule('greaterEqual'),
  where: whereRule,
  cast: castRule,
  matmul: matmulRule,
  linear: linearRule,
  groupedMatmul: groupedMatmulRule,
  quantizedLinear: unsupported('block-quantized weights (u8 codes, per-block scales) have no linalg lowering yet; dequantize first (the weights are constants) or lower through ONNX'),
  sum: sumRule,
  mean: meanRule,
  max: maxRule,
  argmax: argmaxRule,
  softmax: softmaxRule,
  rmsNorm: rmsNormRule,
  layerNorm: layerNormRule,
  reshape: reshapeRule,
  transpose: transposeRule,
  broadcastTo: broadcastToRule,
  concat: concatRule,
  slice: sliceRule,
  gather: gatherRule,
  indexSelect: indexSelectRule,
  scatterAdd: scatterAddRule,
  topk: topkRule,
  // Composite: lowered through the registry's decomposition (slices, concat, neg, mul, add).
  rotary: decomposed('rotary'),
  attention: attentionRule,
  // Serving composites: lowered through their decompositions (gathers, matmuls; transpose, concat, attention).
  loraBank: decomposed('loraBank'),
  quantizedLoraBank: decomposed('quantizedLoraBank'),
  loraLinear: decomposed('loraLinear'),
  cachedAttention: decomposed('cachedAttention'),
  loraBankLinear: decomposed('loraBankLinear'),
  skipRmsNorm: decomposed('skipRmsNorm'),
  gatheredLoraLinear: decomposed('gatheredLoraLinear'),
  loraScatterAdd: decomposed('loraScatterAdd'),
  groupedLoraMatmul: decomposed('groupedLoraMatmul'),
} satisfies { readonly [K in OpKey]: MlirRule<K> };

/** The rule of op `K` (typed per op). */
export function mlirRuleOf<K extends OpKey>(key: K): MlirRule<K> {
  return (mlirRules as { readonly [P in OpKey]: MlirRule<P> })[key];
}
