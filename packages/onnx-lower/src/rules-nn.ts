import { type Dim, dimDivExact, dimSub } from '@stageml/ir';

import { SLICE_END } from './builder.js';
import { ElemType, computeType } from './dtypes.js';
import { lowering } from './rule.js';
import { swapLast } from './rules-linalg.js';

/**
 * y = x·cos + rot(x)·sin. Half-split pairs: rot(x) = [−x₂, x₁] by two Slices, Neg and Concat;
 * interleaved pairs: rot(x)_{2i} = −x_{2i+1}, rot(x)_{2i+1} = x_{2i} by strided Slices, stacked
 * on a new last axis and reshaped back to x's shape.
 */
export const rotary = lowering<'rotary'>(({ b, inputs, operands, attrs }) => {
  const [x, cos, sin] = inputs as [string, string, string];
  const last = b.int64s([-1]);
  const part = (start: Dim, end: string, step: number): string => b.op('Slice', [x, b.dim(start), end, last, b.int64s([step])]);
  let rot: string;
  if (attrs.interleaved) {
    const even = part(0, b.int64s([SLICE_END]), 2);
    const odd = part(1, b.int64s([SLICE_END]), 2);
    const pairs = b.op('Concat', [b.op('Unsqueeze', [b.op('Neg', [odd]), last]), b.op('Unsqueeze', [even, last])], { axis: -1 });
    rot = b.op('Reshape', [pairs, b.op('Shape', [x])]);
  } else {
    const xs = operands[0]!.shape;
    const half = dimDivExact(xs[xs.length - 1]!, 2)!;
    const lo = part(0, b.dim(half), 1);
    const hi = part(half, b.int64s([SLICE_END]), 1);
    rot = b.op('Concat', [b.op('Neg', [hi]), lo], { axis: -1 });
  }
  return [b.op('Add', [b.op('Mul', [x, cos]), b.op('Mul', [rot, sin])])];
});

/**
 * Scaled dot-product attention: softmax(q·kᵀ·scale + mask) · v. Grouped-query heads are not
 * materialized: q is viewed as [..., kv_heads, group, tq, d] and k, v as [..., kv_heads, 1, tk, d],
 * so MatMul broadcasts each kv head over its group. The causal mask (key j visible to query i iff
 * j ≤ i + tk − tq) is built at run time from Range; boolean masks select −∞, float masks add.
 */
export const attention = lowering<'attention'>(({ b, inputs, operands, attrs }) => {
  const [q, k, v, mask] = inputs;
  const [qt, kt, vt] = operands as [(typeof operands)[number], (typeof operands)[number], (typeof operands)[number]];
  const r = qt.shape.length;
  const lead = qt.shape.slice(0, r - 3);
  const [hq, tq, d] = qt.shape.slice(r - 3).map((x) => b.resolve(x)) as [Dim, Dim, Dim];
  const [hkv, tk] = kt.shape.slice(r - 3).map((x) => b.resolve(x)) as [Dim, Dim];
  const dv = vt.shape[r - 1]!;
  const t = computeType(qt.dtype);
  const scale =
    attrs.scale !== undefined ? b.scalar(attrs.scale, t) : typeof d === 'number' ? b.scalar(1 / Math.sqrt(d), t) : b.op('Reciprocal', [b.op('Sqrt', [b.cast(b.dim(d), t)])]);
  const group = dimDivExact(hq, hkv)!;
  const grouped = group !== 1;
  const kvView = (x: string): string => (grouped ? b.op('Unsqueeze', [x, b.int64s([r - 2])]) : x);
  const qs = b.op('Mul', [q!, scale]);
  const qv = grouped ? b.op('Reshape', [qs, b.shape([...lead, hkv, group, tq, d])], { allowzero: 1 }) : qs;
  let scores = b.op('MatMul', [qv, swapLast(b, kvView(k!), grouped ? r + 1 : r)]);
  if (grouped) scores = b.op('Reshape', [scores, b.shape([...lead, hq, tq, tk])], { allowzero: 1 });
  const negInf = b.scalar(Number.NEGATIVE_INFINITY, t);
  if (attrs.causal) {
    const one = b.scalar(1, ElemType.INT64);
    const zero = b.scalar(0, ElemType.INT64);
    const rows = b.op('Unsqueeze', [b.op('Range', [zero, b.dimScalar(tq), one]), b.int64s([-1])]);
    const cols = b.op('Range', [zero, b.dimScalar(tk), one]);
    const visible = b.op('LessOrEqual', [cols, b.op('Add', [rows, b.dimScalar(dimSub(tk, tq))])]);
    scores = b.op('Where', [visible, scores, negInf]);
  }
  if (mask !== undefined) scores = operands[3]!.dtype === 'bool' ? b.op('Where', [mask, scores, negInf]) : b.op('Add', [scores, mask]);
  let probs = b.op('Softmax', [scores], { axis: -1 });
  if (grouped) probs = b.op('Reshape', [probs, b.shape([...lead, hkv, group, tq, tk])], { allowzero: 1 });
  const out = b.op('MatMul', [probs, kvView(v!)]);
  return [grouped ? b.op('Reshape', [out, b.shape([...lead, hq, tq, dv])], { allowzero: 1 }) : out];
});
