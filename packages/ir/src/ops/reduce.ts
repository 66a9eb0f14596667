import { attr } from '../attrs.js';
import { dimEquals, dimToString } from '../dim.js';
import { type DType, allocData, rounderFor } from '../dtype.js';
import { defineOp, dtypeError, shapeError } from '../op-def.js';
import { type HostTensor, forEachIndex, sizeOf, stridesOf } from '../tensor.js';
import { type TensorType, normalizeAxis, numElements, shapeToString } from '../types.js';
import { normalizeAxes, perElementFlops, requireFloat, requireNumeric, requireRank, sameDType, splitAt } from './common.js';

function reducedShape<D>(shape: readonly D[], axes: readonly number[], keepDims: boolean, one: D): D[] {
  const out: D[] = [];
  shape.forEach((d, i) => {
    if (!axes.includes(i)) out.push(d);
    else if (keepDims) out.push(one);
  });
  return out;
}

type Combine = (acc: number, v: number) => number;

function evalReduce(
  x: HostTensor,
  axesIn: readonly number[],
  keepDims: boolean,
  init: number,
  combine: Combine,
  finish: (acc: number, count: number) => number,
): HostTensor {
  const axes = normalizeAxes(axesIn, x.shape.length);
  const outShape = reducedShape(x.shape, axes, keepDims, 1);
  const full = reducedShape(x.shape, axes, true, 1);
  const nOut = sizeOf(outShape);
  const acc = new Float64Array(nOut).fill(init);
  const outStrides = stridesOf(full).map((s, i) => (axes.includes(i) ? 0 : s));
  const xd = x.data;
  forEachIndex(x.shape, [outStrides], (i, offs) => {
    const o = offs[0]!;
    acc[o] = combine(acc[o]!, xd[i]!);
  });
  const count = sizeOf(axes.map((a) => x.shape[a]!));
  const data = allocData(x.dtype, nOut);
  const round = rounderFor(x.dtype);
  for (let i = 0; i < nOut; i++) data[i] = round(finish(acc[i]!, count));
  return { dtype: x.dtype, shape: outShape, data };
}

function reduction<const K extends string>(
  key: K,
  summary: string,
  semantics: string,
  init: number,
  combine: Combine,
  finish: (acc: number, count: number) => number,
  floatOnly: boolean,
) {
  return defineOp({
    key,
    summary,
    semantics,
    operands: ['x'],
    attrs: { axes: attr.ints({ default: [] }), keepDims: attr.bool({ default: false }) },
    traits: ['reduction'],
    infer: ([x], a) => {
      if (floatOnly) requireFloat(key, x!);
      if (x!.dtype === 'bool') dtypeError(key, 'does not take bool; cast first');
      const axes = normalizeAxes(a.axes, x!.shape.length);
      return [{ dtype: x!.dtype, shape: reducedShape(x!.shape, axes, a.keepDims, 1) }];
    },
    flops: (ops) => numElements(ops[0]!),
    evaluate: ([x], a) => [evalReduce(x!, a.axes, a.keepDims, init, combine, finish)],
  });
}

/** y = Σ over axes. */
export const sum = reduction(
  'sum',
  'Sum over the given axes (all axes when empty).',
  'y = Σ_{axes} x',
  0,
  (a, v) => a + v,
  (a) => a,
  false,
);
/** y = mean over axes. */
export const mean = reduction(
  'mean',
  'Arithmetic mean over the given axes (all axes when empty).',
  'y = (1/n) Σ_{axes} x',
  0,
  (a, v) => a + v,
  (a, n) => a / n,
  true,
);
/** y = max over axes. */
export const max = reduction(
  'max',
  'Maximum over the given axes (all axes when empty); NaN propagates, empty gives −∞.',
  'y = max_{axes} x',
  Number.NEGATIVE_INFINITY,
  (a, v) => (Number.isNaN(a) || Number.isNaN(v) ? Number.NaN : a > v ? a : v),
  (a) => a,
  false,
);

/** y = index of the first maximum along an axis. */
export const argmax = defineOp({
  key: 'argmax',
  summary: 'Index (i64) of the first maximum along one axis; NaN counts as the maximum.',
  semantics: 'y = min{ i : x[i] = max x } along axis',
  operands: ['x'],
  attrs: { axis: attr.int({ default: -1 }), keepDims: attr.bool({ default: false }) },
  traits: ['reduction'],
  infer: ([x], a) => {
    requireRank('argmax', x!, 1);
    requireNumeric('argmax', x!);
    const axis = normalizeAxis(a.axis, x!.shape.length);
    if (dimEquals(x!.shape[axis]!, 0)) shapeError('argmax', 'axis has size 0');
    return [{ dtype: 'i64', shape: reducedShape(x!.shape, [axis], a.keepDims, 1) }];
  },
  flops: (ops) => numElements(ops[0]!),
  evaluate: ([x], a) => {
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const { outer, size, inner } = splitAt(x!.shape, axis);
    const out = new Float64Array(outer * inner);
    const xd = x!.data;
    for (let o = 0; o < outer; o++) {
      for (let i = 0; i < inner; i++) {
        let best = 0;
        let bestV = xd[o * size * inner + i]!;
        for (let j = 1; j < size && !Number.isNaN(bestV); j++) {
          const v = xd[(o * size + j) * inner + i]!;
          if (v > bestV || Number.isNaN(v)) {
            best = j;
            bestV = v;
          }
        }
        out[o * inner + i] = best;
      }
    }
    return [{ dtype: 'i64', shape: reducedShape(x!.shape, [axis], a.keepDims, 1), data: out }];
  },
});

/** y = softmax along an axis. */
export const softmax = defineOp({
  key: 'softmax',
  summary: 'Numerically stable softmax along one axis.',
  semantics: 'y_i = exp(x_i − max x) / Σ_j exp(x_j − max x) along axis',
  operands: ['x'],
  attrs: { axis: attr.int({ default: -1 }) },
  infer: ([x], a) => {
    requireFloat('softmax', x!);
    requireRank('softmax', x!, 1);
    normalizeAxis(a.axis, x!.shape.length);
    return [x!];
  },
  flops: perElementFlops(5),
  evaluate: ([x], a) => [softmaxHost(x!, normalizeAxis(a.axis, x!.shape.length))],
});

/** Softmax of a host tensor along `axis` (shared with attention). */
export function softmaxHost(x: HostTensor, axis: number): HostTensor {
  const { outer, size, inner } = splitAt(x.shape, axis);
  const out = allocData(x.dtype, x.data.length);
  const round = rounderFor(x.dtype);
  const xd = x.data;
  const tmp = new Float64Array(size);
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < inner; i++) {
      let m = Number.NEGATIVE_INFINITY;
      for (let j = 0; j < size; j++) m = Math.max(m, xd[(o * size + j) * inner + i]!);
      let total = 0;
      for (let j = 0; j < size; j++) {
        const e = m === Number.NEGATIVE_INFINITY ? Number.NaN : Math.exp(xd[(o * size + j) * inner + i]! - m);
        tmp[j] = e;
        total += e;
      }
      for (let j = 0; j < size; j++) out[(o * size + j) * inner + i] = round(tmp[j]! / total);
    }
  }
  return { dtype: x.dtype, shape: [...x.shape], data: out };
}

function checkNormParam(op: string, x: TensorType, p: TensorType | undefined, what: string): void {
  if (p === undefined) return;
  const last = x.shape[x.shape.length - 1]!;
  if (p.shape.length !== 1 || !dimEquals(p.shape[0]!, last)) {
    shapeError(op, `${what} must be [${dimToString(last)}], got ${shapeToString(p.shape)}`);
  }
}

function evalNorm(
  x: HostTensor,
  weight: HostTensor | undefined,
  bias: HostTensor | undefined,
  eps: number,
  centered: boolean,
  dtype: DType,
): HostTensor {
  const d = x.shape[x.shape.length - 1] ?? 1;
  const rows = d === 0 ? 0 : x.data.length / d;
  const out = allocData(dtype, x.data.length);
  const round = rounderFor(dtype);
  const xd = x.data;
  for (let r = 0; r < rows; r++) {
    const base = r * d;
    let mu = 0;
    if (centered) {
      for (let i = 0; i < d; i++) mu += xd[base + i]!;
      mu /= d;
    }
    let ss = 0;
    for (let i = 0; i < d; i++) {
      const c = xd[base + i]! - mu;
      ss += c * c;
    }
    const inv = 1 / Math.sqrt(ss / d + eps);
    for (let i = 0; i < d; i++) {
      let v = (xd[base + i]! - mu) * inv;
      if (weight !== undefined) v *= weight.data[i]!;
      if (bias !== undefined) v += bias.data[i]!;
      out[base + i] = round(v);
    }
  }
  return { dtype, shape: [...x.shape], data: out };
}

/** y = x / √(mean(x²) + ε) · w over the last axis. */
export const rmsNorm = defineOp({
  key: 'rmsNorm',
  summary: 'Root-mean-square normalization over the last axis with an optional per-channel weight (Llama).',
  semantics: 'y = x / √(mean_{last}(x²) + ε) · w',
  operands: ['x', 'weight?'],
  attrs: { eps: attr.float({ default: 1e-6 }) },
  infer: ([x, w]) => {
    requireFloat('rmsNorm', x!);
    requireRank('rmsNorm', x!, 1);
    sameDType('rmsNorm', w === undefined ? [x!] : [x!, w]);
    checkNormParam('rmsNorm', x!, w, 'weight');
    return [x!];
  },
  flops: perElementFlops(4),
  evaluate: ([x, w], a) => [evalNorm(x!, w, undefined, a.eps, false, x!.dtype)],
  decompose: (b, [x, w], a) => {
    const ms = b.mean(b.mul(x!, x!), [x!.type.shape.length - 1], true);
    const y = b.mul(x!, b.rsqrt(b.add(ms, b.scalar(a.eps, x!.type.dtype))));
    return [w === undefined ? y : b.mul(y, w)];
  },
});

/** y = (x − μ) / √(σ² + ε) · w + b over the last axis. */
export const layerNorm = defineOp({
  key: 'layerNorm',
  summary: 'Layer normalization over the last axis with optional weight and bias.',
  semantics: 'y = (x − mean(x)) / √(var(x) + ε) · w + b',
  operands: ['x', 'weight?', 'bias?'],
  attrs: { eps: attr.float({ default: 1e-5 }) },
  infer: ([x, w, b]) => {
    requireFloat('layerNorm', x!);
    requireRank('layerNorm', x!, 1);
    sameDType('layerNorm', [x!, ...(w === undefined ? [] : [w]), ...(b === undefined ? [] : [b])]);
    checkNormParam('layerNorm', x!, w, 'weight');
    checkNormParam('layerNorm', x!, b, 'bias');
    return [x!];
  },
  flops: perElementFlops(7),
  evaluate: ([x, w, b], a) => [evalNorm(x!, w, b, a.eps, true, x!.dtype)],
});
