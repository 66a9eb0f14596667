import { type DType, isFloatDType, rounderFor, allocData } from '../dtype.js';
import { shapeError, dtypeError } from '../op-def.js';
import { type HostTensor, broadcastStrides, forEachIndex, sizeOf } from '../tensor.js';
import { type TensorType, broadcastShapes, normalizeAxis, numElements } from '../types.js';
import type { Dim } from '../dim.js';
import { dimMul } from '../dim.js';

/** Requires every operand to share one dtype; returns it. */
export function sameDType(op: string, types: readonly TensorType[]): DType {
  const first = types[0]!.dtype;
  for (const t of types) {
    if (t.dtype !== first) dtypeError(op, `operands must share one dtype, got ${types.map((x) => x.dtype).join(', ')}`);
  }
  return first;
}

/** Requires a numeric (non-bool) dtype. */
export function requireNumeric(op: string, t: TensorType, what = 'operand'): void {
  if (t.dtype === 'bool') dtypeError(op, `${what} must be numeric, got bool (cast first)`);
}

/** Requires a floating-point dtype. */
export function requireFloat(op: string, t: TensorType): void {
  if (!isFloatDType(t.dtype)) dtypeError(op, `needs a floating-point operand, got ${t.dtype}`);
}

/** Requires an integer index dtype (i64, i32, i8 or u8). */
export function requireIndex(op: string, t: TensorType, what = 'indices'): void {
  if (t.dtype !== 'i64' && t.dtype !== 'i32' && t.dtype !== 'i8' && t.dtype !== 'u8') {
    dtypeError(op, `${what} must be an integer tensor, got ${t.dtype}`);
  }
}

/** Requires a minimum rank. */
export function requireRank(op: string, t: TensorType, min: number, what = 'operand'): void {
  if (t.shape.length < min) shapeError(op, `${what} must have rank ≥ ${String(min)}, got ${String(t.shape.length)}`);
}

/** Elements of the first result times `perElement`. */
export function perElementFlops(perElement: number): (ops: readonly TensorType[], res: readonly TensorType[]) => Dim {
  return (_ops, res) => dimMul(numElements(res[0]!), perElement);
}

/** Maps a unary function over a tensor, rounding to `outDType`. */
export function mapUnary(x: HostTensor, outDType: DType, f: (v: number) => number): HostTensor {
  const n = x.data.length;
  const out = allocData(outDType, n);
  const round = rounderFor(outDType);
  const src = x.data;
  for (let i = 0; i < n; i++) out[i] = round(f(src[i]!));
  return { dtype: outDType, shape: [...x.shape], data: out };
}

/** Applies an n-ary function with NumPy broadcasting, rounding to `outDType`. */
export function mapBroadcast(
  xs: readonly HostTensor[],
  outDType: DType,
  f: (vals: number[]) => number,
): HostTensor {
  const outShape = broadcastShapes(xs.map((x) => x.shape)) as number[];
  const n = sizeOf(outShape);
  const out = allocData(outDType, n);
  const round = rounderFor(outDType);
  const vals = new Array<number>(xs.length).fill(0);
  const same = xs.every((x) => x.data.length === n && x.shape.length === outShape.length);
  if (same) {
    for (let i = 0; i < n; i++) {
      for (let k = 0; k < xs.length; k++) vals[k] = xs[k]!.data[i]!;
      out[i] = round(f(vals));
    }
  } else {
    const strides = xs.map((x) => broadcastStrides(x.shape, outShape));
    forEachIndex(outShape, strides, (i, offs) => {
      for (let k = 0; k < xs.length; k++) vals[k] = xs[k]!.data[offs[k]!]!;
      out[i] = round(f(vals));
    });
  }
  return { dtype: outDType, shape: outShape, data: out };
}

/** Splits a shape around `axis` into outer count, axis size and inner count. */
export function splitAt(shape: readonly number[], axis: number): { outer: number; size: number; inner: number } {
  return {
    outer: sizeOf(shape.slice(0, axis)),
    size: shape[axis]!,
    inner: sizeOf(shape.slice(axis + 1)),
  };
}

/** Normalizes a list of axes (unique, sorted); an empty list means every axis. */
export function normalizeAxes(axes: readonly number[], rank: number): number[] {
  if (axes.length === 0) return Array.from({ length: rank }, (_, i) => i);
  const out = [...new Set(axes.map((a) => normalizeAxis(a, rank, 'reduction axis')))].sort((a, b) => a - b);
  if (out.length !== axes.length) shapeError('reduce', `axes ${axes.join(', ')} repeat an axis`);
  return out;
}
