import type { DType, FloatDType, HostTensor } from '@stageml/ir';
import { TensorProto_DataType as T } from 'onnx-buf';

/** An ONNX element type (`TensorProto.DataType`). */
export type ElemType = T;

/** ONNX element types, re-exported for rules and executors. */
export const ElemType = T;

/** The element types IR values are computed in (see `computeType`). */
export type ComputeElemType = T.FLOAT | T.DOUBLE | T.INT64 | T.INT32 | T.BOOL;

/**
 * The ONNX element type each IR dtype is stored and computed in (its "compute type").
 *
 * NOTE: f16 and bf16 travel as float32 holding values already rounded to the narrow type, and i8/u8
 * as int32 holding in-range values, exactly as `HostTensor` stores them; the lowering rounds or
 * wraps after every op whose result may leave the narrow type. CPU runtimes implement few kernels
 * for f16, bf16, i8 and u8, and none of them differ in results from this scheme.
 */
const COMPUTE: Readonly<Record<DType, ComputeElemType>> = {
  f64: T.DOUBLE,
  f32: T.FLOAT,
  f16: T.FLOAT,
  bf16: T.FLOAT,
  i64: T.INT64,
  i32: T.INT32,
  i8: T.INT32,
  u8: T.INT32,
  bool: T.BOOL,
};

/** The ONNX element type values of `dtype` are computed and exchanged in. */
export function computeType(dtype: DType): ComputeElemType {
  return COMPUTE[dtype];
}

/** The narrow ONNX type a compute type must be rounded or wrapped through for `dtype`, if any. */
export function narrowType(dtype: DType): T | undefined {
  switch (dtype) {
    case 'f16':
      return T.FLOAT16;
    case 'bf16':
      return T.BFLOAT16;
    case 'i8':
      return T.INT8;
    case 'u8':
      return T.UINT8;
    case 'f64':
    case 'f32':
    case 'i64':
    case 'i32':
    case 'bool':
      return undefined;
  }
}

/** Whether `dtype` is a floating-point IR dtype. */
export function isFloat(dtype: DType): dtype is FloatDType {
  return dtype === 'f64' || dtype === 'f32' || dtype === 'f16' || dtype === 'bf16';
}

function bytesOf(a: Float32Array | Float64Array | Int32Array | BigInt64Array | Uint8Array): Uint8Array<ArrayBuffer> {
  return new Uint8Array(a.buffer as ArrayBuffer, a.byteOffset, a.byteLength);
}

/**
 * Numbers as the little-endian bytes of a compute type (FLOAT, DOUBLE, INT64, INT32 or BOOL).
 * Integers are truncated; int64 values must be exact in a double (|x| ≤ 2^53).
 */
export function encodeValues(elemType: ComputeElemType, values: ArrayLike<number>): Uint8Array<ArrayBuffer> {
  const n = values.length;
  switch (elemType) {
    case T.FLOAT:
      return bytesOf(Float32Array.from(values));
    case T.DOUBLE:
      return bytesOf(Float64Array.from(values));
    case T.INT32:
      return bytesOf(Int32Array.from(values, (v) => Math.trunc(v)));
    case T.INT64: {
      const out = new BigInt64Array(n);
      for (let i = 0; i < n; i++) out[i] = BigInt(Math.trunc(values[i]!));
      return bytesOf(out);
    }
    case T.BOOL:
      return bytesOf(Uint8Array.from(values, (v) => (v !== 0 ? 1 : 0)));
  }
}

/**
 * The bytes of a host tensor in its dtype's compute type: a zero-copy view for f64, f32, f16, bf16,
 * i32 and bool storage, a converted copy for i64 (held as doubles on the host) and i8/u8 (widened).
 */
export function hostBytes(t: HostTensor): Uint8Array<ArrayBuffer> {
  const d = t.data;
  switch (t.dtype) {
    case 'f64':
    case 'f32':
    case 'f16':
    case 'bf16':
    case 'i32':
    case 'bool':
      return bytesOf(d as Float32Array | Float64Array | Int32Array | Uint8Array);
    case 'i8':
    case 'u8':
      return bytesOf(Int32Array.from(d));
    case 'i64':
      return encodeValues(T.INT64, d);
  }
}
