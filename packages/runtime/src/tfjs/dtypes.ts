import * as tf from '@tensorflow/tfjs-core';
import { type DType, type HostTensor, allocData, rounderFor } from '@stageml/ir';

import type { TfDType } from './rule.js';

/**
 * The device dtype of an IR dtype. tfjs has no f16, bf16, f64, i64, i8 or u8: floats compute in
 * float32 (f64 therefore runs in f32 precision; f16/bf16 results are rounded on the device after
 * every op, see `conformDType`), and integers in int32 (i64 values must fit in int32; i8/u8 wrap
 * after every op as the interpreter's rounding does).
 */
export function tfDType(dtype: DType): TfDType {
  switch (dtype) {
    case 'f64':
    case 'f32':
    case 'f16':
    case 'bf16':
      return 'float32';
    case 'i64':
    case 'i32':
    case 'i8':
    case 'u8':
      return 'int32';
    case 'bool':
      return 'bool';
  }
}

/**
 * Uploads a host tensor. The cpu backend keeps the array it is given, so `copy` forces a private
 * copy when no dtype conversion already makes one (parameters, which outlive the caller's arrays).
 */
export function upload(host: HostTensor, copy: boolean): tf.Tensor {
  const dtype = tfDType(host.dtype);
  const src = host.data;
  let data: Float32Array | Int32Array | Uint8Array;
  if (dtype === 'float32') data = src instanceof Float32Array ? (copy ? src.slice() : src) : Float32Array.from(src);
  else if (dtype === 'int32') data = src instanceof Int32Array ? (copy ? src.slice() : src) : Int32Array.from(src);
  else data = src instanceof Uint8Array ? (copy ? src.slice() : src) : Uint8Array.from(src, (v) => (v !== 0 ? 1 : 0));
  return tf.tensor(data, [...host.shape], dtype);
}

/**
 * Converts downloaded device values to a host tensor in the IR dtype's storage (a fresh array: the
 * cpu backend may hand out its own). f16/bf16 values are re-rounded on the host, which is the
 * identity on values the device already rounded.
 */
export function download(values: tf.TypedArray, dtype: DType, shape: readonly number[]): HostTensor {
  const data = allocData(dtype, values.length);
  if (dtype === 'f16' || dtype === 'bf16') {
    const round = rounderFor(dtype);
    for (let i = 0; i < values.length; i++) data[i] = round(values[i]!);
  } else {
    data.set(values);
  }
  return { dtype, shape: [...shape], data };
}

/** Scalars for the rounding and wrapping code (resident ones at prepare time). */
export type ScalarSource = (value: number, dtype?: TfDType) => tf.Scalar;

interface NarrowFloat {
  /** Explicit mantissa bits. */
  readonly mantissa: number;
  /** Smallest normal exponent (below it the spacing stays at the subnormal step). */
  readonly minExponent: number;
  /** Largest finite value; larger magnitudes after rounding become ±∞ (undefined: f32 overflow does it). */
  readonly maxFinite: number | undefined;
}

const F16: NarrowFloat = { mantissa: 10, minExponent: -14, maxFinite: 65504 };
const BF16: NarrowFloat = { mantissa: 7, minExponent: -126, maxFinite: undefined };

/**
 * Rounds float32 values to the nearest value of a narrower float type, ties to even, as
 * `roundF16`/`roundBf16` in `@stageml/ir` do (tfjs has no bitcast, so this is arithmetic):
 * e = ⌊log₂|x|⌋ (corrected by one where the logarithm rounds across a power of two, floored at the
 * smallest normal exponent), ulp = 2^(e − mantissa), y = round_half_even(x / ulp) · ulp; NaN and ±∞
 * pass through, and f16 magnitudes beyond 65504 become ±∞.
 */
function roundNarrow(x: tf.Tensor, f: NarrowFloat, scalar: ScalarSource): tf.Tensor {
  const two = scalar(2);
  const a = tf.abs(x);
  const e0 = tf.floor(tf.mul(tf.log(a), scalar(1 / Math.LN2)));
  const p = tf.pow(two, e0);
  const tooHigh = tf.cast(tf.greater(p, a), 'float32');
  const tooLow = tf.cast(tf.lessEqual(tf.mul(p, two), a), 'float32');
  const e = tf.maximum(tf.add(tf.sub(e0, tooHigh), tooLow), scalar(f.minExponent));
  const ulp = tf.pow(two, tf.sub(e, scalar(f.mantissa)));
  let y = tf.mul(tf.round(tf.div(x, ulp)), ulp);
  if (f.maxFinite !== undefined) {
    const overflow = tf.greater(tf.abs(y), scalar(f.maxFinite));
    y = tf.where(overflow, tf.mul(tf.sign(x), scalar(Number.POSITIVE_INFINITY)), y);
  }
  // ±∞ and NaN make ulp non-finite; keep them as they are.
  return tf.where(tf.isFinite(x), y, x);
}

/** Wraps int32 values to 8 bits: u8 = x mod 256, i8 = ((x + 128) mod 256) − 128 (floor modulo). */
function wrap8(x: tf.Tensor, signed: boolean, scalar: ScalarSource): tf.Tensor {
  const m = scalar(256, 'int32');
  if (!signed) return tf.mod(x, m);
  const h = scalar(128, 'int32');
  return tf.sub(tf.mod(tf.add(x, h), m), h);
}

/**
 * Makes a device result hold exactly what the IR dtype can: f16/bf16 rounding and i8/u8 wrapping;
 * every other dtype is returned as it is.
 */
export function conformDType(x: tf.Tensor, dtype: DType, scalar: ScalarSource): tf.Tensor {
  switch (dtype) {
    case 'f16':
      return roundNarrow(x, F16, scalar);
    case 'bf16':
      return roundNarrow(x, BF16, scalar);
    case 'i8':
      return wrap8(x, true, scalar);
    case 'u8':
      return wrap8(x, false, scalar);
    case 'f64':
    case 'f32':
    case 'i64':
    case 'i32':
    case 'bool':
      return x;
  }
}

/** Whether values of `dtype` need `conformDType` after a non-exact op. */
export function needsConform(dtype: DType): boolean {
  return dtype === 'f16' || dtype === 'bf16' || dtype === 'i8' || dtype === 'u8';
}
