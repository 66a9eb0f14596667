import * as tf from '@tensorflow/tfjs-core';
import { type OpKey, isFloatDType } from '@stageml/ir';

import { tfDType } from './dtypes.js';
import { type Kernel, type Lowering, exactLowering, lowering } from './rule.js';

/** A one-operand op mapped to one tfjs function. */
export function unary<K extends OpKey>(f: (x: tf.Tensor) => tf.Tensor): Lowering<K> {
  return lowering<K>(() => (xs) => [f(xs[0]!)]);
}

/** A broadcasting two-operand op mapped to one tfjs function. */
export function binary<K extends OpKey>(f: (a: tf.Tensor, b: tf.Tensor) => tf.Tensor): Lowering<K> {
  return lowering<K>(() => (xs) => [f(xs[0]!, xs[1]!)]);
}

/** A comparison (bool results are always exact). */
export function compare<K extends OpKey>(f: (a: tf.Tensor, b: tf.Tensor) => tf.Tensor): Lowering<K> {
  return exactLowering<K>(() => (xs) => [f(xs[0]!, xs[1]!)]);
}

/**
 * max(a, b) or min(a, b) with NaN propagating from either side, as the IR defines it. Only the cpu
 * backend propagates a NaN right operand by itself (wasm's kernel returns a), so elsewhere a NaN in
 * b is selected explicitly: y = isNaN(b) ? b : f(a, b).
 */
export function nanPropagating<K extends OpKey>(f: (a: tf.Tensor, b: tf.Tensor) => tf.Tensor): Lowering<K> {
  return exactLowering<K>((_attrs, ctx) => {
    const fix = ctx.backend !== 'cpu' && isFloatDType(ctx.operands[0]!.dtype);
    return (xs) => {
      const y = f(xs[0]!, xs[1]!);
      return [fix ? tf.where(tf.isNaN(xs[1]!), xs[1]!, y) : y];
    };
  });
}

/** x·σ(x). */
export function silu(x: tf.Tensor): tf.Tensor {
  return tf.mul(x, tf.sigmoid(x));
}

const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);

/** GELU, exact y = ½x(1 + erf(x/√2)) or tanh-approximated y = ½x(1 + tanh(√(2/π)(x + 0.044715x³))). */
export const gelu: Lowering<'gelu'> = lowering<'gelu'>((attrs, ctx) => {
  const half = ctx.scalar(0.5);
  const one = ctx.scalar(1);
  if (attrs.approximate === 'tanh') {
    const c = ctx.scalar(SQRT_2_OVER_PI);
    const k = ctx.scalar(0.044715);
    return ([x]) => {
      const inner = tf.mul(c, tf.add(x!, tf.mul(k, tf.mul(x!, tf.mul(x!, x!)))));
      return [tf.mul(tf.mul(half, x!), tf.add(one, tf.tanh(inner)))];
    };
  }
  const invSqrt2 = ctx.scalar(Math.SQRT1_2);
  return ([x]) => [tf.mul(tf.mul(half, x!), tf.add(one, tf.erf(tf.mul(x!, invSqrt2))))];
});

/**
 * cond ? a : b with broadcasting. Bool a/b go through int32: the wasm backend's Select kernel
 * mishandles bool values.
 */
export const where: Lowering<'where'> = exactLowering<'where'>((_attrs, ctx) => {
  if (ctx.results[0]!.dtype !== 'bool') return ([c, a, b]) => [tf.where(c!, a!, b!)];
  const zero = ctx.scalar(0, 'int32');
  return ([c, a, b]) => [tf.notEqual(tf.where(c!, tf.cast(a!, 'int32'), tf.cast(b!, 'int32')), zero)];
});

/**
 * Conversion with the interpreter's rounding: to bool is x ≠ 0 (NaN → true); float → integer
 * truncates toward zero with NaN and ±∞ → 0 and wraps modulo 2³² (tfjs's int32 cast is ECMAScript
 * ToInt32, as the interpreter's `Math.trunc(x) | 0`); the executor then rounds f16/bf16 results and
 * wraps i8/u8 ones. Same-device-dtype casts (f32 → f64, i64 → i8, …) move no data.
 */
export const cast: Lowering<'cast'> = lowering<'cast'>((attrs, ctx): Kernel => {
  const from = ctx.operands[0]!.dtype;
  const to = attrs.dtype;
  if (to === 'bool') {
    if (from === 'bool') return ([x]) => [x!];
    const zero = ctx.scalar(0, tfDType(from));
    return ([x]) => [tf.notEqual(x!, zero)];
  }
  const target = tfDType(to);
  if (tfDType(from) === target) return ([x]) => [x!];
  return ([x]) => [tf.cast(x!, target)];
});
