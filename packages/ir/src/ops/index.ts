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
import { quantizedLoraBank } from './quant-serving.js';
import { cachedAttention, loraBank, loraLinear } from './serving.js';
import { loraBankLinear, skipRmsNorm } from './serving-fused.js';
import { gatheredLoraLinear, groupedLoraMatmul, loraScatterAdd } from './serving-kernels.js';
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
  quantizedLoraBank,
  loraLinear,
  cachedAttention,
  loraBankLinear,
  skipRmsNorm,
  gatheredLoraLinear,
  loraScatterAdd,
  groupedLoraMatmul,
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

/** Ops added with `registerOp`, by key. */
const EXTENSIONS = new Map<string, OpDef>();

/**
 * Adds a composite op to the registry at run time: graphs may use it (builder, verifier,
 * interpreter, JSON, printer) under `def.key`, and since no backend's rule table names it, every
 * executor runs it through `def.decompose` (`expandComposites` before `prepare`). Backends never
 * need a change for it. `OP_KEYS` and `OpKey` keep listing the built-in ops only.
 * Errors: `IR_BAD_ATTR` for a def without a decomposition, or whose key or printed name is taken.
 */
export function registerOp(def: OpDef): void {
  if (def.decompose === undefined) throw new IrError(IrCode.BAD_ATTR, `registerOp: '${def.key}' has no decomposition; an op added at run time reaches backends only through one`);
  if (isOpKey(def.key) || BY_NAME.has(def.name)) throw new IrError(IrCode.BAD_ATTR, `registerOp: the op key '${def.key}' or name '${def.name}' is taken`);
  EXTENSIONS.set(def.key, def);
  BY_NAME.set(def.name, def.key as OpKey);
}

/** Whether `key` is a registry key (built in, or added with `registerOp`). */
export function isOpKey(key: string): key is OpKey {
  return Object.hasOwn(OPS, key) || EXTENSIONS.has(key);
}

/** The definition of op `key`, typed loosely for generic consumers; throws `IR_UNKNOWN_OP`. */
export function opDef(key: string): OpDef {
  if (Object.hasOwn(OPS, key)) return OPS[key as OpKey] as unknown as OpDef;
  const ext = EXTENSIONS.get(key);
  if (ext === undefined) throw new IrError(IrCode.UNKNOWN_OP, `unknown op '${key}'`);
  return ext;
}

/** The key of the op printed as `name` (`sml.rms_norm` → `rmsNorm`); throws `IR_UNKNOWN_OP`. */
export function opKeyByName(name: string): OpKey {
  const k = BY_NAME.get(name);
  if (k === undefined) throw new IrError(IrCode.UNKNOWN_OP, `unknown op '${name}'`);
  return k;
}
