import { attr } from '../attrs.js';
import { type Dim, dimAdd, dimDivExact, dimEquals, dimMul, dimProduct, dimSub, dimToString } from '../dim.js';
import { allocData, rounderFor } from '../dtype.js';
import { IrCode, IrError } from '../errors.js';
import type { GraphBuilder, Value } from '../builder.js';
import { defineOp, dtypeError, shapeError } from '../op-def.js';
import { type HostTensor, broadcastStrides, forEachIndex, sizeOf } from '../tensor.js';
import { type TensorType, broadcastShapes, shapeEquals, shapeToString } from '../types.js';
import { perElementFlops, requireFloat, requireRank, sameDType } from './common.js';

/** y = x·cos + rotate(x)·sin (rotary position embedding). */
export const rotary = defineOp({
  key: 'rotary',
  summary:
    'Rotary position embedding: rotates pairs of the last axis by angles given as cos/sin tables broadcast against x (half-split pairs as in HF Llama, or interleaved pairs).',
  semantics: 'y = x·cos + rot(x)·sin, rot(x) = [−x₂, x₁] (halves) or (−x_{2i+1}, x_{2i}) (interleaved)',
  operands: ['x', 'cos', 'sin'],
  attrs: { interleaved: attr.bool({ default: false }) },
  traits: ['elementwise', 'broadcasting'],
  infer: ([x, c, s]) => {
    requireFloat('rotary', x!);
    sameDType('rotary', [x!, c!, s!]);
    requireRank('rotary', x!, 1);
    const d = x!.shape[x!.shape.length - 1]!;
    if (dimDivExact(d, 2) === undefined) shapeError('rotary', `last dim ${dimToString(d)} must be even`);
    const b = broadcastShapes([x!.shape, c!.shape, s!.shape]);
    if (!shapeEquals(b, x!.shape)) {
      shapeError('rotary', `cos ${shapeToString(c!.shape)} / sin ${shapeToString(s!.shape)} must broadcast to x ${shapeToString(x!.shape)}`);
    }
    return [x!];
  },
  flops: perElementFlops(3),
  evaluate: ([x, c, s], a) => [evalRotary(x!, c!, s!, a.interleaved)],
  decompose: (b, [x, c, s], a) => {
    const shape = x!.type.shape;
    const last = shape.length - 1;
    const d = shape[last]!;
    const half = dimDivExact(d, 2)!;
    let rot: Value;
    if (a.interleaved) {
      // Pairs (x_{2i}, x_{2i+1}) on a new last axis: rot = (−x_{2i+1}, x_{2i}).
      const pairs = b.reshape(x!, [...shape.slice(0, last), half, 2]);
      const swapped = b.concat([b.neg(b.slice(pairs, last + 1, 1, 2)), b.slice(pairs, last + 1, 0, 1)], last + 1);
      rot = b.reshape(swapped, shape);
    } else {
      rot = b.concat([b.neg(b.slice(x!, last, half, d)), b.slice(x!, last, 0, half)], last);
    }
    return [b.add(b.mul(x!, c!), b.mul(rot, s!))];
  },
});

function evalRotary(x: HostTensor, c: HostTensor, s: HostTensor, interleaved: boolean): HostTensor {
  const shape = x.shape;
  const d = shape[shape.length - 1]!;
  const half = d / 2;
  const out = allocData(x.dtype, x.data.length);
  const round = rounderFor(x.dtype);
  const xd = x.data;
  forEachIndex(shape, [broadcastStrides(c.shape, shape), broadcastStrides(s.shape, shape)], (i, offs) => {
    const j = i % d;
    let partner: number;
    if (interleaved) partner = j % 2 === 0 ? -xd[i + 1]! : xd[i - 1]!;
    else partner = j < half ? -xd[i + half]! : xd[i - half]!;
    out[i] = round(xd[i]! * c.data[offs[0]!]! + partner * s.data[offs[1]!]!);
  });
  return { dtype: x.dtype, shape: [...shape], data: out };
}

/** The dims attention reads: leading batch dims, query/kv heads, query/key lengths, head sizes. */
export interface AttnDims {
  batch: Dim[];
  hq: Dim;
  hkv: Dim;
  tq: Dim;
  tk: Dim;
  d: Dim;
  dv: Dim;
}

/** Checked dims of attention's q, k and v (shared with `cachedAttention`). */
export function attnDims(q: TensorType, k: TensorType, v: TensorType): AttnDims {
  for (const [t, n] of [
    [q, 'q'],
    [k, 'k'],
    [v, 'v'],
  ] as const) {
    requireRank('attention', t, 3, n);
  }
  const r = q.shape.length;
  if (k.shape.length !== r || v.shape.length !== r) shapeError('attention', 'q, k and v must have the same rank');
  const batch = q.shape.slice(0, r - 3);
  for (const t of [k, v]) {
    if (!shapeEquals(t.shape.slice(0, r - 3), batch)) shapeError('attention', 'q, k and v must share leading batch dims');
  }
  const [hq, tq, d] = q.shape.slice(r - 3) as [Dim, Dim, Dim];
  const [hkv, tk, dk] = k.shape.slice(r - 3) as [Dim, Dim, Dim];
  const [hv, tv, dv] = v.shape.slice(r - 3) as [Dim, Dim, Dim];
  if (!dimEquals(d, dk)) shapeError('attention', `q head dim ${dimToString(d)} ≠ k head dim ${dimToString(dk)}`);
  if (!dimEquals(hkv, hv) || !dimEquals(tk, tv)) shapeError('attention', `k ${shapeToString(k.shape)} and v ${shapeToString(v.shape)} disagree`);
  if (dimDivExact(hq, hkv) === undefined) {
    shapeError('attention', `query heads ${dimToString(hq)} are not a multiple of kv heads ${dimToString(hkv)}`);
  }
  return { batch, hq, hkv, tq, tk, d, dv };
}

/** y = softmax(q·kᵀ·scale + mask) · v with causal masking and grouped-query heads. */
export const attention = defineOp({
  key: 'attention',
  summary:
    'Scaled dot-product attention over [..., heads, seq, dim] with grouped-query heads (query head h reads kv head h / (hq/hkv)), optional causal masking aligned to the end (KV-cache decode) and an optional additive or boolean mask.',
  semantics: 'y = softmax(q·kᵀ·scale + mask, keys) · v; causal: key j visible to query i iff j ≤ i + tk − tq',
  operands: ['q', 'k', 'v', 'mask?'],
  attrs: { causal: attr.bool({ default: false }), scale: attr.float({ optional: true }) },
  infer: ([q, k, v, mask]) => {
    requireFloat('attention', q!);
    sameDType('attention', [q!, k!, v!]);
    const dims = attnDims(q!, k!, v!);
    const scores: Dim[] = [...dims.batch, dims.hq, dims.tq, dims.tk];
    if (mask !== undefined) {
      if (mask.dtype !== 'bool' && mask.dtype !== q!.dtype) dtypeError('attention', `mask must be bool or ${q!.dtype}, got ${mask.dtype}`);
      const b = broadcastShapes([mask.shape, scores]);
      if (!shapeEquals(b, scores)) shapeError('attention', `mask ${shapeToString(mask.shape)} must broadcast to ${shapeToString(scores)}`);
    }
    return [{ dtype: q!.dtype, shape: [...dims.batch, dims.hq, dims.tq, dims.dv] }];
  },
  flops: ([q, k, v]) => {
    const x = attnDims(q!, k!, v!);
    // 2·d for q·kᵀ, 2·dv for the weighted sum and ~5 for the softmax, per (query, key) pair.
    const perPair = dimAdd(dimAdd(dimProduct([2, x.d]), dimProduct([2, x.dv])), 5);
    return dimProduct([...x.batch, x.hq, x.tq, x.tk, perPair]);
  },
  evaluate: ([q, k, v, mask], a) => [evalAttention(q!, k!, v!, mask, a.causal, a.scale)],
  decompose: (b, [q, k, v, mask], a) => [attentionPrimitives(b, q!, k!, v!, mask, a.causal, a.scale)],
});

/**
 * Attention in primitive ops: grouped-query heads folded into the query axis (q as
 * [..., hkv, g·tq, d], so one matmul per kv head), scores = q·kᵀ·scale (+ mask, or `where` for a
 * bool mask), causal positions set to −∞ by comparing key index j with i + tk − tq, a softmax over
 * keys and the weighted sum of v. Fully masked rows give NaN, as `evaluate` does.
 */
export function attentionPrimitives(b: GraphBuilder, q: Value, k: Value, v: Value, mask: Value | undefined, causal: boolean, scaleAttr: number | undefined): Value {
  const dims = attnDims(q.type, k.type, v.type);
  const dtype = q.type.dtype;
  const group = dimDivExact(dims.hq, dims.hkv)!;
  const grouped = !dimEquals(group, 1);
  const q2 = grouped ? b.reshape(q, [...dims.batch, dims.hkv, dimMul(group, dims.tq), dims.d]) : q;
  let scores = b.matmul(q2, k, { transposeB: true });
  if (grouped) scores = b.reshape(scores, [...dims.batch, dims.hq, dims.tq, dims.tk]);
  const scale = scaleAttr ?? (typeof dims.d === 'number' ? 1 / Math.sqrt(dims.d) : undefined);
  if (scale === undefined) shapeError('attention', `the head dim ${dimToString(dims.d)} must be static to decompose without a scale attribute`);
  scores = b.mul(scores, b.scalar(scale, dtype));
  const negInf = b.scalar(Number.NEGATIVE_INFINITY, dtype);
  if (mask !== undefined) scores = mask.type.dtype === 'bool' ? b.where(mask, scores, negInf) : b.add(scores, mask);
  if (causal) {
    // Key j is visible to query i iff j ≤ i + (tk − tq): the query's last visible key index.
    const offset = dimSub(dims.tk, dims.tq);
    const keys = b.iota([dims.tk], 0);
    const last =
      typeof offset === 'number' && offset < 0
        ? b.add(b.iota([dims.tq], 0), b.scalar(offset, 'i64'))
        : b.slice(keys, 0, offset, dims.tk);
    const visible = b.lessEqual(b.reshape(keys, [1, dims.tk]), b.reshape(last, [dims.tq, 1]));
    scores = b.where(visible, scores, negInf);
  }
  let probs = b.softmax(scores, -1);
  if (grouped) probs = b.reshape(probs, [...dims.batch, dims.hkv, dimMul(group, dims.tq), dims.tk]);
  const out = b.matmul(probs, v);
  return grouped ? b.reshape(out, [...dims.batch, dims.hq, dims.tq, dims.dv]) : out;
}

/** Reference attention over host tensors (shared with `cachedAttention`). */
export function evalAttention(
  q: HostTensor,
  k: HostTensor,
  v: HostTensor,
  mask: HostTensor | undefined,
  causal: boolean,
  scaleAttr: number | undefined,
): HostTensor {
  const r = q.shape.length;
  const [hq, tq, d] = q.shape.slice(r - 3) as [number, number, number];
  const [hkv, tk] = k.shape.slice(r - 3) as [number, number];
  const dv = v.shape[r - 1]!;
  const nb = sizeOf(q.shape.slice(0, r - 3));
  const group = hq / hkv;
  const scale = scaleAttr ?? 1 / Math.sqrt(d);
  const scoreShape = [...q.shape.slice(0, r - 3), hq, tq, tk];
  const maskStrides = mask === undefined ? undefined : broadcastStrides(mask.shape, scoreShape);
  const outShape = [...q.shape.slice(0, r - 1), dv];
  const out = allocData(q.dtype, sizeOf(outShape));
  const round = rounderFor(q.dtype);
  const scores = new Float64Array(tk);
  const acc = new Float64Array(dv);
  const maskOffset = (b: number, h: number, i: number, j: number): number => {
    // Index into the broadcast mask by decomposing the flat leading batch index.
    let rem = b;
    let off = 0;
    const lead = r - 3;
    for (let ax = lead - 1; ax >= 0; ax--) {
      const size = scoreShape[ax]!;
      off += (rem % size) * maskStrides![ax]!;
      rem = Math.floor(rem / size);
    }
    return off + h * maskStrides![lead]! + i * maskStrides![lead + 1]! + j * maskStrides![lead + 2]!;
  };
  for (let b = 0; b < nb; b++) {
    for (let h = 0; h < hq; h++) {
      const kh = Math.floor(h / group);
      const qBase = (b * hq + h) * tq * d;
      const kBase = (b * hkv + kh) * tk * d;
      const vBase = (b * hkv + kh) * tk * dv;
      for (let i = 0; i < tq; i++) {
        let m = Number.NEGATIVE_INFINITY;
        for (let j = 0; j < tk; j++) {
          let sc: number;
          if (causal && j > i + tk - tq) sc = Number.NEGATIVE_INFINITY;
          else {
            let dot = 0;
            for (let p = 0; p < d; p++) dot += q.data[qBase + i * d + p]! * k.data[kBase + j * d + p]!;
            sc = dot * scale;
            if (mask !== undefined) {
              const mv = mask.data[maskOffset(b, h, i, j)]!;
              if (mask.dtype === 'bool') {
                if (mv === 0) sc = Number.NEGATIVE_INFINITY;
              } else sc += mv;
            }
          }
          scores[j] = sc;
          if (sc > m) m = sc;
        }
        let total = 0;
        for (let j = 0; j < tk; j++) {
          const e = m === Number.NEGATIVE_INFINITY ? Number.NaN : Math.exp(scores[j]! - m);
          scores[j] = e;
          total += e;
        }
        acc.fill(0);
        for (let j = 0; j < tk; j++) {
          const w = scores[j]! / total;
          if (w === 0) continue;
          for (let p = 0; p < dv; p++) acc[p]! += w * v.data[vBase + j * dv + p]!;
        }
        if (tk === 0 || m === Number.NEGATIVE_INFINITY) acc.fill(Number.NaN);
        const oBase = ((b * hq + h) * tq + i) * dv;
        for (let p = 0; p < dv; p++) out[oBase + p] = round(acc[p]!);
      }
    }
  }
  return { dtype: q.dtype, shape: outShape, data: out };
}

/** The largest value below 1 of each float dtype (1 − ulp(1)/2). */
const BELOW_ONE = { f64: 1 - 2 ** -53, f32: 1 - 2 ** -24, f16: 1 - 2 ** -11, bf16: 1 - 2 ** -8 } as const;

/** y ~ U[0, 1) of a shape (never folded ahead of time). */
export const randomUniform = defineOp({
  key: 'randomUniform',
  summary: 'Fresh uniform samples in [0, 1) on every execution; random, so never folded, hoisted or CSE’d.',
  semantics: 'y ~ U[0, 1)^shape',
  operands: [],
  attrs: { shape: attr.dims({}), dtype: attr.dtype({ default: 'f32' }) },
  effect: 'random',
  infer: (_ops, a) => {
    if (a.dtype !== 'f32' && a.dtype !== 'f64' && a.dtype !== 'f16' && a.dtype !== 'bf16') {
      dtypeError('randomUniform', `dtype must be floating point, got ${a.dtype}`);
    }
    for (const d of a.shape) if (typeof d === 'number' && d < 0) throw new IrError(IrCode.BAD_ATTR, 'randomUniform: negative dim');
    return [{ dtype: a.dtype, shape: a.shape }];
  },
  flops: perElementFlops(1),
  evaluate: (_ops, a, ctx) => {
    const shape = a.shape as number[];
    const n = sizeOf(shape);
    const data = allocData(a.dtype, n);
    const round = rounderFor(a.dtype);
    // NOTE: rounding to a narrow float can carry u close to 1 up to 1.0; clamp to the largest
    // value below 1 so samples stay in [0, 1).
    const belowOne = BELOW_ONE[a.dtype as 'f64' | 'f32' | 'f16' | 'bf16'];
    for (let i = 0; i < n; i++) data[i] = Math.min(round(ctx.random()), belowOne);
    return [{ dtype: a.dtype, shape, data }];
  },
});
