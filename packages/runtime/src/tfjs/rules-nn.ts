import * as tf from '@tensorflow/tfjs-core';
import { type DType, isFloatDType, normalizeAxis } from '@stageml/ir';

import { RuntimeCode, RuntimeError } from '../errors.js';
import type { TfjsBackend } from './backend.js';
import { tfDType } from './dtypes.js';
import { swapAxes } from './rules-shape.js';
import { type Kernel, type LowerContext, type Lowering, exactLowering, lowering } from './rule.js';

/**
 * How a contraction of `dtype` runs: natively, or in float32 converting back (to int32 by
 * truncation, to bool by ≠ 0). The wasm backend's BatchMatMul is float32-only, so off the cpu
 * backend integer products are exact only while partial sums stay below 2²⁴ in magnitude.
 */
function contraction(dtype: DType, backend: TfjsBackend): { into: (t: tf.Tensor) => tf.Tensor; back: (t: tf.Tensor) => tf.Tensor } {
  const same = (t: tf.Tensor): tf.Tensor => t;
  if (isFloatDType(dtype) || (dtype !== 'bool' && backend === 'cpu')) return { into: same, back: same };
  const toFloat = (t: tf.Tensor): tf.Tensor => tf.cast(t, 'float32');
  if (dtype === 'bool') return { into: toFloat, back: (t) => tf.notEqual(t, tf.zerosLike(t)) };
  return { into: toFloat, back: (t) => tf.cast(t, 'int32') };
}

/**
 * Operands whose batch dims tfjs's BatchMatMul would mis-broadcast, expanded to the full batch.
 * tfjs flattens each operand's batch dims to one count and broadcasts only a count of 1, so batch
 * shapes like [2, 1] and [3] (6 products) come out with 3: unless the batch shapes are equal or one
 * has a single matrix, both operands are broadcast explicitly first.
 */
function alignBatch(a: tf.Tensor, b: tf.Tensor): [tf.Tensor, tf.Tensor] {
  const ba = a.shape.slice(0, -2);
  const bb = b.shape.slice(0, -2);
  const count = (s: readonly number[]): number => s.reduce((p, d) => p * d, 1);
  if (count(ba) === 1 || count(bb) === 1 || (ba.length === bb.length && ba.every((d, i) => d === bb[i]))) return [a, b];
  const rank = Math.max(ba.length, bb.length);
  const pad = (s: readonly number[]): number[] => [...new Array<number>(rank - s.length).fill(1), ...s];
  const batch = pad(ba).map((d, i) => Math.max(d, pad(bb)[i]!));
  return [tf.broadcastTo(a, [...batch, ...a.shape.slice(-2)]), tf.broadcastTo(b, [...batch, ...b.shape.slice(-2)])];
}

/** y = op(a) · op(b) over the last two axes, leading axes broadcast (tfjs BatchMatMul). */
export const matmul: Lowering<'matmul'> = lowering<'matmul'>((attrs, ctx) => {
  const c = contraction(ctx.operands[0]!.dtype, ctx.backend);
  return ([a, b]) => {
    const [x, y] = alignBatch(c.into(a!), c.into(b!));
    return [c.back(tf.matMul(x, y, attrs.transposeA, attrs.transposeB))];
  };
});

/**
 * y = x · wᵀ + bias, with x flattened to rows so the weight is never broadcast over batch dims.
 *
 * NOTE: tfjs-wasm runs a transposed-B matmul many times slower than a plain one (measured ~12× at
 * 1024×256·256×1024), and linear weights are [out, in]. A weight tensor seen on a second run is a
 * resident (parameters and constants persist across runs; intermediates are disposed), so its
 * transpose is made once, kept for the prepared graph's lifetime, and reused.
 */
export const linear: Lowering<'linear'> = lowering<'linear'>((_attrs, ctx) => {
  const c = contraction(ctx.operands[0]!.dtype, ctx.backend);
  const seen = new WeakSet<tf.Tensor>();
  const transposed = new WeakMap<tf.Tensor, tf.Tensor>();
  const weightT = (w: tf.Tensor): tf.Tensor | undefined => {
    const cached = transposed.get(w);
    if (cached !== undefined && !cached.isDisposed) return cached;
    if (!seen.has(w)) {
      seen.add(w);
      return undefined;
    }
    const t = ctx.keep(tf.transpose(c.into(w)));
    transposed.set(w, t);
    return t;
  };
  return ([x, w, bias]) => {
    const inDim = x!.shape[x!.shape.length - 1]!;
    const rows = x!.shape.slice(0, -1);
    const x2 = tf.reshape(c.into(x!), [rows.reduce((p, d) => p * d, 1), inDim]);
    const wt = weightT(w!);
    const y2 = wt === undefined ? tf.matMul(x2, c.into(w!), false, true) : tf.matMul(x2, wt);
    const y = tf.reshape(bias === undefined ? y2 : tf.add(y2, c.into(bias)), [...rows, w!.shape[0]]);
    return [c.back(y)];
  };
});

/**
 * y[n] = x[n] · w[g_n] (transposeW: w[g_n]ᵀ), the MoE expert GEMM, as a grouped GEMM: the group of
 * each row is read on the host (one small synchronous download of n indices), rows are gathered per
 * group, each group runs one matmul against its matrix, and one gather restores the row order (none
 * when a single group holds every row). An out-of-range group fails the run as the interpreter does.
 */
export const groupedMatmul: Lowering<'groupedMatmul'> = lowering<'groupedMatmul'>((attrs, ctx) => {
  const c = contraction(ctx.operands[0]!.dtype, ctx.backend);
  const dtype = tfDType(ctx.operands[0]!.dtype);
  return ([x, w, groups]) => {
    const n = x!.shape[0];
    const [e, d1, d2] = w!.shape as [number, number, number];
    const m = attrs.transposeW ? d1 : d2;
    const g = groups!.dataSync();
    const rowsOf: number[][] = Array.from({ length: e }, () => []);
    for (let r = 0; r < n; r++) {
      const gi = g[r]!;
      if (!(gi >= 0 && gi < e)) throw new RuntimeError(RuntimeCode.EVAL_FAILED, `group ${String(gi)} of row ${String(r)} is out of range [0, ${String(e)})`);
      rowsOf[gi]!.push(r);
    }
    const parts: tf.Tensor[] = [];
    const order: number[] = [];
    rowsOf.forEach((rows, gi) => {
      if (rows.length === 0) return;
      const xg = rows.length === n ? x! : tf.gather(x!, tf.tensor1d(rows, 'int32'));
      const wg = tf.reshape(tf.slice(w!, [gi, 0, 0], [1, d1, d2]), [d1, d2]);
      parts.push(tf.matMul(c.into(xg), c.into(wg), false, attrs.transposeW));
      order.push(...rows);
    });
    if (parts.length === 0) return [tf.zeros([n, m], dtype)];
    const stacked = parts.length === 1 ? parts[0]! : tf.concat(parts, 0);
    const position = new Int32Array(n);
    order.forEach((r, i) => {
      position[r] = i;
    });
    const y = order.every((r, i) => r === i) ? stacked : tf.gather(stacked, tf.tensor1d(position, 'int32'));
    return [c.back(y)];
  };
});

/** Normalized reduction axes of a rank-`rank` operand; an empty list means every axis. */
function reductionAxes(axes: readonly number[], rank: number): number[] {
  if (axes.length === 0) return Array.from({ length: rank }, (_, i) => i);
  return axes.map((a) => normalizeAxis(a, rank, 'reduction axis'));
}

/** Compiles a reduction over attribute axes (`axes`, `keepDims`) mapped to one tfjs reduction. */
function reduceWith(
  f: (x: tf.Tensor, axes: number[], keepDims: boolean) => tf.Tensor,
): (attrs: { readonly axes: readonly number[]; readonly keepDims: boolean }, ctx: LowerContext) => Kernel {
  return (attrs, ctx) => {
    const axes = reductionAxes(attrs.axes, ctx.operands[0]!.shape.length);
    return ([x]) => [f(x!, axes, attrs.keepDims)];
  };
}

/** y = Σ over axes (i8/u8 sums wrap, f16/bf16 round, after the int32/float32 reduction). */
export const sum: Lowering<'sum'> = lowering<'sum'>(reduceWith((x, axes, keep) => tf.sum(x, axes, keep)));

/** y = mean over axes. */
export const mean: Lowering<'mean'> = lowering<'mean'>(reduceWith((x, axes, keep) => tf.mean(x, axes, keep)));

/** y = max over axes (NaN propagates on cpu and wasm; values are selected, so exact). */
export const max: Lowering<'max'> = exactLowering<'max'>(reduceWith((x, axes, keep) => tf.max(x, axes, keep)));

/**
 * Index (int32 on the device) of the first maximum along an axis, NaN counting as the maximum:
 * tfjs's ArgMax skips NaN, so rows holding one take the index of their first NaN instead.
 */
export const argmax: Lowering<'argmax'> = exactLowering<'argmax'>((attrs, ctx) => {
  const x0 = ctx.operands[0]!;
  const axis = normalizeAxis(attrs.axis, x0.shape.length);
  const float = isFloatDType(x0.dtype);
  return ([x]) => {
    let idx = tf.argMax(x0.dtype === 'bool' ? tf.cast(x!, 'int32') : x!, axis);
    if (float) {
      const nan = tf.isNaN(x!);
      idx = tf.where(tf.any(nan, axis), tf.argMax(tf.cast(nan, 'int32'), axis), idx);
    }
    return [attrs.keepDims ? tf.expandDims(idx, axis) : idx];
  };
});

/** Softmax along any axis: tfjs's kernel takes the last one, so other axes are swapped there and back. */
export const softmax: Lowering<'softmax'> = lowering<'softmax'>((attrs, ctx) => {
  const rank = ctx.operands[0]!.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  if (axis === rank - 1) return ([x]) => [tf.softmax(x!)];
  const perm = swapAxes(rank, axis, rank - 1);
  return ([x]) => [tf.transpose(tf.softmax(tf.transpose(x!, perm)), perm)];
});

/** y = x · rsqrt(mean(x², last) + ε) · w (composite). */
export const rmsNorm: Lowering<'rmsNorm'> = lowering<'rmsNorm'>((attrs, ctx) => {
  const eps = ctx.scalar(attrs.eps);
  return ([x, w]) => {
    const y = tf.mul(x!, tf.rsqrt(tf.add(tf.mean(tf.square(x!), -1, true), eps)));
    return [w === undefined ? y : tf.mul(y, w)];
  };
});

/** y = (x − μ) · rsqrt(mean((x − μ)²) + ε) · w + b over the last axis (composite, two-pass variance). */
export const layerNorm: Lowering<'layerNorm'> = lowering<'layerNorm'>((attrs, ctx) => {
  const eps = ctx.scalar(attrs.eps);
  return ([x, w, b]) => {
    const centered = tf.sub(x!, tf.mean(x!, -1, true));
    let y = tf.mul(centered, tf.rsqrt(tf.add(tf.mean(tf.square(centered), -1, true), eps)));
    if (w !== undefined) y = tf.mul(y, w);
    if (b !== undefined) y = tf.add(y, b);
    return [y];
  };
});

/**
 * y = x·cos + rot(x)·sin (composite). Half-split: rot(x) = [−x₂, x₁] of the two halves of the last
 * axis; interleaved: pairs (x_{2i}, x_{2i+1}) ↦ (−x_{2i+1}, x_{2i}), through a [..., d/2, 2] view.
 */
export const rotary: Lowering<'rotary'> = lowering<'rotary'>((attrs) => {
  const rotate = attrs.interleaved ? rotateInterleaved : rotateHalves;
  return ([x, cos, sin]) => [tf.add(tf.mul(x!, cos!), tf.mul(rotate(x!), sin!))];
});

function rotateHalves(x: tf.Tensor): tf.Tensor {
  const r = x.shape.length;
  const half = x.shape[r - 1]! / 2;
  const begin = new Array<number>(r).fill(0);
  const size = [...x.shape];
  size[r - 1] = half;
  const first = tf.slice(x, begin, size);
  begin[r - 1] = half;
  const second = tf.slice(x, begin, size);
  return tf.concat([tf.neg(second), first], -1);
}

function rotateInterleaved(x: tf.Tensor): tf.Tensor {
  const lead = x.shape.slice(0, -1);
  const half = x.shape[x.shape.length - 1]! / 2;
  const pairs = tf.reshape(x, [...lead, half, 2]);
  const begin = new Array<number>(lead.length + 2).fill(0);
  const size = [...lead, half, 1];
  const even = tf.slice(pairs, begin, size);
  begin[lead.length + 1] = 1;
  const odd = tf.slice(pairs, begin, size);
  return tf.reshape(tf.concat([tf.neg(odd), even], -1), x.shape);
}

/** Visibility of key j to query i under end-aligned causal masking: j ≤ i + tk − tq, as bool[tq, tk]. */
function causalVisible(tq: number, tk: number): tf.Tensor {
  return tf.tidy(() =>
    tf.lessEqual(tf.reshape(tf.range(0, tk, 1, 'int32'), [1, tk]), tf.reshape(tf.range(tk - tq, tk, 1, 'int32'), [tq, 1])),
  );
}

/**
 * softmax(q·kᵀ·scale + mask) · v (composite). Grouped-query heads need no copies of k and v: query
 * head h reads kv head ⌊h / g⌋ (g = hq/hkv), so q [..., hq, tq, d] is viewed as
 * [..., hkv, g·tq, d] and multiplied per kv head. A bool mask selects (false → −∞), any other mask
 * adds; the causal mask is applied last, so causally hidden keys stay −∞ whatever the mask says
 * (as in the interpreter). Rows with no visible key are NaN, as are all rows when tk = 0.
 */
export const attention: Lowering<'attention'> = lowering<'attention'>((attrs, ctx) => {
  const [q0, k0] = ctx.operands as [(typeof ctx.operands)[number], (typeof ctx.operands)[number]];
  const rank = q0.shape.length;
  const boolMask = ctx.operands[3]?.dtype === 'bool';
  const negInf = ctx.scalar(Number.NEGATIVE_INFINITY);
  const d0 = q0.shape[rank - 1]!;
  const staticScale = attrs.scale ?? (typeof d0 === 'number' ? 1 / Math.sqrt(d0) : undefined);
  const scale0 = staticScale === undefined ? undefined : ctx.scalar(staticScale);
  const tq0 = q0.shape[rank - 2]!;
  const tk0 = k0.shape[rank - 2]!;
  const visible0 = attrs.causal && typeof tq0 === 'number' && typeof tk0 === 'number' ? ctx.keep(causalVisible(tq0, tk0)) : undefined;
  return ([q, k, v, mask]) => {
    const lead = q!.shape.slice(0, rank - 3);
    const [hq, tq, d] = q!.shape.slice(rank - 3) as [number, number, number];
    const [hkv, tk] = k!.shape.slice(rank - 3) as [number, number];
    const dv = v!.shape[rank - 1]!;
    if (tk === 0) return [tf.fill([...lead, hq, tq, dv], Number.NaN)];
    const g = hq / hkv;
    const grouped = tf.matMul(tf.reshape(q!, [...lead, hkv, g * tq, d]), k!, false, true);
    let s = tf.mul(tf.reshape(grouped, [...lead, hq, tq, tk]), scale0 ?? tf.scalar(1 / Math.sqrt(d)));
    if (mask !== undefined) s = boolMask ? tf.where(mask, s, negInf) : tf.add(s, mask);
    if (attrs.causal) s = tf.where(visible0 ?? causalVisible(tq, tk), s, negInf);
    const p = tf.reshape(tf.softmax(s), [...lead, hkv, g * tq, tk]);
    return [tf.reshape(tf.matMul(p, v!), [...lead, hq, tq, dv])];
  };
});

/** Byte codes [.., n] (int32) as float codes [.., n·8/bits] (4-bit: low nibble first). */
function unpackCodes(bytes: tf.Tensor, bits: number): tf.Tensor {
  const f = tf.cast(bytes, 'float32');
  if (bits === 8) return f;
  const hi = tf.floor(tf.div(f, 16));
  const lo = tf.sub(f, tf.mul(hi, 16));
  const s = f.shape;
  return tf.reshape(tf.stack([lo, hi], -1), [...s.slice(0, -1), s[s.length - 1]! * 2]);
}

/**
 * y = x · dequantize(q)ᵀ: the weight is dequantized with tensor ops ((code − zp)·scale per block,
 * padding cut) and multiplied as `linear` does. A resident weight (seen on a second run) is
 * dequantized once and kept, so steady-state runs cost an f32 linear (tfjs has no int kernels).
 */
export const quantizedLinear: Lowering<'quantizedLinear'> = lowering<'quantizedLinear'>((attrs, ctx) => {
  const seen = new WeakSet<tf.Tensor>();
  const cache = new WeakMap<tf.Tensor, tf.Tensor>();
  const { bits, blockSize, inFeatures } = attrs;
  const blocks = Math.ceil(inFeatures / blockSize);
  const dequant = (q: tf.Tensor, s: tf.Tensor, zp: tf.Tensor | undefined): tf.Tensor => {
    const out = q.shape[0];
    const codes = tf.slice(unpackCodes(q, bits), [0, 0, 0], [out, blocks, blockSize]);
    const z = zp === undefined ? tf.scalar(2 ** (bits - 1)) : tf.expandDims(tf.slice(unpackCodes(zp, bits), [0, 0], [out, blocks]), -1);
    const w = tf.mul(tf.sub(codes, z), tf.expandDims(tf.cast(s, 'float32'), -1));
    const flat = tf.slice(tf.reshape(w, [out, blocks * blockSize]), [0, 0], [out, inFeatures]);
    // Transposed once: tfjs-wasm's plain matmul is much faster than a transposed-B one.
    return tf.transpose(ctx.operands[0]!.dtype === 'f32' ? flat : tf.cast(flat, tfDType(ctx.operands[0]!.dtype)));
  };
  return ([x, q, s, zp]) => {
    let wt = cache.get(q!);
    if (wt === undefined || wt.isDisposed) {
      wt = dequant(q!, s!, zp);
      if (seen.has(q!)) cache.set(q!, ctx.keep(wt));
      else seen.add(q!);
    }
    const rows = x!.shape.slice(0, -1);
    const y2 = tf.matMul(tf.reshape(x!, [rows.reduce((p, d) => p * d, 1), inFeatures]), wt);
    return [tf.reshape(y2, [...rows, q!.shape[0]])];
  };
});
