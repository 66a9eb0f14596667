import { attr } from '../attrs.js';
import type { GraphBuilder, Value } from '../builder.js';
import { type Dim, dimAdd, dimEquals, dimProduct } from '../dim.js';
import { allocData, rounderFor } from '../dtype.js';
import { defineOp, dtypeError, shapeError } from '../op-def.js';
import type { HostTensor } from '../tensor.js';
import { type TensorType, shapeToString } from '../types.js';
import { type LoraBankForm, type LoraBankOperands, decomposeBank, evalLoraBank, inferLoraBank } from './serving.js';

/** The operands of a `quantizedLoraBank` node, by role (`select` only in the grouped and single forms). */
export interface QuantizedLoraBankOperands<T> extends LoraBankOperands<T> {
  /** Per-row scales of A: [slots, R]. */
  readonly aScale: T;
  /** Per-row scales of B: [slots, R]. */
  readonly bScale: T;
}

/** Splits a `quantizedLoraBank` operand list (x, base, A, aScale, B, bScale, index, select?) by role. */
export function quantizedLoraBankOperands<T>(operands: readonly T[]): QuantizedLoraBankOperands<T> {
  const [x, base, A, aScale, B, bScale, index, select] = operands as [T, T, T, T, T, T, T, T | undefined];
  return { x, base, A, aScale, B, bScale, index, select };
}

const OP = 'quantizedLoraBank';

function inferQuantizedLoraBank(types: readonly TensorType[], form: LoraBankForm): TensorType {
  const selected = form !== 'gathered';
  if (types.length !== (selected ? 8 : 7)) shapeError(OP, `form '${form}' takes the operands x, base, A, aScale, B, bScale, index${selected ? ', select' : ''}, got ${String(types.length)}`);
  const t = quantizedLoraBankOperands(types);
  for (const [what, f] of [['A', t.A], ['B', t.B]] as const) if (f.dtype !== 'i8') dtypeError(OP, `${what} must hold i8 codes, got ${f.dtype}`);
  for (const [what, s, f] of [['aScale', t.aScale, t.A], ['bScale', t.bScale, t.B]] as const) {
    if (s.dtype !== t.x.dtype) dtypeError(OP, `${what} must have x's dtype ${t.x.dtype}, got ${s.dtype}`);
    if (f.shape.length !== 3 || s.shape.length !== 2 || !dimEquals(s.shape[0]!, f.shape[0]!) || !dimEquals(s.shape[1]!, f.shape[1]!)) {
      shapeError(OP, `${what} must be [slots, rank] of its table ${shapeToString(f.shape)}, got ${shapeToString(s.shape)}`);
    }
  }
  // The rest is `loraBank`'s rule over the dequantized tables (x's dtype, the codes' shapes).
  const dq = (f: TensorType): TensorType => ({ dtype: t.x.dtype, shape: f.shape });
  return inferLoraBank([t.x, t.base, dq(t.A), dq(t.B), t.index, ...(t.select === undefined ? [] : [t.select])], form);
}

/** A table's codes times its per-row scales, rounded to `dtype` (the dequantized table). */
function dequantizeTable(codes: HostTensor, scales: HostTensor, dtype: HostTensor['dtype']): HostTensor {
  const width = codes.shape[2]!;
  const rows = scales.data.length;
  if (codes.data.length !== rows * width) shapeError(OP, `codes ${shapeToString(codes.shape)} and scales ${shapeToString(scales.shape)} disagree at run time`);
  const round = rounderFor(dtype);
  const data = allocData(dtype, codes.data.length);
  for (let r = 0; r < rows; r++) {
    const s = Number(scales.data[r]);
    for (let i = r * width; i < (r + 1) * width; i++) data[i] = round(Number(codes.data[i]) * s);
  }
  return { dtype, shape: [...codes.shape], data };
}

/** Gathers a quantized table's rows of `index` and dequantizes them: codes·scale in x's dtype. */
function gatherDequantized(b: GraphBuilder, codes: Value, scales: Value, index: Value, dtype: Value['type']['dtype']): Value {
  const rank = codes.type.shape[1]!;
  const rows = b.cast(b.gather(codes, index, 0), dtype);
  const s = b.gather(scales, index, 0);
  // A scalar index gathers [R, ·] rows and [R] scales; a vector one [n, R, ·] and [n, R].
  return b.mul(rows, b.reshape(s, index.type.shape.length === 0 ? [rank, 1] : [-1, rank, 1]));
}

/**
 * `loraBank` over int8 factor tables with a scale per rank row: with A i8 [slots, R, in], aScale
 * [slots, R], B i8 [slots, R, out] and bScale [slots, R] (scales in x's dtype), the tables it
 * stands for are
 *
 *   Â[s, k, i] = A[s, k, i] · aScale[s, k],   B̂[s, k, o] = B[s, k, o] · bScale[s, k]
 *
 * and y is `loraBank(form, x, base, Â, B̂, index, select)` (same forms, same `zeroTail` promise: a
 * slot's rank rows after its first all-zero row of codes are zero). The bytes a step reads per
 * factor element are 1 instead of 4 (f32), plus 2 scales per rank row. Its decomposition gathers
 * each named slot's codes and scales, dequantizes only those rows, and continues as `loraBank`'s.
 */
export const quantizedLoraBank = defineOp({
  key: 'quantizedLoraBank',
  summary: 'Per-row low-rank adapter updates from int8 slot tables with per-rank-row scales, added to a base projection (compressed multi-LoRA serving).',
  semantics:
    "y = loraBank(form, x, base, Â, B̂, index, select) with Â[s,k,i] = A[s,k,i]·aScale[s,k] and B̂[s,k,o] = B[s,k,o]·bScale[s,k] (A, B i8 codes; dequantized values rounded to x's dtype); zeroTail as loraBank's, over the codes",
  operands: ['x', 'base', 'A', 'aScale', 'B', 'bScale', 'index', 'select?'],
  attrs: { form: attr.enum(['gathered', 'grouped', 'single'], { default: 'gathered' }), zeroTail: attr.bool({ default: false }) },
  traits: ['contraction'],
  infer: (types, a) => [inferQuantizedLoraBank(types, a.form)],
  flops: (types, [y], a) => {
    const t = quantizedLoraBankOperands(types);
    const [rows, seq, inDim] = t.x.shape as [Dim, Dim, Dim];
    const out = y!.shape[2]!;
    const rank = t.A.shape[1]!;
    const groups = a.form === 'grouped' ? t.index.shape[0]! : 1;
    // loraBank's, plus one multiply per factor element read (the dequantization).
    return dimAdd(dimProduct([rows, seq, out]), dimProduct([3, rows, seq, groups, rank, dimAdd(inDim, out)]));
  },
  evaluate: (operands, a) => {
    const t = quantizedLoraBankOperands(operands);
    const dtype = t.x.dtype;
    const A = dequantizeTable(t.A, t.aScale, dtype);
    const B = dequantizeTable(t.B, t.bScale, dtype);
    return [evalLoraBank([t.x, t.base, A, B, t.index, ...(t.select === undefined ? [] : [t.select])], a.form)];
  },
  decompose: (b, operands, a) => {
    const t = quantizedLoraBankOperands(operands);
    const dtype = t.x.type.dtype;
    return decomposeBank(b, t, a.form, (index) => gatherDequantized(b, t.A, t.aScale, index, dtype), (index) => gatherDequantized(b, t.B, t.bScale, index, dtype));
  },
});
