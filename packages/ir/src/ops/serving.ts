import { attr } from '../attrs.js';
import type { GraphBuilder, Value } from '../builder.js';
import { type Dim, dimAdd, dimEquals, dimProduct, dimToString } from '../dim.js';
import { allocData, rounderFor } from '../dtype.js';
import { defineOp, evalError, shapeError } from '../op-def.js';
import type { HostTensor } from '../tensor.js';
import { type TensorType, shapeToString } from '../types.js';
import { requireFloat, requireIndex, sameDType } from './common.js';
import { linear } from './linalg.js';
import { attention, attnDims, evalAttention } from './nn.js';

/** How `loraBank` applies its slot factors (see `loraBank`). */
export type LoraBankForm = 'gathered' | 'grouped' | 'single';

/** The operands of a `loraBank` node, by role (`select` only in the grouped and single forms). */
export interface LoraBankOperands<T> {
  readonly x: T;
  readonly base: T;
  readonly A: T;
  readonly B: T;
  readonly index: T;
  readonly select: T | undefined;
}

/** Splits a `loraBank` operand list by role. */
export function loraBankOperands<T>(operands: readonly T[]): LoraBankOperands<T> {
  const [x, base, A, B, index, select] = operands as [T, T, T, T, T, T | undefined];
  return { x, base, A, B, index, select };
}

/** Checks a `loraBank` node's operand types for `form`; returns its result type (base's). */
export function inferLoraBank(types: readonly TensorType[], form: LoraBankForm): TensorType {
  const op = 'loraBank';
  const selected = form !== 'gathered';
  if (types.length !== (selected ? 6 : 5)) {
    shapeError(op, `form '${form}' takes the operands x, base, A, B, index${selected ? ', select' : ''}, got ${String(types.length)}`);
  }
  const t = loraBankOperands(types);
  requireFloat(op, t.x);
  const dtype = sameDType(op, [t.x, t.base, t.A, t.B, ...(t.select === undefined ? [] : [t.select])]);
  requireIndex(op, t.index, 'index');
  if (t.x.shape.length !== 3) shapeError(op, `x must be [rows, seq, in], got ${shapeToString(t.x.shape)}`);
  const [rows, seq, inX] = t.x.shape as [Dim, Dim, Dim];
  if (t.base.shape.length !== 3 || !dimEquals(t.base.shape[0]!, rows) || !dimEquals(t.base.shape[1]!, seq)) shapeError(op, `base must be [${dimToString(rows)}, ${dimToString(seq)}, out], got ${shapeToString(t.base.shape)}`);
  const out = t.base.shape[2]!;
  if (t.A.shape.length !== 3 || !dimEquals(t.A.shape[2]!, inX)) shapeError(op, `A must be [slots, rank, ${dimToString(inX)}], got ${shapeToString(t.A.shape)}`);
  const [slots, rank] = t.A.shape as [Dim, Dim];
  if (t.B.shape.length !== 3 || !dimEquals(t.B.shape[0]!, slots) || !dimEquals(t.B.shape[1]!, rank) || !dimEquals(t.B.shape[2]!, out)) {
    shapeError(op, `B must be [${dimToString(slots)}, ${dimToString(rank)}, ${dimToString(out)}], got ${shapeToString(t.B.shape)}`);
  }
  const idx = t.index.shape;
  if (form === 'gathered' && (idx.length !== 1 || !dimEquals(idx[0]!, rows))) shapeError(op, `gathered: index must be [${dimToString(rows)}] (a slot per row), got ${shapeToString(idx)}`);
  if (form === 'grouped') {
    if (idx.length !== 1) shapeError(op, `grouped: index must be [groups], got ${shapeToString(idx)}`);
    const sel = t.select!.shape;
    if (sel.length !== 2 || !dimEquals(sel[0]!, rows) || !dimEquals(sel[1]!, idx[0]!)) shapeError(op, `grouped: select must be [${dimToString(rows)}, ${dimToString(idx[0]!)}], got ${shapeToString(sel)}`);
  }
  if (form === 'single') {
    if (idx.length !== 0) shapeError(op, `single: index must be a scalar slot, got ${shapeToString(idx)}`);
    const sel = t.select!.shape;
    if (sel.length !== 3 || !dimEquals(sel[0]!, rows) || sel[1] !== 1 || sel[2] !== 1) shapeError(op, `single: select must be [${dimToString(rows)}, 1, 1], got ${shapeToString(sel)}`);
  }
  return { dtype, shape: [...t.base.shape] };
}

/** Reference semantics of `loraBank` over host tensors (float64 accumulation, one rounding). */
export function evalLoraBank(operands: readonly HostTensor[], form: LoraBankForm): HostTensor {
  const t = loraBankOperands(operands);
  const [rows, seq, inDim] = t.x.shape as [number, number, number];
  const out = t.base.shape[2]!;
  const [slots, rank] = t.A.shape as [number, number];
  const x = t.x.data;
  const A = t.A.data;
  const B = t.B.data;
  const slotOf = (v: number): number => {
    if (!Number.isInteger(v) || v < 0 || v >= slots) evalError('loraBank', `slot index ${String(v)} is outside [0, ${String(slots)})`);
    return v;
  };
  // Per row, the (slot, coefficient) terms of its update.
  const terms = (r: number): [number, number][] => {
    if (form === 'gathered') return [[slotOf(Number(t.index.data[r])), 1]];
    if (form === 'single') return [[slotOf(Number(t.index.data[0])), Number(t.select!.data[r])]];
    const groups = t.index.shape[0]!;
    return Array.from({ length: groups }, (_, g): [number, number] => [slotOf(Number(t.index.data[g])), Number(t.select!.data[r * groups + g])]);
  };
  const y = allocData(t.x.dtype, rows * seq * out);
  const round = rounderFor(t.x.dtype);
  const shrink = new Float64Array(rank);
  const acc = new Float64Array(out);
  for (let r = 0; r < rows; r++) {
    const rowTerms = terms(r);
    for (let s = 0; s < seq; s++) {
      const xb = (r * seq + s) * inDim;
      const yb = (r * seq + s) * out;
      for (let o = 0; o < out; o++) acc[o] = Number(t.base.data[yb + o]);
      for (const [slot, c] of rowTerms) {
        if (c === 0) continue;
        for (let k = 0; k < rank; k++) {
          let v = 0;
          const ab = (slot * rank + k) * inDim;
          for (let i = 0; i < inDim; i++) v += x[xb + i]! * A[ab + i]!;
          shrink[k] = c * v;
        }
        for (let k = 0; k < rank; k++) {
          const bb = (slot * rank + k) * out;
          for (let o = 0; o < out; o++) acc[o]! += shrink[k]! * B[bb + o]!;
        }
      }
      for (let o = 0; o < out; o++) y[yb + o] = round(acc[o]!);
    }
  }
  return { dtype: t.x.dtype, shape: [rows, seq, out], data: y };
}

/** `loraBank` in primitive ops: the graph each form ran as before the op existed. */
function decomposeLoraBank(b: GraphBuilder, operands: readonly Value[], form: LoraBankForm): Value[] {
  const t = loraBankOperands(operands);
  return decomposeBank(b, t, form, (index) => b.gather(t.A, index, 0), (index) => b.gather(t.B, index, 0));
}

/**
 * The primitive graph of a bank op whose factor tables are read only through `gatherA(index)` and
 * `gatherB(index)` (the tables' rows of the slots `index` names: [R, ·] for a scalar index,
 * [n, R, ·] for a vector); `t.A` gives the rank R and nothing else is read from the tables, so a
 * quantized bank (`quantizedLoraBank`) dequantizes only the rows it gathers.
 */
export function decomposeBank(b: GraphBuilder, t: LoraBankOperands<Value>, form: LoraBankForm, gatherA: (index: Value) => Value, gatherB: (index: Value) => Value): Value[] {
  const [rows, seq, inDim] = t.x.type.shape as [Dim, Dim, Dim];
  const out = t.base.type.shape[2]!;
  const rank = t.A.type.shape[1]!;
  let update: Value;
  if (form === 'single') {
    const shrink = b.mul(b.linear(t.x, gatherA(t.index)), t.select!);
    update = b.matmul(shrink, gatherB(t.index));
  } else if (form === 'gathered') {
    const shrink = b.matmul(t.x, gatherA(t.index), { transposeB: true });
    update = b.matmul(shrink, gatherB(t.index));
  } else {
    const groups = t.index.type.shape[0]!;
    const onehot = b.reshape(t.select!, [rows, 1, groups, 1]);
    const aFlat = b.reshape(gatherA(t.index), [-1, inDim]);
    const shrink = b.reshape(b.linear(t.x, aFlat), [rows, seq, groups, rank]);
    const own = b.reshape(b.mul(shrink, onehot), [rows, seq, -1]);
    update = b.matmul(own, b.reshape(gatherB(t.index), [-1, out]));
  }
  return [b.add(t.base, update)];
}

/**
 * Per-row low-rank adapter updates drawn from a bank of slot tables, added to a base projection:
 * the serving engine's multi-LoRA linear. With x [rows, seq, in], base [rows, seq, out] (the base
 * layer's output, typically `linear(x, W, bias)`, left to its producer so a quantized or merged
 * base composes), factor tables A [slots, R, in] and B [slots, R, out] (each adapter zero-padded
 * to rank R, its scale s folded into B):
 *
 *   y[r] = base[r] + Σ_g c[r, g] · (x[r]·A[s_g]ᵀ)·B[s_g]
 *
 * The attribute `form` says how rows name their slots:
 * - `gathered`: `index` i64[rows] is each row's slot (one term, c = 1; no `select`): each row
 *   gathers its own factors (BGMV);
 * - `grouped`: `index` i64[groups] lists the batch's distinct slots and `select` [rows, groups]
 *   (a one-hot) says which is each row's (every row multiplied by all G, the mask keeps its own);
 * - `single`: `index` i64[] is the batch's one slot and `select` [rows, 1, 1] is 1 on its rows and
 *   0 on base rows.
 * Its decomposition is exactly the primitive graph each form ran as before the op existed, so an
 * executor without a fused rule computes what it computed then.
 */
export const loraBank = defineOp({
  key: 'loraBank',
  summary: 'Per-row low-rank adapter updates drawn from slot tables and added to a base projection (multi-LoRA serving), in a gathered, grouped or single-slot form.',
  semantics:
    'y[r] = base[r] + Σ_g c[r,g]·(x[r]·A[s_g]ᵀ)·B[s_g]; gathered: s = index[r], c = 1; grouped: s_g = index[g], c = select[r,g]; single: s = index, c = select[r]. zeroTail is a promise of the caller, not a change of meaning: in every slot, the rank rows after the first all-zero row of A are zero in A and B (a rank-r adapter in an R-rank slot, its zero rows moved last), so an executor may stop reading a slot there',
  operands: ['x', 'base', 'A', 'B', 'index', 'select?'],
  attrs: { form: attr.enum(['gathered', 'grouped', 'single'], { default: 'gathered' }), zeroTail: attr.bool({ default: false }) },
  traits: ['contraction'],
  infer: (types, a) => [inferLoraBank(types, a.form)],
  flops: (types, [y], a) => {
    const t = loraBankOperands(types);
    const [rows, seq, inDim] = t.x.shape as [Dim, Dim, Dim];
    const out = y!.shape[2]!;
    const rank = t.A.shape[1]!;
    const groups = a.form === 'grouped' ? t.index.shape[0]! : 1;
    return dimAdd(dimProduct([rows, seq, out]), dimProduct([2, rows, seq, groups, rank, dimAdd(inDim, out)]));
  },
  evaluate: (operands, a) => [evalLoraBank(operands, a.form)],
  decompose: (b, operands, a) => decomposeLoraBank(b, operands, a.form),
});

/**
 * `delta · s` as the residual chains write it, `delta` itself when s = 1 (an unscaled chain; the
 * product would round to `delta` exactly, so leaving it out changes no value).
 */
export function scaledBy(b: GraphBuilder, delta: Value, s: number): Value {
  return s === 1 ? delta : b.mul(delta, b.scalar(s, delta.type.dtype));
}

/** The operands of a `loraLinear` node, by role (the biases only where present). */
export interface LoraLinearOperands<T> {
  readonly x: T;
  readonly w: T;
  readonly A: T;
  readonly B: T;
  /** Bias of the base linear [out]. */
  readonly bias: T | undefined;
  /** Bias of B [out] (PEFT's `lora_bias`), scaled with the delta. */
  readonly biasB: T | undefined;
}

/**
 * Splits a `loraLinear` operand list (x, w, A, B[, bias][, biasB]) by role: `loraBias` says whether
 * the last operand after B is B's bias, so a fifth operand is the base's bias unless it is set.
 */
export function loraLinearOperands<T>(operands: readonly T[], loraBias: boolean): LoraLinearOperands<T> {
  const [x, w, A, B] = operands as [T, T, T, T];
  const extra = operands.slice(4);
  const biasB = loraBias ? extra[extra.length - 1] : undefined;
  const bias = extra.length === 2 || (extra.length === 1 && !loraBias) ? extra[0] : undefined;
  return { x, w, A, B, bias, biasB };
}

/** Checks a `loraLinear` node's operand types; returns its result type. */
function inferLoraLinear(types: readonly TensorType[], loraBias: boolean): TensorType {
  const op = 'loraLinear';
  if (loraBias && types.length === 4) shapeError(op, 'loraBias says the last operand is B’s bias, but there are only x, w, A and B');
  if (!loraBias && types.length === 6) shapeError(op, 'six operands (x, w, A, B, bias, biasB) need loraBias: true');
  const { x, w, A, B, bias, biasB } = loraLinearOperands(types, loraBias);
  requireFloat(op, x);
  const dtype = sameDType(op, [x, w, A, B, ...[bias, biasB].filter((t) => t !== undefined)]);
  if (x.shape.length < 1) shapeError(op, `x must be [..., in], got ${shapeToString(x.shape)}`);
  const inX = x.shape[x.shape.length - 1]!;
  if (w.shape.length !== 2 || !dimEquals(w.shape[1]!, inX)) shapeError(op, `w must be [out, ${dimToString(inX)}], got ${shapeToString(w.shape)}`);
  const out = w.shape[0]!;
  if (A.shape.length !== 2 || !dimEquals(A.shape[1]!, inX)) shapeError(op, `A must be [rank, ${dimToString(inX)}], got ${shapeToString(A.shape)}`);
  const rank = A.shape[0]!;
  if (B.shape.length !== 2 || !dimEquals(B.shape[0]!, out) || !dimEquals(B.shape[1]!, rank)) shapeError(op, `B must be [${dimToString(out)}, ${dimToString(rank)}], got ${shapeToString(B.shape)}`);
  for (const [what, t] of [['bias', bias], ['biasB', biasB]] as const) {
    if (t !== undefined && (t.shape.length !== 1 || !dimEquals(t.shape[0]!, out))) shapeError(op, `${what} must be [${dimToString(out)}], got ${shapeToString(t.shape)}`);
  }
  return { dtype, shape: [...x.shape.slice(0, -1), out] };
}

/**
 * A linear layer with one LoRA adapter in residual form, PEFT's `lora.Linear` at inference: with
 * x [..., in], w [out, in], A [r, in], B [out, r], the optional biases bias and biasB [out] (the
 * base layer's, and B's when PEFT's `lora_bias` is on; the attribute `loraBias` says which one a
 * lone fifth operand is) and the scale s an attribute,
 *
 *   y = x·wᵀ + bias + s·((x·Aᵀ)·Bᵀ + biasB)
 *
 * What a staged residual keeps of a LoRA layer the plan leaves unmerged (`@stageml/peft`'s
 * `loraLinear`, folded into this op by `@stageml/kernel-patterns`' serving rules). Its
 * decomposition is exactly the primitive chain `add(linear(x, w, bias), mul(linear(linear(x, A), B, biasB), s))`
 * (s a scalar constant of the operands' dtype; no `mul` when s = 1), so an executor without a rule for it computes what
 * it computed before the op existed; its reference semantics rounds where that chain rounds.
 */
export const loraLinear = defineOp({
  key: 'loraLinear',
  summary: 'A linear layer plus one LoRA adapter in residual form (x·wᵀ + bias + s·((x·Aᵀ)·Bᵀ + biasB)), the scale an attribute and both biases optional.',
  semantics: 'y = x·wᵀ + bias + s·((x·Aᵀ)·Bᵀ + biasB); x [..., in], w [out, in], A [r, in], B [out, r], bias and biasB [out] optional (loraBias: the last operand is biasB)',
  operands: ['x', 'w', 'A', 'B', 'bias?', 'biasB?'],
  attrs: { scale: attr.float({}), loraBias: attr.bool({ default: false }) },
  traits: ['contraction'],
  infer: (types, a) => [inferLoraLinear(types, a.loraBias)],
  flops: (types, [y], a) => {
    const { x, w, A, bias, biasB } = loraLinearOperands(types, a.loraBias);
    const rows = dimProduct(x.shape.slice(0, -1));
    const [out, inDim] = w.shape as [Dim, Dim];
    const rank = A.shape[0]!;
    const biases = (bias === undefined ? 0 : 1) + (biasB === undefined ? 0 : 1);
    return dimAdd(dimAdd(dimProduct([2, rows, out, inDim]), dimAdd(dimProduct([2, rows, rank, dimAdd(inDim, out)]), dimProduct([2, ...y!.shape]))), dimProduct([biases, rows, out]));
  },
  evaluate: (operands, a, ctx) => {
    const t = loraLinearOperands(operands, a.loraBias);
    // The chain's rounding points: each linear (with its bias), the scaled delta, the sum.
    const base = linear.evaluate(t.bias === undefined ? [t.x, t.w] : [t.x, t.w, t.bias], {}, ctx)[0]!;
    const shrink = linear.evaluate([t.x, t.A], {}, ctx)[0]!;
    const delta = linear.evaluate(t.biasB === undefined ? [shrink, t.B] : [shrink, t.B, t.biasB], {}, ctx)[0]!;
    const round = rounderFor(t.x.dtype);
    const s = round(a.scale);
    const y = allocData(t.x.dtype, base.data.length);
    for (let i = 0; i < y.length; i++) y[i] = round(Number(base.data[i]) + round(Number(delta.data[i]) * s));
    return [{ dtype: t.x.dtype, shape: [...base.shape], data: y }];
  },
  decompose: (b, operands, a) => {
    const t = loraLinearOperands(operands, a.loraBias);
    return [b.add(b.linear(t.x, t.w, t.bias), scaledBy(b, b.linear(b.linear(t.x, t.A), t.B, t.biasB), a.scale))];
  },
});

/** Checks a `cachedAttention` node's operands; returns q's, the joined keys' and values' types. */
function cachedAttentionTypes(q: TensorType, pastK: TensorType, pastV: TensorType, k: TensorType, v: TensorType): { keys: TensorType; values: TensorType } {
  const op = 'cachedAttention';
  const joined = (past: TensorType, step: TensorType, what: string): TensorType => {
    const r = step.shape.length;
    if (r < 3 || past.shape.length !== r) shapeError(op, `past ${what} ${shapeToString(past.shape)} and ${what} ${shapeToString(step.shape)} must have one rank ≥ 3`);
    const [p, h, d] = past.shape.slice(r - 3) as [Dim, Dim, Dim];
    const [hs, , ds] = step.shape.slice(r - 3) as [Dim, Dim, Dim];
    const lead = past.shape.slice(0, r - 3);
    if (!lead.every((x, i) => dimEquals(x, step.shape[i]!)) || !dimEquals(h, hs) || !dimEquals(d, ds)) {
      shapeError(op, `past ${what} [..., past, heads, dim] ${shapeToString(past.shape)} does not match ${what} [..., heads, seq, dim] ${shapeToString(step.shape)}`);
    }
    return { dtype: step.dtype, shape: [...lead, h, dimAdd(p, step.shape[r - 2]!), d] };
  };
  sameDType(op, [q, pastK, pastV, k, v]);
  return { keys: joined(pastK, k, 'keys'), values: joined(pastV, v, 'values') };
}

/** [..., past, heads, dim] → [..., heads, past, dim] of a host tensor. */
function headMajor(t: HostTensor): HostTensor {
  const r = t.shape.length;
  const [p, h, d] = t.shape.slice(r - 3) as [number, number, number];
  const outer = t.shape.slice(0, r - 3).reduce((a, b) => a * b, 1);
  const data = allocData(t.dtype, t.data.length);
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < p; i++) for (let j = 0; j < h; j++) for (let c = 0; c < d; c++) data[((o * h + j) * p + i) * d + c] = t.data[((o * p + i) * h + j) * d + c]!;
  }
  return { dtype: t.dtype, shape: [...t.shape.slice(0, r - 3), h, p, d], data };
}

/** Past ‖ new along the key axis (-2) of head-major host tensors. */
function joinKeys(past: HostTensor, step: HostTensor): HostTensor {
  const r = step.shape.length;
  const [h, p, d] = past.shape.slice(r - 3) as [number, number, number];
  const s = step.shape[r - 2]!;
  const outer = past.shape.slice(0, r - 3).reduce((a, b) => a * b, 1) * h;
  const data = allocData(step.dtype, outer * (p + s) * d);
  for (let o = 0; o < outer; o++) {
    data.set(past.data.subarray(o * p * d, (o + 1) * p * d), o * (p + s) * d);
    data.set(step.data.subarray(o * s * d, (o + 1) * s * d), (o * (p + s) + p) * d);
  }
  return { dtype: step.dtype, shape: [...step.shape.slice(0, r - 2), p + s, d], data };
}

/**
 * Attention of a step's queries over a resident KV cache plus the step's own keys and values: the
 * serving engine's decoder attention. The cache is position-major, pastK/pastV [..., past, hkv, d]
 * (how executors append to it), the step's q [..., hq, seq, d] and k/v [..., hkv, seq, d] head-major:
 *
 *   y = attention(q, [pastKᵀ ‖ k], [pastVᵀ ‖ v], mask)   (ᵀ: [..., past, h, d] → [..., h, past, d])
 *
 * with `attention`'s causal alignment (query i sees key j iff j ≤ i + past) and mask over the
 * past + seq keys. Its decomposition is the transpose + concat + attention graph; an executor that
 * owns the cache reads it in place instead.
 */
export const cachedAttention = defineOp({
  key: 'cachedAttention',
  summary: 'Attention of a step’s queries over a position-major resident KV cache followed by the step’s own keys and values, with grouped-query heads, causal alignment to the end and an optional mask.',
  semantics: 'y = softmax(q·[pastKᵀ ‖ k]ᵀ·scale + mask) · [pastVᵀ ‖ v]; pastK, pastV [..., past, h, d] → [..., h, past, d]',
  operands: ['q', 'pastK', 'pastV', 'k', 'v', 'mask?'],
  attrs: { causal: attr.bool({ default: false }), scale: attr.float({ optional: true }) },
  infer: ([q, pk, pv, k, v, mask], a) => {
    requireFloat('cachedAttention', q!);
    const { keys, values } = cachedAttentionTypes(q!, pk!, pv!, k!, v!);
    return attention.infer(mask === undefined ? [q!, keys, values] : [q!, keys, values, mask], { causal: a.causal, ...(a.scale === undefined ? {} : { scale: a.scale }) });
  },
  flops: ([q, pk, pv, k, v]) => {
    const { keys, values } = cachedAttentionTypes(q!, pk!, pv!, k!, v!);
    const x = attnDims(q!, keys, values);
    const perPair = dimAdd(dimProduct([2, x.d]), dimProduct([2, x.dv]));
    return dimProduct([...x.batch, x.hq, x.tq, x.tk, dimAdd(perPair, 5)]);
  },
  evaluate: ([q, pk, pv, k, v, mask], a) => [evalAttention(q!, joinKeys(headMajor(pk!), k!), joinKeys(headMajor(pv!), v!), mask, a.causal, a.scale)],
  decompose: (b, operands, a) => [decomposeCachedAttention(b, operands, a.causal, a.scale)],
});


/** `cachedAttention` in ops: the cache transposed to head-major, joined to the step's keys and values, then `attention`. */
function decomposeCachedAttention(b: GraphBuilder, [q, pk, pv, k, v, mask]: readonly Value[], causal: boolean, scale: number | undefined): Value {
  const r = k!.type.shape.length;
  const perm = [...Array.from({ length: r - 3 }, (_, i) => i), r - 2, r - 3, r - 1];
  const keys = b.concat([b.transpose(pk!, perm), k!], r - 2);
  const values = b.concat([b.transpose(pv!, perm), v!], r - 2);
  return b.op('attention', mask === undefined ? [q!, keys, values] : [q!, keys, values, mask], { causal, ...(scale === undefined ? {} : { scale }) });
}
