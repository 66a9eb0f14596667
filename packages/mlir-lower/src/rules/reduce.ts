import { type DType, type Dim, type OpKey, type TensorType, dimProduct, isFloatDType, normalizeAxis } from '@stageml/ir';
import { type FunctionEmitter, type ValueRef, identityMap } from '../emitter.js';
import { reshapeValue } from '../reshape.js';
import type { MlirRuleFn } from '../rule.js';
import { indexTo, scalarBinary, scalarCompare, scalarIsNan, scalarSelect, scalarUnary } from '../scalar.js';
import { elementType } from '../types.js';
import { mapElementwise } from './elementwise.js';

/** The identity of `max` in a dtype: −∞ for floats, the smallest integer otherwise. */
export function lowest(dtype: DType): number {
  switch (dtype) {
    case 'i64':
      return -(2 ** 63);
    case 'i32':
      return -(2 ** 31);
    case 'i8':
      return -128;
    case 'u8':
    case 'bool':
      return 0;
    case 'f64':
    case 'f32':
    case 'f16':
    case 'bf16':
      return Number.NEGATIVE_INFINITY;
  }
}

/** Sorted, normalized reduction axes (empty means every axis, as the IR defines). */
export function reductionAxes(axes: readonly number[], rank: number): number[] {
  if (axes.length === 0) return Array.from({ length: rank }, (_, i) => i);
  return [...new Set(axes.map((a) => normalizeAxis(a, rank)))].sort((a, b) => a - b);
}

/**
 * acc = fold(combine, init, x) over `axes`: one `linalg.generic` with reduction iterators on those
 * loops, writing a tensor without the reduced dims (keepDims is a reshape afterwards, so output maps
 * stay projected permutations).
 */
export function reduceAxes(e: FunctionEmitter, x: ValueRef, axes: readonly number[], init: number, combine: (acc: string, v: string) => string, hint: string): ValueRef {
  const rank = x.type.shape.length;
  const keep = identityMap(rank).filter((_, i) => !axes.includes(i));
  const out: TensorType = { dtype: x.type.dtype, shape: x.type.shape.filter((_, i) => !axes.includes(i)) };
  return e.generic(
    {
      loops: rank,
      reductions: axes,
      ins: [{ value: x, map: identityMap(rank) }],
      outs: [{ value: e.filled(out, init, `${hint}_init`), map: keep }],
      body: ([v, acc]) => [combine(acc!, v!)],
    },
    hint,
  )[0]!;
}

/** A dim as a float scalar of `dtype` (a constant when static). */
export function dimAsFloat(e: FunctionEmitter, d: Dim, dtype: DType): string {
  if (typeof d === 'number') return e.constant(dtype, d);
  const i = e.let(`arith.index_cast ${e.dim(d)} : index to i64`);
  return e.let(`arith.sitofp ${i} : i64 to ${elementType(dtype)}`);
}

function reductionRule(kind: 'sum' | 'mean' | 'max'): MlirRuleFn<OpKey> {
  return (ctx) => {
    const { e, operands, results, names } = ctx;
    const attrs = ctx.attrs as { axes: readonly number[]; keepDims: boolean };
    const x = operands[0]!;
    const dtype = x.type.dtype;
    const name = names[0]!;
    const axes = reductionAxes(attrs.axes, x.type.shape.length);
    const op = kind === 'max' ? 'maximum' : 'add';
    let r = reduceAxes(e, x, axes, kind === 'max' ? lowest(dtype) : 0, (acc, v) => scalarBinary(e, op, dtype, acc, v), kind === 'sum' || kind === 'max' ? name : `${name}_sum`);
    if (kind === 'mean') {
      const n = dimAsFloat(e, dimProduct(axes.map((a) => x.type.shape[a]!)), dtype);
      r = mapElementwise(e, [r], r.type, name, ([s]) => scalarBinary(e, 'div', dtype, s!, n));
    }
    return [reshapeValue(e, r, results[0]!, name)];
  };
}

/** y = Σ over axes. */
export const sumRule = reductionRule('sum');
/** y = mean over axes (a sum, then a division by the element count, dynamic when symbolic). */
export const meanRule = reductionRule('mean');
/** y = max over axes (`arith.maximumf`: NaN propagates; empty gives −∞). */
export const maxRule = reductionRule('max');

/**
 * y = index of the first maximum along an axis: a reduction carrying (value, index) in two
 * outputs; a later element wins only when strictly greater, or when it is NaN and the running
 * maximum is not (NaN counts as the maximum, the first one wins).
 */
export const argmaxRule: MlirRuleFn<'argmax'> = ({ e, attrs, operands, results, names }) => {
  const x = operands[0]!;
  const dtype = x.type.dtype;
  const rank = x.type.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const name = names[0]!;
  const shape = x.type.shape.filter((_, i) => i !== axis);
  const keep = identityMap(rank).filter((_, i) => i !== axis);
  const [, idx] = e.generic(
    {
      loops: rank,
      reductions: [axis],
      ins: [{ value: x, map: identityMap(rank) }],
      outs: [
        { value: e.filled({ dtype, shape }, lowest(dtype), `${name}_best`), map: keep },
        { value: e.filled({ dtype: 'i64', shape }, 0, `${name}_init`), map: keep },
      ],
      body: ([v, best, at]) => {
        let take = scalarCompare(e, 'greater', dtype, v!, best!);
        if (isFloatDType(dtype)) {
          const vNan = scalarIsNan(e, dtype, v!);
          const bestNan = scalarIsNan(e, dtype, best!);
          const bestOk = e.let(`arith.xori ${bestNan}, ${e.constant('bool', 1)} : i1`);
          const nanWins = e.let(`arith.andi ${vNan}, ${bestOk} : i1`);
          take = e.let(`arith.ori ${take}, ${nanWins} : i1`);
        }
        const j = indexTo(e, 'i64', e.let(`linalg.index ${String(axis)} : index`));
        return [scalarSelect(e, take, v!, best!, dtype), scalarSelect(e, take, j, at!, 'i64')];
      },
    },
    `${name}_argmax`,
  ) as [ValueRef, ValueRef];
  return [reshapeValue(e, idx, results[0]!, name)];
};

/**
 * softmax along one axis, numerically stable: m = max, e = exp(x − m), y = e / Σe (four generics;
 * a fully masked row, m = −∞, gives NaN as the reference does).
 */
export function softmaxAlong(e: FunctionEmitter, x: ValueRef, axis: number, hint: string): ValueRef {
  const dtype = x.type.dtype;
  const rank = x.type.shape.length;
  const m = reduceAxes(e, x, [axis], lowest(dtype), (acc, v) => scalarBinary(e, 'maximum', dtype, acc, v), `${hint}_max`);
  const keep = identityMap(rank).filter((_, i) => i !== axis);
  const exps = e.generic(
    {
      loops: rank,
      ins: [
        { value: x, map: identityMap(rank) },
        { value: m, map: keep },
      ],
      outs: [{ value: e.empty(x.type, `${hint}_exp_init`), map: identityMap(rank) }],
      body: ([v, mv]) => [scalarUnary(e, 'exp', dtype, scalarBinary(e, 'sub', dtype, v!, mv!))],
    },
    `${hint}_exp`,
  )[0]!;
  const total = reduceAxes(e, exps, [axis], 0, (acc, v) => scalarBinary(e, 'add', dtype, acc, v), `${hint}_sum`);
  return e.generic(
    {
      loops: rank,
      ins: [
        { value: exps, map: identityMap(rank) },
        { value: total, map: keep },
      ],
      outs: [{ value: e.empty(x.type, `${hint}_init`), map: identityMap(rank) }],
      body: ([v, s]) => [scalarBinary(e, 'div', dtype, v!, s!)],
    },
    hint,
  )[0]!;
}

/** y = softmax(x) along an axis. */
export const softmaxRule: MlirRuleFn<'softmax'> = ({ e, attrs, operands, names }) => {
  const x = operands[0]!;
  return [softmaxAlong(e, x, normalizeAxis(attrs.axis, x.type.shape.length), names[0]!)];
};

/**
 * Normalization over the last axis: y = (x − μ)·(1/√(σ² + ε))·w + b, with μ = 0 and σ² = mean(x²)
 * for RMSNorm. One reduction for the mean (layerNorm only), one for the mean square, one generic
 * for the output.
 */
function normRule(centered: boolean): MlirRuleFn<OpKey> {
  return (ctx) => {
    const { e, operands, names } = ctx;
    const eps = (ctx.attrs as { eps: number }).eps;
    const [x, w, b] = operands as [ValueRef, ValueRef | undefined, ValueRef | undefined];
    const dtype = x.type.dtype;
    const rank = x.type.shape.length;
    const name = names[0]!;
    const last = rank - 1;
    const rows = identityMap(rank).slice(0, last);
    const n = dimAsFloat(e, x.type.shape[last]!, dtype);
    let mu: ValueRef | undefined;
    if (centered) {
      const s = reduceAxes(e, x, [last], 0, (acc, v) => scalarBinary(e, 'add', dtype, acc, v), `${name}_sum`);
      mu = mapElementwise(e, [s], s.type, `${name}_mean`, ([v]) => scalarBinary(e, 'div', dtype, v!, n));
    }
    const centeredIns = mu === undefined ? [{ value: x, map: identityMap(rank) }] : [{ value: x, map: identityMap(rank) }, { value: mu, map: rows }];
    const center = (v: string, m: string | undefined): string => (m === undefined ? v : scalarBinary(e, 'sub', dtype, v, m));
    const sq = e.generic(
      {
        loops: rank,
        reductions: [last],
        ins: centeredIns,
        outs: [{ value: e.filled({ dtype, shape: x.type.shape.slice(0, last) }, 0, `${name}_sq_init`), map: rows }],
        body: (args) => {
          const c = center(args[0]!, mu === undefined ? undefined : args[1]);
          return [scalarBinary(e, 'add', dtype, args[args.length - 1]!, scalarBinary(e, 'mul', dtype, c, c))];
        },
      },
      `${name}_sq`,
    )[0]!;
    const params = [w, b].filter((p): p is ValueRef => p !== undefined).map((p) => ({ value: p, map: [`d${String(last)}`] }));
    return e.generic(
      {
        loops: rank,
        ins: [...centeredIns, { value: sq, map: rows }, ...params],
        outs: [{ value: e.empty(x.type, `${name}_init`), map: identityMap(rank) }],
        body: (args) => {
          const off = mu === undefined ? 1 : 2;
          const c = center(args[0]!, mu === undefined ? undefined : args[1]);
          const variance = scalarBinary(e, 'div', dtype, args[off]!, n);
          const root = scalarUnary(e, 'sqrt', dtype, scalarBinary(e, 'add', dtype, variance, e.constant(dtype, eps)));
          let y = scalarBinary(e, 'mul', dtype, c, scalarBinary(e, 'div', dtype, e.constant(dtype, 1), root));
          if (w !== undefined) y = scalarBinary(e, 'mul', dtype, y, args[off + 1]!);
          if (b !== undefined) y = scalarBinary(e, 'add', dtype, y, args[off + (w === undefined ? 1 : 2)]!);
          return [y];
        },
      },
      name,
    );
  };
}

/** y = x / √(mean(x²) + ε) · w over the last axis. */
export const rmsNormRule = normRule(false);
/** y = (x − mean) / √(var + ε) · w + b over the last axis. */
export const layerNormRule = normRule(true);
