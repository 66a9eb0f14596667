import type { AttrInput, AttrValues } from '../attrs.js';
import { IrCode, IrError } from '../errors.js';
import type { OpDef } from '../op-def.js';
import {
  abs,
  add,
  cast,
  cos,
  div,
  equal,
  exp,
  gelu,
  greater,
  greaterEqual,
  less,
  lessEqual,
  log,
  maximum,
  minimum,
  mul,
  neg,
  notEqual,
  pow,
  rsqrt,
  sigmoid,
  silu,
  sin,
  sqrt,
  sub,
  tanh,
  where,
} from './elementwise.js';
import { constant, gather, indexSelect, iota, scatterAdd, topk } from './indexing.js';
import { linear, matmul } from './linalg.js';
import { groupedMatmul } from './moe.js';
import { quantizedLinear } from './quant.js';
import { attention, randomUniform, rotary } from './nn.js';
import { cachedAttention, loraBank } from './serving.js';
import { argmax, layerNorm, max, mean, rmsNorm, softmax, sum } from './reduce.js';
import { broadcastTo, concat, reshape, slice, transpose } from './shape.js';

// NOTE: every backend's rule table repeats this key list on purpose (the duplicates report lists it):
// the tables are mapped types over `OpKey`, so each must name every op to build.
/**
 * The op registry: every op the IR knows, defined once. The verifier, printer, parser,
 * interpreter, binding-time analysis, cost model and every lowering read these definitions; a
 * backend's rule table is a mapped type over `OpKey`, so adding an op here fails every backend's
 * build until it says how to handle it.
 */
export const OPS = {
  constant,
  iota,
  randomUniform,
  add,
  sub,
  mul,
  div,
  pow,
  maximum,
  minimum,
  neg,
  abs,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  silu,
  gelu,
  sin,
  cos,
  equal,
  notEqual,
  less,
  lessEqual,
  greater,
  greaterEqual,
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
  loraBank,
  cachedAttention,
} as const;

/** Registry key of an op (`matmul`, `rmsNorm`). */
export type OpKey = keyof typeof OPS;

/** Normalized attribute values of op `K`. */
export type AttrsOf<K extends OpKey> = AttrValues<(typeof OPS)[K]['attrs']>;

/** Attribute values a builder call for op `K` accepts (defaults may be omitted). */
export type AttrsIn<K extends OpKey> = AttrInput<(typeof OPS)[K]['attrs']>;

/** Every registry key, in registry order. */
export const OP_KEYS: readonly OpKey[] = Object.keys(OPS) as OpKey[];

const BY_NAME = new Map<string, OpKey>(OP_KEYS.map((k) => [OPS[k].name, k]));

/** Whether `key` is a registry key. */
export function isOpKey(key: string): key is OpKey {
  return Object.hasOwn(OPS, key);
}

/** The definition of op `key`, typed loosely for generic consumers; throws `IR_UNKNOWN_OP`. */
export function opDef(key: string): OpDef {
  if (!isOpKey(key)) throw new IrError(IrCode.UNKNOWN_OP, `unknown op '${key}'`);
  return OPS[key] as unknown as OpDef;
}

/** The key of the op printed as `name` (`sml.rms_norm` → `rmsNorm`); throws `IR_UNKNOWN_OP`. */
export function opKeyByName(name: string): OpKey {
  const k = BY_NAME.get(name);
  if (k === undefined) throw new IrError(IrCode.UNKNOWN_OP, `unknown op '${name}'`);
  return k;
}
