import { attr } from '../attrs.js';
import { type Dim, dimEquals, dimToString, isStaticDim } from '../dim.js';
import { allocData, rounderFor } from '../dtype.js';
import { IrCode, IrError } from '../errors.js';
import { defineOp, evalError, shapeError } from '../op-def.js';
import { type HostTensor, sizeOf } from '../tensor.js';
import { normalizeAxis, numElements, shapeToString } from '../types.js';
import { requireIndex, requireNumeric, requireRank, sameDType, splitAt } from './common.js';

function checkIndex(op: string, v: number, size: number): number {
  if (!Number.isInteger(v) || v < 0 || v >= size) evalError(op, `index ${String(v)} is out of range [0, ${String(size)})`);
  return v;
}

/** y = literal values. */
export const constant = defineOp({
  key: 'constant',
  summary: 'A small literal tensor (row-major values, or one value splatted over a static shape).',
  semantics: 'y = value (splatted when one value is given)',
  operands: [],
  attrs: { value: attr.floats({}), shape: attr.dims({ default: [] }), dtype: attr.dtype({ default: 'f32' }) },
  traits: ['constant-like'],
  infer: (_ops, a) => {
    for (const d of a.shape) {
      if (!isStaticDim(d) || d < 0) throw new IrError(IrCode.BAD_ATTR, 'constant: shape must be static and non-negative');
    }
    const n = sizeOf(a.shape as number[]);
    if (a.value.length !== n && a.value.length !== 1) {
      throw new IrError(IrCode.BAD_ATTR, `constant: ${String(a.value.length)} values for shape ${shapeToString(a.shape)}`);
    }
    return [{ dtype: a.dtype, shape: a.shape }];
  },
  evaluate: (_ops, a) => {
    const shape = a.shape as number[];
    const n = sizeOf(shape);
    const data = allocData(a.dtype, n);
    const round = rounderFor(a.dtype);
    for (let i = 0; i < n; i++) data[i] = round(a.value.length === 1 ? a.value[0]! : a.value[i]!);
    return [{ dtype: a.dtype, shape, data }];
  },
});

/** y[i…] = i[axis]. */
export const iota = defineOp({
  key: 'iota',
  summary: 'Indices along one axis of a (possibly symbolic) shape: positions, ranges.',
  semantics: 'y[i₀, …, i_{r−1}] = i_axis',
  operands: [],
  attrs: { shape: attr.dims({}), axis: attr.int({ default: 0 }), dtype: attr.dtype({ default: 'i64' }) },
  traits: ['constant-like'],
  infer: (_ops, a) => {
    normalizeAxis(a.axis, a.shape.length);
    for (const d of a.shape) if (typeof d === 'number' && d < 0) throw new IrError(IrCode.BAD_ATTR, 'iota: negative dim');
    if (a.dtype === 'bool') throw new IrError(IrCode.BAD_ATTR, 'iota: dtype must be numeric, not bool');
    return [{ dtype: a.dtype, shape: a.shape }];
  },
  evaluate: (_ops, a) => {
    const shape = a.shape as number[];
    const axis = normalizeAxis(a.axis, shape.length);
    const { outer, size, inner } = splitAt(shape, axis);
    const data = allocData(a.dtype, sizeOf(shape));
    const round = rounderFor(a.dtype);
    for (let o = 0; o < outer; o++) for (let j = 0; j < size; j++) data.fill(round(j), (o * size + j) * inner, (o * size + j + 1) * inner);
    return [{ dtype: a.dtype, shape, data }];
  },
});

/** y = take(table, indices, axis) (embedding lookup at axis 0). */
export const gather = defineOp({
  key: 'gather',
  summary: 'Takes slices of a table at integer indices along one axis (NumPy take; embedding lookup at axis 0).',
  semantics: 'y[a…, i…, b…] = table[a…, indices[i…], b…]',
  operands: ['table', 'indices'],
  attrs: { axis: attr.int({ default: 0 }) },
  infer: ([t, idx], a) => {
    requireIndex('gather', idx!);
    requireRank('gather', t!, 1, 'table');
    const axis = normalizeAxis(a.axis, t!.shape.length);
    return [{ dtype: t!.dtype, shape: [...t!.shape.slice(0, axis), ...idx!.shape, ...t!.shape.slice(axis + 1)] }];
  },
  evaluate: ([t, idx], a) => {
    const axis = normalizeAxis(a.axis, t!.shape.length);
    const { outer, size, inner } = splitAt(t!.shape, axis);
    const n = idx!.data.length;
    const shape = [...t!.shape.slice(0, axis), ...idx!.shape, ...t!.shape.slice(axis + 1)];
    const out = allocData(t!.dtype, outer * n * inner);
    for (let o = 0; o < outer; o++) {
      for (let j = 0; j < n; j++) {
        const row = checkIndex('gather', idx!.data[j]!, size);
        const src = (o * size + row) * inner;
        out.set(t!.data.subarray(src, src + inner), (o * n + j) * inner);
      }
    }
    return [{ dtype: t!.dtype, shape, data: out }];
  },
});

/** y = x with axis restricted to the listed indices. */
export const indexSelect = defineOp({
  key: 'indexSelect',
  summary: 'Selects entries along one axis by a 1-D index tensor (torch.index_select).',
  semantics: 'y[…, j, …] = x[…, index[j], …] along axis',
  operands: ['x', 'index'],
  attrs: { axis: attr.int({ default: 0 }) },
  infer: ([x, idx], a) => {
    requireIndex('indexSelect', idx!, 'index');
    if (idx!.shape.length !== 1) shapeError('indexSelect', `index must be 1-D, got ${shapeToString(idx!.shape)}`);
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const shape = [...x!.shape];
    shape[axis] = idx!.shape[0]!;
    return [{ dtype: x!.dtype, shape }];
  },
  evaluate: ([x, idx], a) => {
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const { outer, size, inner } = splitAt(x!.shape, axis);
    const n = idx!.data.length;
    const shape = [...x!.shape];
    shape[axis] = n;
    const out = allocData(x!.dtype, outer * n * inner);
    for (let o = 0; o < outer; o++) {
      for (let j = 0; j < n; j++) {
        const src = (o * size + checkIndex('indexSelect', idx!.data[j]!, size)) * inner;
        out.set(x!.data.subarray(src, src + inner), (o * n + j) * inner);
      }
    }
    return [{ dtype: x!.dtype, shape, data: out }];
  },
});

/** y = x; y[…, index[j], …] += updates[…, j, …] (torch.index_add). */
export const scatterAdd = defineOp({
  key: 'scatterAdd',
  summary: 'Adds slices of updates into a copy of x at 1-D indices along one axis; repeated indices accumulate (torch.index_add).',
  semantics: 'y = x; y[…, index[j], …] += updates[…, j, …] for each j',
  operands: ['x', 'index', 'updates'],
  attrs: { axis: attr.int({ default: 0 }) },
  infer: ([x, idx, up], a) => {
    sameDType('scatterAdd', [x!, up!]);
    requireNumeric('scatterAdd', x!);
    requireIndex('scatterAdd', idx!, 'index');
    if (idx!.shape.length !== 1) shapeError('scatterAdd', `index must be 1-D, got ${shapeToString(idx!.shape)}`);
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const want: Dim[] = [...x!.shape];
    want[axis] = idx!.shape[0]!;
    if (up!.shape.length !== want.length || !up!.shape.every((d, i) => dimEquals(d, want[i]!))) {
      shapeError('scatterAdd', `updates must be ${shapeToString(want)}, got ${shapeToString(up!.shape)}`);
    }
    return [x!];
  },
  flops: ([, , up]) => numElements(up!),
  evaluate: ([x, idx, up], a) => {
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const { outer, size, inner } = splitAt(x!.shape, axis);
    const n = idx!.data.length;
    const acc = Float64Array.from(x!.data);
    for (let o = 0; o < outer; o++) {
      for (let j = 0; j < n; j++) {
        const dst = (o * size + checkIndex('scatterAdd', idx!.data[j]!, size)) * inner;
        const src = (o * n + j) * inner;
        for (let i = 0; i < inner; i++) acc[dst + i]! += up!.data[src + i]!;
      }
    }
    const out = allocData(x!.dtype, acc.length);
    const round = rounderFor(x!.dtype);
    for (let i = 0; i < acc.length; i++) out[i] = round(acc[i]!);
    return [{ dtype: x!.dtype, shape: [...x!.shape], data: out }];
  },
});

/** (values, indices) = the k largest (or smallest) entries along an axis. */
export const topk = defineOp({
  key: 'topk',
  summary: 'The k largest (or smallest) entries along an axis, sorted, with their i64 indices; ties keep the lower index first.',
  semantics: 'values, indices = sort_desc(x)[:k] along axis',
  operands: ['x'],
  attrs: { k: attr.int({ min: 0 }), axis: attr.int({ default: -1 }), largest: attr.bool({ default: true }) },
  results: 2,
  infer: ([x], a) => {
    requireRank('topk', x!, 1);
    requireNumeric('topk', x!);
    const axis = normalizeAxis(a.axis, x!.shape.length);
    const size = x!.shape[axis]!;
    if (typeof size === 'number' && a.k > size) shapeError('topk', `k=${String(a.k)} exceeds axis size ${dimToString(size)}`);
    const shape = [...x!.shape];
    shape[axis] = a.k;
    return [
      { dtype: x!.dtype, shape },
      { dtype: 'i64', shape },
    ];
  },
  flops: (ops) => numElements(ops[0]!),
  evaluate: ([x], a) => evalTopk(x!, a.k, normalizeAxis(a.axis, x!.shape.length), a.largest),
});

function evalTopk(x: HostTensor, k: number, axis: number, largest: boolean): HostTensor[] {
  const { outer, size, inner } = splitAt(x.shape, axis);
  if (k > size) evalError('topk', `k=${String(k)} exceeds axis size ${String(size)}`);
  const shape = [...x.shape];
  shape[axis] = k;
  const vals = allocData(x.dtype, outer * k * inner);
  const idxs = new Float64Array(outer * k * inner);
  const order = Array.from({ length: size }, (_, i) => i);
  const key = new Float64Array(size);
  const nan = new Uint8Array(size);
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < inner; i++) {
      for (let j = 0; j < size; j++) {
        const v = x.data[(o * size + j) * inner + i]!;
        // NaN sorts as the largest value, above +∞, as in torch.topk.
        key[j] = Number.isNaN(v) ? Number.POSITIVE_INFINITY : v;
        nan[j] = Number.isNaN(v) ? 1 : 0;
      }
      for (let j = 0; j < size; j++) order[j] = j;
      order.sort((p, q) => (largest ? key[q]! - key[p]! || nan[q]! - nan[p]! : key[p]! - key[q]! || nan[p]! - nan[q]!) || p - q);
      for (let j = 0; j < k; j++) {
        const src = order[j]!;
        vals[(o * k + j) * inner + i] = x.data[(o * size + src) * inner + i]!;
        idxs[(o * k + j) * inner + i] = src;
      }
    }
  }
  return [
    { dtype: x.dtype, shape, data: vals },
    { dtype: 'i64', shape, data: idxs },
  ];
}
