import type { DType, HostTensor } from '@stageml/ir';

import type { OrtDataType, OrtModule, OrtTensor } from './binding.js';

/** The onnxruntime data type each IR dtype travels in (see `computeType` of `@stageml/onnx-lower`). */
const ORT_TYPE: Readonly<Record<DType, OrtDataType>> = {
  f64: 'float64',
  f32: 'float32',
  f16: 'float32',
  bf16: 'float32',
  i64: 'int64',
  i32: 'int32',
  i8: 'int32',
  u8: 'int32',
  bool: 'bool',
};

/** The onnxruntime data type values of `dtype` are exchanged in. */
export function ortTypeOf(dtype: DType): OrtDataType {
  return ORT_TYPE[dtype];
}

/**
 * A host tensor as an onnxruntime tensor of its compute type. Float, int32 and bool storage is
 * shared, not copied (f16/bf16 already live in float32 holding rounded values); i64 (doubles on
 * the host) becomes a BigInt64Array and i8/u8 widen to int32.
 */
export function toOrtTensor(ort: OrtModule, t: HostTensor): OrtTensor {
  const dims = t.shape;
  switch (t.dtype) {
    case 'f32':
    case 'f16':
    case 'bf16':
      return new ort.Tensor('float32', t.data as Float32Array, dims);
    case 'f64':
      return new ort.Tensor('float64', t.data as Float64Array, dims);
    case 'i32':
      return new ort.Tensor('int32', t.data as Int32Array, dims);
    case 'bool':
      return new ort.Tensor('bool', t.data as Uint8Array, dims);
    case 'i8':
    case 'u8':
      return new ort.Tensor('int32', Int32Array.from(t.data), dims);
    case 'i64': {
      const src = t.data;
      const out = new BigInt64Array(src.length);
      for (let i = 0; i < src.length; i++) out[i] = BigInt(src[i]!);
      return new ort.Tensor('int64', out, dims);
    }
  }
}

/**
 * An onnxruntime output as a host tensor of IR dtype `dtype`: float32/float64/int32/bool data is
 * taken as is (the binding hands back fresh arrays), int64 converts to doubles and int32 narrows to
 * i8/u8 storage (values are already wrapped in the graph).
 */
export function fromOrtTensor(t: OrtTensor, dtype: DType): HostTensor {
  const shape = [...t.dims];
  const data = t.data;
  switch (dtype) {
    case 'f32':
    case 'f16':
    case 'bf16':
      return { dtype, shape, data: data as Float32Array };
    case 'f64':
      return { dtype, shape, data: data as Float64Array };
    case 'i32':
      return { dtype, shape, data: data as Int32Array };
    case 'bool':
      return { dtype, shape, data: data as Uint8Array };
    case 'i8':
      return { dtype, shape, data: Int8Array.from(data as Int32Array) };
    case 'u8':
      return { dtype, shape, data: Uint8Array.from(data as Int32Array) };
    case 'i64': {
      const src = data as BigInt64Array;
      const out = new Float64Array(src.length);
      for (let i = 0; i < src.length; i++) out[i] = Number(src[i]!);
      return { dtype, shape, data: out };
    }
  }
}

/** A zero-filled onnxruntime tensor of `dtype`'s compute type (a preallocated output). */
export function emptyOrtTensor(ort: OrtModule, dtype: DType, dims: readonly number[]): OrtTensor {
  const n = dims.reduce((a, d) => a * d, 1);
  switch (ORT_TYPE[dtype]) {
    case 'float32':
      return new ort.Tensor('float32', new Float32Array(n), dims);
    case 'float64':
      return new ort.Tensor('float64', new Float64Array(n), dims);
    case 'int64':
      return new ort.Tensor('int64', new BigInt64Array(n), dims);
    case 'int32':
      return new ort.Tensor('int32', new Int32Array(n), dims);
    case 'bool':
      return new ort.Tensor('bool', new Uint8Array(n), dims);
  }
}
