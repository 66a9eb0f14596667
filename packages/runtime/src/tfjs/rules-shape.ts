import * as tf from '@tensorflow/tfjs-core';
import { type Dim, hostTensor, isFloatDType, normalizeAxis, sizeOf } from '@stageml/ir';

import { RuntimeCode, RuntimeError } from '../errors.js';
import { conformDType, tfDType, upload } from './dtypes.js';
import { type Lowering, type TfDType, exactLowering, lowering } from './rule.js';

/** Dims of a concretized attribute (symbols were evaluated before lowering). */
export function concreteDims(dims: readonly Dim[]): number[] {
  return dims.map((d) => {
    if (typeof d !== 'number') throw new RuntimeError(RuntimeCode.EVAL_FAILED, 'a symbolic dim reached a tfjs kernel unevaluated');
    return d;
  });
}

/** The permutation that swaps axes `a` and `b` (its own inverse). */
export function swapAxes(rank: number, a: number, b: number): number[] {
  const p = Array.from({ length: rank }, (_, i) => i);
  p[a] = b;
  p[b] = a;
  return p;
}

/** Python slice bounds `start:end:step` on an axis of `size` (clamped; empty when reversed). */
function sliceBounds(size: number, start: number, end: number | undefined, step: number): { start: number; length: number } {
  const norm = (v: number): number => Math.min(Math.max(v < 0 ? v + size : v, 0), size);
  const s = norm(start);
  const e = end === undefined ? size : norm(end);
  return { start: s, length: Math.max(0, Math.ceil((e - s) / step)) };
}

/** y = x with a new shape (the concretized target, one dim possibly −1). */
export const reshape: Lowering<'reshape'> = exactLowering<'reshape'>((attrs) => {
  const shape = concreteDims(attrs.shape);
  return ([x]) => [tf.reshape(x!, shape)];
});

/** y = x with axes permuted (negative perm entries normalized). */
export const transpose: Lowering<'transpose'> = exactLowering<'transpose'>((attrs, ctx) => {
  const rank = ctx.operands[0]!.shape.length;
  const perm = attrs.perm.map((a) => normalizeAxis(a, rank, 'perm entry'));
  return ([x]) => [tf.transpose(x!, perm)];
});

/** y = x broadcast to the target shape. */
export const broadcastTo: Lowering<'broadcastTo'> = exactLowering<'broadcastTo'>((attrs) => {
  const shape = concreteDims(attrs.shape);
  return ([x]) => [tf.broadcastTo(x!, shape)];
});

/** y = [x₀ ‖ x₁ ‖ …] along an axis. */
export const concat: Lowering<'concat'> = exactLowering<'concat'>((attrs, ctx) => {
  const axis = normalizeAxis(attrs.axis, ctx.operands[0]!.shape.length);
  return (xs) => [tf.concat([...xs], axis)];
});

/**
 * y = x[start:end:step] along an axis with Python semantics. Step 1 is a plain slice; larger steps
 * gather an index list, since the wasm backend's StridedSlice returns garbage for int32 and bool.
 */
export const slice: Lowering<'slice'> = exactLowering<'slice'>((attrs, ctx) => {
  const rank = ctx.operands[0]!.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const start = concreteDims([attrs.start])[0]!;
  const end = attrs.end === undefined ? undefined : concreteDims([attrs.end])[0]!;
  const step = attrs.step;
  return ([x]) => {
    const b = sliceBounds(x!.shape[axis]!, start, end, step);
    if (step === 1) {
      const begin = new Array<number>(rank).fill(0);
      begin[axis] = b.start;
      const size = [...x!.shape];
      size[axis] = b.length;
      return [tf.slice(x!, begin, size)];
    }
    return [tf.gather(x!, tf.range(b.start, b.start + b.length * step, step, 'int32'), axis)];
  };
});

/** y[a…, i…, b…] = table[a…, indices[i…], b…] (any index rank, any axis). */
export const gather: Lowering<'gather'> = exactLowering<'gather'>((attrs, ctx) => {
  const axis = normalizeAxis(attrs.axis, ctx.operands[0]!.shape.length);
  return ([t, i]) => [tf.gather(t!, i!, axis)];
});

/** y[…, j, …] = x[…, index[j], …] along an axis. */
export const indexSelect: Lowering<'indexSelect'> = exactLowering<'indexSelect'>((attrs, ctx) => {
  const axis = normalizeAxis(attrs.axis, ctx.operands[0]!.shape.length);
  return ([x, i]) => [tf.gather(x!, i!, axis)];
});

/**
 * y = x; y[…, index[j], …] += updates[…, j, …] (torch.index_add): the axis moves to the front,
 * ScatterNd sums the updates into zeros (repeated indices accumulate) and the sum is added to x.
 * Bool tensors add as int32 and convert back with ≠ 0, as the interpreter's rounding to bool does.
 */
export const scatterAdd: Lowering<'scatterAdd'> = lowering<'scatterAdd'>((attrs, ctx) => {
  const rank = ctx.operands[0]!.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const isBool = ctx.operands[0]!.dtype === 'bool';
  const perm = axis === 0 ? undefined : swapAxes(rank, 0, axis);
  const zero = ctx.scalar(0, 'int32');
  return ([x, index, updates]) => {
    if (index!.shape[0] === 0) return [x!];
    const asNumber = (t: tf.Tensor): tf.Tensor => (isBool ? tf.cast(t, 'int32') : t);
    const front = (t: tf.Tensor): tf.Tensor => (perm === undefined ? t : tf.transpose(t, perm));
    const xt = front(asNumber(x!));
    const delta = tf.scatterND(tf.reshape(index!, [index!.shape[0], 1]), front(asNumber(updates!)), xt.shape);
    const y = front(tf.add(xt, delta));
    return [isBool ? tf.notEqual(y, zero) : y];
  };
});

/** The largest finite float32. */
const F32_MAX = 3.4028234663852886e38;

/**
 * The k largest (or smallest) entries along any axis, sorted, ties to the lower index, NaN above
 * +∞ (as torch.topk and the interpreter). tfjs's TopK works on the last axis, orders NaN
 * arbitrarily, breaks ties among infinities arbitrarily (its cpu comparator subtracts values, and
 * ∞ − ∞ is NaN) and rejects bool, so it ranks a finite key instead: x/4 for finite floats (exact),
 * ±∞ → ±f32max/2 and NaN → f32max, which orders finite < +∞ < NaN; bool → int32; the key is
 * negated for smallest. Values are then gathered from x by the indices (`gatherRows`). Caveat:
 * distinct floats below 4.7e-38 in magnitude may tie, as x/4 is then subnormal (or flushed).
 */
export const topk: Lowering<'topk'> = exactLowering<'topk'>((attrs, ctx) => {
  const x0 = ctx.operands[0]!;
  const rank = x0.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const last = rank - 1;
  const perm = axis === last ? undefined : swapAxes(rank, axis, last);
  const float = isFloatDType(x0.dtype);
  const quarter = ctx.scalar(0.25);
  const nanKey = ctx.scalar(F32_MAX);
  return ([x]) => {
    const xt = perm === undefined ? x! : tf.transpose(x!, perm);
    let key = xt;
    if (x0.dtype === 'bool') key = tf.cast(xt, 'int32');
    else if (float) key = tf.where(tf.isNaN(xt), nanKey, tf.clipByValue(tf.mul(xt, quarter), -F32_MAX / 2, F32_MAX / 2));
    if (!attrs.largest) key = tf.neg(key);
    const { indices } = tf.topk(key, attrs.k, true);
    const values = attrs.k === 0 ? tf.slice(xt, new Array<number>(rank).fill(0), indices.shape) : gatherRows(xt, indices);
    return perm === undefined ? [values, indices] : [tf.transpose(values, perm), tf.transpose(indices, perm)];
  };
});

/**
 * y[r…, j] = x[r…, indices[r…, j]]: per-row gather along the last axis, through flat indices
 * (row · n + index) into the flattened x, because the wasm backend's GatherV2 reads out of bounds
 * when given batch dims.
 */
function gatherRows(x: tf.Tensor, indices: tf.Tensor): tf.Tensor {
  const n = x.shape[x.shape.length - 1]!;
  const rows = sizeOf(x.shape.slice(0, -1));
  const offsets = tf.reshape(tf.range(0, rows * n, n, 'int32'), [...x.shape.slice(0, -1), 1]);
  return tf.gather(tf.reshape(x, [-1]), tf.add(indices, offsets));
}

/** y = a literal, rounded to its dtype on the host and resident on the device. */
export const constant: Lowering<'constant'> = exactLowering<'constant'>((attrs, ctx) => {
  const shape = concreteDims(attrs.shape);
  const n = sizeOf(shape);
  const values = attrs.value.length === 1 ? new Array<number>(n).fill(attrs.value[0]!) : attrs.value;
  const t = ctx.keep(upload(hostTensor(attrs.dtype, shape, values), false));
  return () => [t];
});

/**
 * y[i…] = i_axis, built from a range broadcast over the (concrete) shape and conformed to narrow
 * dtypes once; resident when the shape is static, rebuilt per run when it is symbolic.
 */
export const iota: Lowering<'iota'> = exactLowering<'iota'>((attrs, ctx) => {
  const shape = concreteDims(attrs.shape);
  const axis = normalizeAxis(attrs.axis, shape.length);
  const dtype = tfDType(attrs.dtype);
  const t = ctx.keep(
    tf.tidy(() => {
      const along = new Array<number>(shape.length).fill(1);
      along[axis] = shape[axis]!;
      const r = tf.broadcastTo(tf.reshape(tf.range(0, shape[axis]!, 1, dtype === 'float32' ? 'float32' : 'int32'), along), shape);
      if (dtype === 'bool') return tf.notEqual(r, tf.scalar(0, 'int32'));
      return conformDType(r, attrs.dtype, (v, dt) => tf.scalar(v, dt));
    }),
  );
  return () => [t];
});

/**
 * The largest value below 1 of each IR float dtype as the device holds it (f64 is float32 there).
 * Rounding a sample close to 1 to the dtype can carry it to 1.0; the interpreter clamps to this.
 */
const BELOW_ONE = { f64: 1 - 2 ** -24, f32: 1 - 2 ** -24, f16: 1 - 2 ** -11, bf16: 1 - 2 ** -8 } as const;

/**
 * y ~ U[0, 1) from tfjs's generator: a different stream from the interpreter's seeded one, so only
 * shape, dtype and range are comparable. Samples are rounded to the dtype, then clamped below 1.
 */
export const randomUniform: Lowering<'randomUniform'> = exactLowering<'randomUniform'>((attrs, ctx) => {
  const shape = concreteDims(attrs.shape);
  const below = ctx.scalar(BELOW_ONE[attrs.dtype as keyof typeof BELOW_ONE]);
  const scalar = (v: number, dt?: TfDType): tf.Scalar => ctx.scalar(v, dt);
  return () => [tf.minimum(conformDType(tf.randomUniform(shape, 0, 1, 'float32'), attrs.dtype, scalar), below)];
});
