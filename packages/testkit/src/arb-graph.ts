import {
  type DType,
  type Dim,
  type DimBindings,
  type Graph,
  GraphBuilder,
  type HostTensor,
  IrError,
  type OpKey,
  type TensorType,
  type Value,
  broadcastShapes,
  dimDivExact,
  dimEquals,
  dimMul,
  dimProduct,
  dimSymbols,
  evalDim,
  graphInputs,
  graphParams,
  isFloatDType,
  isStaticDim,
  valueUsers,
} from '@stageml/ir';
import fc from 'fast-check';

import { arbHostTensor } from './arb-tensor.js';
import { Chooser } from './chooser.js';

/** Options of `arbGraph`. */
export interface GraphArbOptions {
  /** Most op-application steps (default 8). Helper nodes (index constants, parameters) come on top. */
  readonly maxNodes?: number;
  /**
   * Ops the steps choose from (default `GRAPH_OPS`: every op of `OPS`). Whatever this list says,
   * index operands of gather/indexSelect/scatterAdd are made with `constant`/`iota`, the groups
   * of groupedMatmul with `argmax`, scalar partners with `constant`, a rank-3 query for attention
   * with `reshape`, the base projection of loraBank and quantizedLoraBank with `linear`, and other missing operands with
   * parameters.
   */
  readonly ops?: readonly OpKey[];
  /** Most graph inputs (default 3, at least 1). */
  readonly maxInputs?: number;
  /** Symbol names input shapes may use (default `batch`, `seq`). */
  readonly symbols?: readonly string[];
}

/** A graph with everything needed to run it. */
export interface GraphWithData {
  /** A well-typed graph built through `GraphBuilder`. */
  readonly graph: Graph;
  /** The size chosen for every symbol the graph mentions. */
  readonly bindings: DimBindings;
  /** Data for every graph input, by name. */
  readonly inputs: Record<string, HostTensor>;
  /** Data for every parameter, by name. */
  readonly weights: Record<string, HostTensor>;
}

const MAX_RANK = 4;
const MAX_ELEMENTS = 256;
/** Symbols are bound to 2 or 3 in data (see `arbGraphWithData`); sizes are estimated at the top. */
const SYMBOL_ESTIMATE = 3;

interface Ctx {
  readonly b: GraphBuilder;
  readonly pool: Value[];
  params: number;
}

type Gen = (ctx: Ctx, c: Chooser) => readonly Value[] | undefined;

const estimate = (d: Dim): number => {
  if (isStaticDim(d)) return d;
  const bind: Record<string, number> = {};
  for (const s of dimSymbols(d)) bind[s] = SYMBOL_ESTIMATE;
  return Math.abs(evalDim(d, bind));
};
/** The least value of `d` over bindings of its symbols to 2 or 3 (the sizes data generation uses). */
function minValue(d: Dim): number {
  if (isStaticDim(d)) return d;
  const names = dimSymbols(d);
  let least = Number.POSITIVE_INFINITY;
  for (let mask = 0; mask < 1 << names.length; mask++) {
    const bind: Record<string, number> = {};
    names.forEach((s, i) => {
      bind[s] = (mask >> i) & 1 ? 3 : 2;
    });
    least = Math.min(least, evalDim(d, bind));
  }
  return least;
}
const sizeEstimate = (shape: readonly Dim[]): number => shape.reduce<number>((a, d) => a * Math.max(1, estimate(d)), 1);
const fits = (shape: readonly Dim[]): boolean => shape.length <= MAX_RANK && sizeEstimate(shape) <= MAX_ELEMENTS;
const isFloat = (v: Value): boolean => isFloatDType(v.type.dtype);
const nonBool = (v: Value): boolean => v.type.dtype !== 'bool';
const rankOf = (v: Value): number => v.type.shape.length;

function broadcasts(shapes: readonly (readonly Dim[])[]): Dim[] | undefined {
  try {
    return broadcastShapes(shapes);
  } catch (e) {
    if (e instanceof IrError) return undefined;
    throw e;
  }
}

function param(ctx: Ctx, dtype: DType, shape: readonly Dim[]): Value {
  const name = ctx.params % 3 === 2 ? `blk.${String(ctx.params)}.w` : `p${String(ctx.params)}`;
  ctx.params++;
  return ctx.b.param(name, { dtype, shape: [...shape] });
}

function choose(c: Chooser, pool: readonly Value[], pred: (v: Value) => boolean): Value | undefined {
  const xs = pool.filter(pred);
  return xs.length === 0 ? undefined : xs[xs.length - 1 - c.int(xs.length)];
}

/** Dims already in the graph (so symbols stay bound by inputs) plus small static ones. */
function someDim(ctx: Ctx, c: Chooser): Dim {
  if (c.int(3) !== 2) return c.range(1, 3);
  const dims = ctx.pool.flatMap((v) => v.type.shape).filter((d) => !isStaticDim(d) && dimSymbols(d).length > 0);
  return dims.length === 0 ? c.range(1, 3) : c.pick(dims);
}

/** A shape that broadcasts against `shape`: a suffix with some dims turned into 1. */
function broadcastPartnerShape(c: Chooser, shape: readonly Dim[]): Dim[] {
  const keep = c.int(shape.length + 1);
  return shape.slice(shape.length - keep).map((d) => (c.int(3) === 0 ? 1 : d));
}

/** A second operand of x's dtype that broadcasts with `x`: x itself, a pool value, a parameter or a scalar. */
/**
 * A grouped matmul's operands: x [n, k] from the pool (`pred`), e ≤ 3 groups, m outputs, w per
 * group ([e, m, k] with `transposeW`, else [e, k, m]) and router-style groups (the argmax over e
 * expert scores, always a valid group index).
 */
function groupedOperands(ctx: Ctx, c: Chooser, pred: (v: Value) => boolean): { x: Value; w: Value; groups: Value; k: Dim; e: number; m: Dim; transposeW: boolean } | undefined {
  const x = choose(c, ctx.pool, (v) => pred(v) && rankOf(v) === 2);
  if (x === undefined) return undefined;
  const [n, k] = x.type.shape as [Dim, Dim];
  const e = c.range(1, 3);
  const m = someDim(ctx, c);
  const transposeW = c.bool();
  if (!fits([n, m])) return undefined;
  const w = param(ctx, x.type.dtype, transposeW ? [e, m, k] : [e, k, m]);
  return { x, w, groups: ctx.b.argmax(param(ctx, 'f32', [n, e]), -1), k, e, m, transposeW };
}

function partner(ctx: Ctx, c: Chooser, x: Value): Value {
  const dtype = x.type.dtype;
  switch (c.int(4)) {
    case 0:
      return x;
    case 1: {
      const y = choose(c, ctx.pool, (v) => v.type.dtype === dtype && fitsBroadcast([x.type.shape, v.type.shape]));
      if (y !== undefined) return y;
      break;
    }
    case 2:
      return ctx.b.constant(c.range(-2, 2) / 2 + 0.25 * (isFloatDType(dtype) ? 1 : 0), dtype, []);
    default:
      break;
  }
  return param(ctx, dtype, broadcastPartnerShape(c, x.type.shape));
}

function fitsBroadcast(shapes: readonly (readonly Dim[])[]): boolean {
  const s = broadcasts(shapes);
  return s !== undefined && fits(s);
}

function randomAxis(c: Chooser, rank: number): number {
  const a = c.int(rank);
  return c.int(3) === 0 ? a - rank : a;
}

function binaryGen(key: 'add' | 'sub' | 'mul' | 'div' | 'pow' | 'maximum' | 'minimum', floatOnly: boolean): Gen {
  return (ctx, c) => {
    const x = choose(c, ctx.pool, floatOnly ? isFloat : nonBool);
    if (x === undefined) return undefined;
    const y = partner(ctx, c, x);
    return c.bool() ? [ctx.b.op(key, [x, y])] : [ctx.b.op(key, [y, x])];
  };
}

function compareGen(key: 'equal' | 'notEqual' | 'less' | 'lessEqual' | 'greater' | 'greaterEqual'): Gen {
  return (ctx, c) => {
    const x = choose(c, ctx.pool, () => true);
    if (x === undefined) return undefined;
    return [ctx.b.op(key, [x, partner(ctx, c, x)])];
  };
}

function unaryGen(
  key: 'neg' | 'abs' | 'exp' | 'log' | 'sqrt' | 'rsqrt' | 'tanh' | 'sigmoid' | 'silu' | 'sin' | 'cos',
  floatOnly: boolean,
): Gen {
  return (ctx, c) => {
    const x = choose(c, ctx.pool, floatOnly ? isFloat : nonBool);
    return x === undefined ? undefined : [ctx.b.op(key, [x])];
  };
}

function reduceGen(key: 'sum' | 'mean' | 'max'): Gen {
  return (ctx, c) => {
    const x = choose(c, ctx.pool, key === 'mean' ? isFloat : nonBool);
    if (x === undefined) return undefined;
    const r = rankOf(x);
    const axes = c.shuffle(c.subset(Array.from({ length: r }, (_, i) => i))).map((a) => (c.int(3) === 0 ? a - r : a));
    return [ctx.b.op(key, [x], { axes, keepDims: c.bool() })];
  };
}

/** A 1-D (or, when `allowNd`, n-D) index operand with values in [0, size). */
function indexOperand(ctx: Ctx, c: Chooser, size: Dim, allowNd: boolean): Value | undefined {
  const dtype = c.pick<DType>(['i64', 'i32']);
  if (isStaticDim(size)) {
    if (size === 0) return undefined;
    const shape = allowNd ? c.pick([[c.range(1, 3)], [], [2, c.range(1, 2)]]) : [c.range(0, 3)];
    const n = shape.reduce((a, d) => a * d, 1);
    const values = Array.from({ length: n }, () => c.int(size));
    return ctx.b.constant(values.length === 0 ? [0] : values, dtype, shape);
  }
  return allowNd && c.bool() ? ctx.b.iota([2, size], 1, dtype) : ctx.b.iota([size], 0, dtype);
}

function reshapeTarget(c: Chooser, shape: readonly Dim[]): Dim[] {
  const r = shape.length;
  switch (c.int(5)) {
    case 0:
      return [-1];
    case 1:
      return [dimProduct(shape)];
    case 2:
      if (r >= 2) {
        const i = c.int(r - 1);
        return [...shape.slice(0, i), dimMul(shape[i]!, shape[i + 1]!), ...shape.slice(i + 2)];
      }
      break;
    case 3: {
      const i = c.int(r);
      const d = shape[i];
      if (d !== undefined && isStaticDim(d) && d % 2 === 0 && d > 0) {
        // −1 is inferable only when the other dims multiply to a non-zero size.
        const inferable = !shape.includes(0);
        return [...shape.slice(0, i), 2, inferable && c.bool() ? -1 : d / 2, ...shape.slice(i + 1)];
      }
      break;
    }
    default:
      break;
  }
  // Insert a unit dim, and maybe let a static non-zero dim be inferred (−1).
  const i = c.int(r + 1);
  const out: Dim[] = [...shape.slice(0, i), 1, ...shape.slice(i)];
  const j = c.int(out.length);
  const known = dimProduct(out.filter((_, k) => k !== j));
  const d = out[j]!;
  if (isStaticDim(d) && d > 0 && !(isStaticDim(known) && known === 0) && c.bool()) out[j] = -1;
  return out;
}

const GENERATORS: Readonly<Record<OpKey, Gen>> = {
  add: binaryGen('add', false),
  sub: binaryGen('sub', false),
  mul: binaryGen('mul', false),
  div: binaryGen('div', true),
  pow: binaryGen('pow', true),
  maximum: binaryGen('maximum', false),
  minimum: binaryGen('minimum', false),
  neg: unaryGen('neg', false),
  abs: unaryGen('abs', false),
  exp: unaryGen('exp', true),
  log: unaryGen('log', true),
  sqrt: unaryGen('sqrt', true),
  rsqrt: unaryGen('rsqrt', true),
  tanh: unaryGen('tanh', true),
  sigmoid: unaryGen('sigmoid', true),
  silu: unaryGen('silu', true),
  sin: unaryGen('sin', true),
  cos: unaryGen('cos', true),
  gelu: (ctx, c) => {
    const x = choose(c, ctx.pool, isFloat);
    return x === undefined ? undefined : [ctx.b.gelu(x, c.pick(['none', 'tanh'] as const))];
  },
  equal: compareGen('equal'),
  notEqual: compareGen('notEqual'),
  less: compareGen('less'),
  lessEqual: compareGen('lessEqual'),
  greater: compareGen('greater'),
  greaterEqual: compareGen('greaterEqual'),
  where: (ctx, c) => {
    const a = choose(c, ctx.pool, () => true);
    if (a === undefined) return undefined;
    const bv = partner(ctx, c, a);
    const shape = broadcasts([a.type.shape, bv.type.shape])!;
    const cond =
      choose(c, ctx.pool, (v) => v.type.dtype === 'bool' && fitsBroadcast([shape, v.type.shape])) ??
      param(ctx, 'bool', broadcastPartnerShape(c, shape));
    return [ctx.b.where(cond, a, bv)];
  },
  cast: (ctx, c) => {
    const x = choose(c, ctx.pool, () => true);
    return x === undefined ? undefined : [ctx.b.cast(x, c.pick<DType>(['f32', 'f16', 'bf16', 'f64', 'i32', 'i64', 'i8', 'u8', 'bool']))];
  },
  matmul: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => nonBool(v) && rankOf(v) >= 2);
    if (x === undefined) return undefined;
    const s = x.type.shape;
    const r = s.length;
    const ta = c.bool();
    const tb = c.bool();
    const n = someDim(ctx, c);
    const batch = c.bool() ? [] : broadcastPartnerShape(c, s.slice(0, r - 2));
    if (c.bool()) {
      // x on the left: op(x) is [m, k]; w is op(w) = [k, n].
      const [m, k] = ta ? [s[r - 1]!, s[r - 2]!] : [s[r - 2]!, s[r - 1]!];
      if (!fits([...s.slice(0, r - 2), m, n])) return undefined;
      const w = param(ctx, x.type.dtype, [...batch, ...(tb ? [n, k] : [k, n])]);
      return [ctx.b.matmul(x, w, { transposeA: ta, transposeB: tb })];
    }
    // x on the right: op(x) is [k, n2]; the new lhs is op(lhs) = [n, k].
    const [k, n2] = tb ? [s[r - 1]!, s[r - 2]!] : [s[r - 2]!, s[r - 1]!];
    if (!fits([...s.slice(0, r - 2), n, n2])) return undefined;
    const lhs = param(ctx, x.type.dtype, [...batch, ...(ta ? [k, n] : [n, k])]);
    return [ctx.b.matmul(lhs, x, { transposeA: ta, transposeB: tb })];
  },
  linear: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => nonBool(v) && rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const out = someDim(ctx, c);
    const inDim = x.type.shape[rankOf(x) - 1]!;
    if (!fits([...x.type.shape.slice(0, -1), out])) return undefined;
    const w = param(ctx, x.type.dtype, [out, inDim]);
    const bias = c.bool() ? param(ctx, x.type.dtype, [out]) : undefined;
    return [ctx.b.linear(x, w, bias)];
  },
  quantizedLinear: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1 && isStaticDim(v.type.shape[rankOf(v) - 1]!) && (v.type.shape[rankOf(v) - 1] as number) > 0);
    if (x === undefined) return undefined;
    const out = c.range(1, 3);
    const inFeatures = x.type.shape[rankOf(x) - 1] as number;
    if (!fits([...x.type.shape.slice(0, -1), out])) return undefined;
    const bits = c.bool() ? 8 : 4;
    const blockSize = bits === 4 ? 2 * c.range(1, 2) : c.range(1, 3);
    const blocks = Math.ceil(inFeatures / blockSize);
    const q = param(ctx, 'u8', [out, blocks, Math.ceil((blockSize * bits) / 8)]);
    const s = param(ctx, x.type.dtype, [out, blocks]);
    const zp = c.bool() ? param(ctx, 'u8', [out, Math.ceil((blocks * bits) / 8)]) : undefined;
    return [ctx.b.quantizedLinear(x, q, s, zp, { bits, blockSize, inFeatures })];
  },
  sum: reduceGen('sum'),
  mean: reduceGen('mean'),
  max: reduceGen('max'),
  argmax: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => nonBool(v) && rankOf(v) >= 1 && v.type.shape.some((d) => d !== 0));
    if (x === undefined) return undefined;
    const axes = x.type.shape.flatMap((d, i) => (d === 0 ? [] : [i]));
    const a = c.pick(axes);
    return [ctx.b.argmax(x, c.bool() ? a - rankOf(x) : a, c.bool())];
  },
  softmax: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1);
    return x === undefined ? undefined : [ctx.b.softmax(x, randomAxis(c, rankOf(x)))];
  },
  rmsNorm: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const w = c.bool() ? param(ctx, x.type.dtype, [x.type.shape[rankOf(x) - 1]!]) : undefined;
    return [ctx.b.rmsNorm(x, w, c.pick([1e-6, 1e-5, 0.01]))];
  },
  layerNorm: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const last = x.type.shape[rankOf(x) - 1]!;
    const w = c.bool() ? param(ctx, x.type.dtype, [last]) : undefined;
    const bias = w !== undefined && c.bool() ? param(ctx, x.type.dtype, [last]) : undefined;
    return [ctx.b.layerNorm(x, w, bias, c.pick([1e-5, 1e-3]))];
  },
  reshape: (ctx, c) => {
    const x = choose(c, ctx.pool, () => true);
    if (x === undefined) return undefined;
    const target = reshapeTarget(c, x.type.shape);
    if (target.length > MAX_RANK) return undefined;
    return [ctx.b.op('reshape', [x], { shape: target })];
  },
  transpose: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const r = rankOf(x);
    const perm = c.shuffle(Array.from({ length: r }, (_, i) => i)).map((a) => (c.int(4) === 0 ? a - r : a));
    return [ctx.b.transpose(x, perm)];
  },
  broadcastTo: (ctx, c) => {
    const x = choose(c, ctx.pool, () => true);
    if (x === undefined) return undefined;
    const lead = c.int(2) === 0 ? [] : [someDim(ctx, c)];
    const target = [...lead, ...x.type.shape.map((d) => (d === 1 && c.bool() ? someDim(ctx, c) : d))];
    if (!fits(target)) return undefined;
    return [ctx.b.broadcastTo(x, target)];
  },
  concat: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const r = rankOf(x);
    const axis = randomAxis(c, r);
    const ax = axis < 0 ? axis + r : axis;
    const others: Value[] = [];
    const count = c.int(3);
    for (let i = 0; i < count; i++) {
      const same = (v: Value): boolean =>
        v.type.dtype === x.type.dtype && rankOf(v) === r && v.type.shape.every((d, k) => k === ax || dimEquals(d, x.type.shape[k]!));
      const pick = c.int(3);
      const y = pick === 0 ? x : pick === 1 ? choose(c, ctx.pool, same) : undefined;
      others.push(y ?? param(ctx, x.type.dtype, x.type.shape.map((d, k) => (k === ax ? c.range(0, 3) : d))));
    }
    const xs = c.bool() ? [x, ...others] : [...others, x];
    const axisSize = xs.reduce((acc, v) => acc + Math.max(1, estimate(v.type.shape[ax]!)), 0);
    if (!fits(x.type.shape.map((d, k) => (k === ax ? axisSize : d)))) return undefined;
    return [ctx.b.concat(xs, axis)];
  },
  slice: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const r = rankOf(x);
    const axis = randomAxis(c, r);
    const size = x.type.shape[axis < 0 ? axis + r : axis]!;
    if (isStaticDim(size)) {
      const bound = (): number => c.range(-size - 1, size + 1);
      const start = c.bool() ? bound() : 0;
      const step = c.pick([1, 1, 2, 3]);
      return [c.bool() ? ctx.b.slice(x, axis, start, bound(), step) : ctx.b.slice(x, axis, start, undefined, step)];
    }
    // Symbolic axis: step 1 and bounds that stay in range for every binding (symbols are 2 or 3),
    // so no symbolic length can reach 0 or below at run time.
    const least = minValue(size);
    const options: (() => Value)[] = [() => ctx.b.slice(x, axis, 0), () => ctx.b.slice(x, axis, -1)];
    if (least >= 2) options.push(() => ctx.b.slice(x, axis, 1), () => ctx.b.slice(x, axis, 0, -1));
    return [c.pick(options)()];
  },
  gather: (ctx, c) => {
    const t = choose(c, ctx.pool, (v) => rankOf(v) >= 1 && rankOf(v) <= 3);
    if (t === undefined) return undefined;
    const r = rankOf(t);
    const axis = randomAxis(c, r);
    const idx = indexOperand(ctx, c, t.type.shape[axis < 0 ? axis + r : axis]!, true);
    if (idx === undefined) return undefined;
    const a = axis < 0 ? axis + r : axis;
    if (!fits([...t.type.shape.slice(0, a), ...idx.type.shape, ...t.type.shape.slice(a + 1)])) return undefined;
    return [ctx.b.gather(t, idx, axis)];
  },
  indexSelect: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const r = rankOf(x);
    const axis = randomAxis(c, r);
    const idx = indexOperand(ctx, c, x.type.shape[axis < 0 ? axis + r : axis]!, false);
    if (idx === undefined) return undefined;
    return [ctx.b.indexSelect(x, idx, axis)];
  },
  scatterAdd: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => nonBool(v) && rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const r = rankOf(x);
    const axis = randomAxis(c, r);
    const a = axis < 0 ? axis + r : axis;
    const idx = indexOperand(ctx, c, x.type.shape[a]!, false);
    if (idx === undefined) return undefined;
    const updates = param(ctx, x.type.dtype, x.type.shape.map((d, k) => (k === a ? idx.type.shape[0]! : d)));
    return [ctx.b.scatterAdd(x, idx, updates, axis)];
  },
  topk: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => nonBool(v) && v.type.shape.some(isStaticDim));
    if (x === undefined) return undefined;
    const axes = x.type.shape.flatMap((d, i) => (isStaticDim(d) ? [i] : []));
    const a = c.pick(axes);
    const size = x.type.shape[a] as number;
    return ctx.b.topk(x, c.range(0, size), c.bool() ? a - rankOf(x) : a, c.int(3) !== 0);
  },
  rotary: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1 && dimDivExact(v.type.shape[rankOf(v) - 1]!, 2) !== undefined);
    if (x === undefined) return undefined;
    const s = x.type.shape;
    const tableShape = (): Dim[] => {
      const keep = c.range(1, s.length);
      return s.slice(s.length - keep).map((d, i) => (i < keep - 1 && c.int(3) === 0 ? 1 : d));
    };
    const cos = param(ctx, x.type.dtype, tableShape());
    const sin = c.bool() ? cos : param(ctx, x.type.dtype, tableShape());
    return [ctx.b.rotary(x, cos, sin, c.bool())];
  },
  attention: (ctx, c) => {
    let q = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 3);
    if (q === undefined) {
      // Lift a lower-rank float value to [1, …, x] so attention is not starved of rank-3 operands.
      const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1);
      if (x === undefined) return undefined;
      q = ctx.b.op('reshape', [x], { shape: [...Array.from({ length: 3 - rankOf(x) }, () => 1), ...x.type.shape] });
    }
    const s = q.type.shape;
    const r = s.length;
    const batch = s.slice(0, r - 3);
    const [hq, tq, d] = s.slice(r - 3) as [Dim, Dim, Dim];
    if (hq === 0) return undefined;
    const divisors = isStaticDim(hq) ? Array.from({ length: hq }, (_, i) => i + 1).filter((k) => hq % k === 0) : [];
    const hkv: Dim = isStaticDim(hq) ? (divisors.length === 0 ? hq : c.pick(divisors)) : c.pick([hq, 1]);
    const tk: Dim = c.bool() ? tq : c.range(1, 4);
    const dv: Dim = c.bool() ? d : c.range(1, 3);
    const dtype = q.type.dtype;
    const k = param(ctx, dtype, [...batch, hkv, tk, d]);
    const v = param(ctx, dtype, [...batch, hkv, tk, dv]);
    const scale = c.int(3) === 0 ? c.pick([0.5, 0.125]) : undefined;
    const causal = c.bool();
    const attrs = scale === undefined ? { causal } : { causal, scale };
    let mask: Value | undefined;
    switch (c.int(3)) {
      case 1:
        mask = param(ctx, 'bool', [tq, tk]);
        break;
      case 2:
        mask = param(ctx, dtype, [1, tq, tk]);
        break;
      default:
        break;
    }
    return [ctx.b.attention(q, k, v, attrs, mask)];
  },
  loraBank: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) === 3);
    if (x === undefined) return undefined;
    const [rows, , inDim] = x.type.shape as [Dim, Dim, Dim];
    const dtype = x.type.dtype;
    const out = c.range(1, 3);
    const slots = c.range(1, 3);
    const rank = c.range(1, 2);
    const base = ctx.b.linear(x, param(ctx, dtype, [out, inDim]), c.bool() ? param(ctx, dtype, [out]) : undefined);
    const A = param(ctx, dtype, [slots, rank, inDim]);
    const B = param(ctx, dtype, [slots, rank, out]);
    // Slot indices as constants (always in range); the gathered form's per-row index needs a
    // static row count.
    if (isStaticDim(rows) && c.bool()) {
      const index = ctx.b.constant(Array.from({ length: rows }, () => c.int(slots)), 'i64', [rows]);
      return [ctx.b.loraBank('gathered', x, base, A, B, index)];
    }
    if (c.bool()) {
      const groups = c.range(1, slots);
      const index = ctx.b.constant(Array.from({ length: groups }, () => c.int(slots)), 'i64', [groups]);
      return [ctx.b.loraBank('grouped', x, base, A, B, index, param(ctx, dtype, [rows, groups]))];
    }
    return [ctx.b.loraBank('single', x, base, A, B, ctx.b.constant(c.int(slots), 'i64', []), param(ctx, dtype, [rows, 1, 1]))];
  },
  loraBankLinear: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) === 3);
    if (x === undefined) return undefined;
    const [rows, , inDim] = x.type.shape as [Dim, Dim, Dim];
    const dtype = x.type.dtype;
    const out = c.range(1, 3);
    const slots = c.range(1, 3);
    const rank = c.range(1, 2);
    const w = param(ctx, dtype, [out, inDim]);
    const opts = c.bool() ? { bias: param(ctx, dtype, [out]) } : {};
    const A = param(ctx, dtype, [slots, rank, inDim]);
    const B = param(ctx, dtype, [slots, rank, out]);
    if (isStaticDim(rows) && c.bool()) {
      const index = ctx.b.constant(Array.from({ length: rows }, () => c.int(slots)), 'i64', [rows]);
      return [ctx.b.loraBankLinear('gathered', x, w, A, B, index, undefined, opts)];
    }
    if (c.bool()) {
      const groups = c.range(1, slots);
      const index = ctx.b.constant(Array.from({ length: groups }, () => c.int(slots)), 'i64', [groups]);
      return [ctx.b.loraBankLinear('grouped', x, w, A, B, index, param(ctx, dtype, [rows, groups]), opts)];
    }
    return [ctx.b.loraBankLinear('single', x, w, A, B, ctx.b.constant(c.int(slots), 'i64', []), param(ctx, dtype, [rows, 1, 1]), opts)];
  },
  skipRmsNorm: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const r = param(ctx, x.type.dtype, [...x.type.shape]);
    const w = c.bool() ? param(ctx, x.type.dtype, [x.type.shape[rankOf(x) - 1]!]) : undefined;
    return ctx.b.skipRmsNorm(x, r, w, c.pick([1e-6, 1e-5, 0.01]));
  },
  quantizedLoraBank: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) === 3);
    if (x === undefined) return undefined;
    const [rows, , inDim] = x.type.shape as [Dim, Dim, Dim];
    const dtype = x.type.dtype;
    const out = c.range(1, 3);
    const slots = c.range(1, 3);
    const rank = c.range(1, 2);
    const base = ctx.b.linear(x, param(ctx, dtype, [out, inDim]));
    const tables = [param(ctx, 'i8', [slots, rank, inDim]), param(ctx, dtype, [slots, rank]), param(ctx, 'i8', [slots, rank, out]), param(ctx, dtype, [slots, rank])] as const;
    if (isStaticDim(rows) && c.bool()) {
      const index = ctx.b.constant(Array.from({ length: rows }, () => c.int(slots)), 'i64', [rows]);
      return [ctx.b.quantizedLoraBank('gathered', x, base, ...tables, index)];
    }
    return [ctx.b.quantizedLoraBank('single', x, base, ...tables, ctx.b.constant(c.int(slots), 'i64', []), param(ctx, dtype, [rows, 1, 1]))];
  },
  cachedAttention: (ctx, c) => {
    const q = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 3);
    if (q === undefined) return undefined;
    const s = q.type.shape;
    const r = s.length;
    const batch = s.slice(0, r - 3);
    const [hq, tq, d] = s.slice(r - 3) as [Dim, Dim, Dim];
    if (!isStaticDim(hq) || hq === 0) return undefined;
    const divisors = Array.from({ length: hq }, (_, i) => i + 1).filter((k) => hq % k === 0);
    const hkv = c.pick(divisors);
    const past = c.range(0, 3);
    const dtype = q.type.dtype;
    const pastK = param(ctx, dtype, [...batch, past, hkv, d]);
    const pastV = param(ctx, dtype, [...batch, past, hkv, d]);
    const k = param(ctx, dtype, [...batch, hkv, tq, d]);
    const v = param(ctx, dtype, [...batch, hkv, tq, d]);
    return [ctx.b.cachedAttention(q, pastK, pastV, k, v, { causal: c.bool() })];
  },
  loraLinear: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) >= 1);
    if (x === undefined) return undefined;
    const out = someDim(ctx, c);
    const inDim = x.type.shape[rankOf(x) - 1]!;
    if (!fits([...x.type.shape.slice(0, -1), out])) return undefined;
    const rank = c.range(1, 2);
    const dtype = x.type.dtype;
    const opts = { bias: c.bool() ? param(ctx, dtype, [out]) : undefined, biasB: c.bool() ? param(ctx, dtype, [out]) : undefined };
    return [ctx.b.loraLinear(x, param(ctx, dtype, [out, inDim]), param(ctx, dtype, [rank, inDim]), param(ctx, dtype, [out, rank]), c.bool() ? 0.5 : 2, opts)];
  },
  gatheredLoraLinear: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => isFloat(v) && rankOf(v) === 3);
    if (x === undefined) return undefined;
    const [batch, , inDim] = x.type.shape as [Dim, Dim, Dim];
    // Adapter ids as constants (always in range): a static batch.
    if (!isStaticDim(batch)) return undefined;
    const dtype = x.type.dtype;
    const out = c.range(1, 3);
    const adapters = c.range(1, 3);
    const rank = c.range(1, 2);
    const ids = ctx.b.constant(Array.from({ length: batch }, () => c.int(adapters)), 'i64', [batch]);
    const bias = c.bool() ? param(ctx, dtype, [out]) : undefined;
    return [ctx.b.gatheredLoraLinear(x, param(ctx, dtype, [out, inDim]), param(ctx, dtype, [adapters, rank, inDim]), param(ctx, dtype, [adapters, out, rank]), param(ctx, dtype, [adapters]), ids, bias)];
  },
  loraScatterAdd: (ctx, c) => {
    const x = choose(c, ctx.pool, (v) => {
      const n = v.type.shape[0];
      return isFloat(v) && rankOf(v) >= 2 && n !== undefined && isStaticDim(n) && n > 0;
    });
    if (x === undefined) return undefined;
    const n = x.type.shape[0] as number;
    const inDim = x.type.shape[rankOf(x) - 1]!;
    const out = someDim(ctx, c);
    const accShape = [...x.type.shape.slice(0, -1), out];
    if (!fits(accShape)) return undefined;
    const dtype = x.type.dtype;
    const rank = c.range(1, 2);
    const k = c.range(1, 3);
    const rows = ctx.b.constant(Array.from({ length: k }, () => c.int(n)), 'i64', [k]);
    const biasB = c.bool() ? param(ctx, dtype, [out]) : undefined;
    return [ctx.b.loraScatterAdd(param(ctx, dtype, accShape), x, rows, param(ctx, dtype, [rank, inDim]), param(ctx, dtype, [out, rank]), c.bool() ? 0.5 : 2, biasB)];
  },
  groupedLoraMatmul: (ctx, c) => {
    const g = groupedOperands(ctx, c, isFloat);
    if (g === undefined) return undefined;
    const dtype = g.x.type.dtype;
    const rank = c.range(1, 2);
    return [ctx.b.groupedLoraMatmul(g.x, g.w, param(ctx, dtype, [g.e, rank, g.k]), param(ctx, dtype, [g.e, g.m, rank]), g.groups, { transposeW: g.transposeW, scale: c.bool() ? 0.5 : 2 })];
  },
  groupedMatmul: (ctx, c) => {
    const g = groupedOperands(ctx, c, nonBool);
    if (g === undefined) return undefined;
    return [ctx.b.op('groupedMatmul', [g.x, g.w, g.groups], { transposeW: g.transposeW })];
  },
  iota: (ctx, c) => {
    const shape = Array.from({ length: c.range(1, 2) }, () => someDim(ctx, c));
    return [ctx.b.iota(shape, randomAxis(c, shape.length), c.pick<DType>(['i64', 'i32', 'f32']))];
  },
  randomUniform: (ctx, c) => {
    const shape = Array.from({ length: c.range(1, 2) }, () => someDim(ctx, c));
    return [ctx.b.op('randomUniform', [], { shape, dtype: c.pick<DType>(['f32', 'f16', 'bf16', 'f64']) })];
  },
  constant: (ctx, c) => {
    const shape = Array.from({ length: c.int(3) }, () => c.range(0, 3));
    const n = shape.reduce((a, d) => a * d, 1);
    const dtype = c.pick<DType>(['f32', 'i64', 'f16', 'bool', 'i32']);
    const values = c.bool() || n === 0 ? [c.range(-4, 4) / 2] : Array.from({ length: n }, () => c.range(-8, 8) / 4);
    return [ctx.b.constant(values, dtype, shape)];
  },
};

/** Every op `arbGraph` can generate by default. */
export const GRAPH_OPS: readonly OpKey[] = Object.keys(GENERATORS) as OpKey[];

interface InputSpec {
  readonly dtype: DType;
  readonly shape: readonly (number | string)[];
}

interface GraphRecipe {
  readonly name: string;
  readonly inputs: readonly InputSpec[];
  readonly steps: readonly (readonly number[])[];
}

function arbRecipe(opts: GraphArbOptions): fc.Arbitrary<GraphRecipe> {
  const symbols = opts.symbols ?? ['batch', 'seq'];
  const dim: fc.Arbitrary<number | string> =
    symbols.length === 0
      ? fc.integer({ min: 1, max: 4 })
      : fc.oneof({ arbitrary: fc.integer({ min: 1, max: 4 }), weight: 2 }, { arbitrary: fc.constantFrom(...symbols), weight: 1 });
  const dtype = fc.constantFrom<DType>('f32', 'f32', 'f32', 'f32', 'f16', 'bf16', 'f64', 'i64', 'i32', 'bool');
  const input = fc.record({ dtype, shape: fc.array(dim, { minLength: 0, maxLength: 3 }) });
  return fc.record({
    name: fc.constantFrom('g', 'model', 'layer.0', 'a graph'),
    inputs: fc.array(input, { minLength: 1, maxLength: Math.max(1, opts.maxInputs ?? 3) }),
    steps: fc.array(fc.array(fc.nat({ max: 0xffff }), { minLength: 24, maxLength: 24 }), { maxLength: opts.maxNodes ?? 8 }),
  });
}

function buildFromRecipe(recipe: GraphRecipe, ops: readonly OpKey[]): Graph {
  const b = new GraphBuilder(recipe.name);
  const ctx: Ctx = { b, pool: [], params: 0 };
  recipe.inputs.forEach((s, i) => {
    ctx.pool.push(b.input(`x${String(i)}`, [s.dtype, s.shape]));
  });
  const gens = ops.map((k) => GENERATORS[k]);
  for (const step of recipe.steps) {
    if (gens.length === 0) break;
    const c = new Chooser(step);
    const made = c.pick(gens)(ctx, c);
    for (const v of made ?? []) if (!ctx.pool.includes(v)) ctx.pool.push(v);
  }
  // Outputs: every op result nothing uses (else the last value), so no work is dead.
  const g0 = b.build();
  const users = valueUsers(g0);
  const sinks = g0.values.flatMap((v, id) => (users[id]!.length === 0 && g0.nodes[v.node]!.kind === 'op' ? [id] : []));
  const outs = sinks.length === 0 ? [g0.values.length - 1] : sinks;
  outs.forEach((id, i) => {
    b.output(i === 0 ? 'out' : `out${String(i)}`, b.value(id));
  });
  return b.build();
}

/**
 * Random well-typed graphs built through `GraphBuilder`: up to `maxInputs` inputs with small
 * static and symbolic dims, then up to `maxNodes` op applications chosen from `ops` and applied to
 * existing values (missing operands become parameters; index operands are in-range constants or
 * iotas), with valid attributes. Outputs are the op results nothing else uses.
 */
export function arbGraph(opts: GraphArbOptions = {}): fc.Arbitrary<Graph> {
  const ops = opts.ops ?? GRAPH_OPS;
  return arbRecipe(opts).map((r) => buildFromRecipe(r, ops));
}

/**
 * A random graph (see `arbGraph`) with concrete data: every symbol bound to 2 or 3, inputs and
 * weights drawn by `arbHostTensor` (index operands are built in the graph, so they are in range).
 */
export function arbGraphWithData(opts: GraphArbOptions = {}): fc.Arbitrary<GraphWithData> {
  return arbGraph(opts).chain((graph) => {
    const symbols = [...new Set(graph.values.flatMap((v) => v.type.shape.flatMap(dimSymbols)))].sort();
    const bindingsArb = fc.tuple(...symbols.map(() => fc.integer({ min: 2, max: 3 }))).map((xs) => Object.fromEntries(symbols.map((s, i) => [s, xs[i]!])));
    return bindingsArb.chain((bindings) => {
      const leaves = [...graphInputs(graph), ...graphParams(graph)];
      const typeOf = (name: string): TensorType => graph.values.find((v) => v.name === name)!.type;
      return fc.tuple(...leaves.map((n) => arbHostTensor(typeOf(n.name), { bindings }))).map((data) => {
        const inputs: Record<string, HostTensor> = {};
        const weights: Record<string, HostTensor> = {};
        leaves.forEach((n, i) => {
          (n.kind === 'input' ? inputs : weights)[n.name] = data[i]!;
        });
        return { graph, bindings, inputs, weights };
      });
    });
  });
}

/** Symbols a graph's types mention (helper for tests choosing bindings). */
export function graphSymbols(g: Graph): string[] {
  return [...new Set(g.values.flatMap((v) => v.type.shape.flatMap(dimSymbols)))].sort();
}

/** A random graph with data and a binding-time stage for each leaf (`arbStagedGraph`). */
export interface StagedGraph {
  readonly data: GraphWithData;
  /** One stage in [0, top] per leaf: the graph's inputs, then its parameters. */
  readonly stages: number[];
}

/**
 * Random graphs of at most `maxNodes` nodes with data (no `randomUniform`: outputs of random ops are
 * not comparable across graphs that draw a different number of times), each leaf given a random
 * stage in [0, `top`]: the cases of the staging and specialization properties.
 */
export function arbStagedGraph(opts: { readonly maxNodes: number; readonly top: number }): fc.Arbitrary<StagedGraph> {
  const ops = GRAPH_OPS.filter((k) => k !== 'randomUniform');
  return arbGraphWithData({ maxNodes: opts.maxNodes, ops }).chain((data) => {
    const leaves = graphInputs(data.graph).length + graphParams(data.graph).length;
    return fc.record({ data: fc.constant(data), stages: fc.array(fc.nat(opts.top), { minLength: leaves, maxLength: leaves }) });
  });
}
