import { type DType, type TensorData, allocData, rounderFor } from './dtype.js';
import { IrCode, IrError } from './errors.js';

/**
 * A concrete tensor in host memory: the reference interpreter's value, and the exchange format
 * between weight stores, executors and tests. Row-major, contiguous.
 */
export interface HostTensor {
  /** Element type. */
  readonly dtype: DType;
  /** Concrete dims, outermost first. */
  readonly shape: readonly number[];
  /** Row-major elements in the dtype's host storage (see `allocData`). */
  readonly data: TensorData;
}

/** Product of a concrete shape. */
export function sizeOf(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** Row-major strides of a concrete shape. */
export function stridesOf(shape: readonly number[]): number[] {
  const st = new Array<number>(shape.length);
  let acc = 1;
  for (let i = shape.length - 1; i >= 0; i--) {
    st[i] = acc;
    acc *= shape[i]!;
  }
  return st;
}

/** A zero-filled tensor. */
export function zeros(dtype: DType, shape: readonly number[]): HostTensor {
  return { dtype, shape: [...shape], data: allocData(dtype, sizeOf(shape)) };
}

/**
 * A tensor from numbers (rounded to `dtype`). Throws `IR_BINDING_MISMATCH` when the count does
 * not match the shape.
 */
export function hostTensor(dtype: DType, shape: readonly number[], values: ArrayLike<number>): HostTensor {
  const n = sizeOf(shape);
  if (values.length !== n) {
    throw new IrError(
      IrCode.BINDING_MISMATCH,
      `tensor of shape [${shape.join(', ')}] needs ${String(n)} values, got ${String(values.length)}`,
    );
  }
  const data = allocData(dtype, n);
  const round = rounderFor(dtype);
  for (let i = 0; i < n; i++) data[i] = round(values[i]!);
  return { dtype, shape: [...shape], data };
}

/** A scalar tensor. */
export function scalar(dtype: DType, value: number): HostTensor {
  return hostTensor(dtype, [], [value]);
}

/** Copies a tensor's elements into a plain array (for tests and printing). */
export function toArray(t: HostTensor): number[] {
  return Array.from(t.data);
}

/**
 * Strides of `shape` broadcast to `outShape` (NumPy rules): 0 for stretched or missing leading
 * dims.
 */
export function broadcastStrides(shape: readonly number[], outShape: readonly number[]): number[] {
  const st = stridesOf(shape);
  const out = new Array<number>(outShape.length).fill(0);
  const off = outShape.length - shape.length;
  for (let i = 0; i < shape.length; i++) out[off + i] = shape[i] === 1 ? 0 : st[i]!;
  return out;
}

/**
 * Calls `f(outIndex, offsets)` for each element of `outShape` in row-major order, where
 * `offsets[k]` is the flat index into operand k under the given strides. The offsets array is
 * reused between calls.
 */
export function forEachIndex(
  outShape: readonly number[],
  operandStrides: readonly (readonly number[])[],
  f: (i: number, offsets: Int32Array | Float64Array) => void,
): void {
  const rank = outShape.length;
  const n = sizeOf(outShape);
  const k = operandStrides.length;
  const offsets = new Float64Array(k);
  const counter = new Array<number>(rank).fill(0);
  for (let i = 0; i < n; i++) {
    f(i, offsets);
    for (let ax = rank - 1; ax >= 0; ax--) {
      counter[ax]!++;
      for (let j = 0; j < k; j++) offsets[j]! += operandStrides[j]![ax]!;
      if (counter[ax]! < outShape[ax]!) break;
      for (let j = 0; j < k; j++) offsets[j]! -= operandStrides[j]![ax]! * outShape[ax]!;
      counter[ax] = 0;
    }
  }
}
