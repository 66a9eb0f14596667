import { attr } from '../attrs.js';
import { type Dim, dimAdd, dimEquals, dimProduct } from '../dim.js';
import { defineOp, shapeError } from '../op-def.js';
import { type TensorType, shapeToString } from '../types.js';
import { requireFloat, requireRank, sameDType } from './common.js';
import { add } from './elementwise.js';
import { linear } from './linalg.js';
import { rmsNorm } from './reduce.js';
import { type LoraBankForm, evalLoraBank, inferLoraBank, loraBank } from './serving.js';

/** The operands of a `loraBankLinear` node, by role (`select` only in the grouped and single forms). */
export interface LoraBankLinearOperands<T> {
  readonly x: T;
  readonly w: T;
  readonly bias: T | undefined;
  readonly A: T;
  readonly B: T;
  readonly index: T;
  readonly select: T | undefined;
}

/**
 * Splits a `loraBankLinear` operand list (x, w, A, B, index[, select][, bias]) by role: the form
 * says whether `select` is there (grouped and single: yes), so an operand after the form's last
 * one is the bias.
 */
export function loraBankLinearOperands<T>(operands: readonly T[], form: LoraBankForm): LoraBankLinearOperands<T> {
  const selected = form !== 'gathered';
  const [x, w, A, B, index] = operands as [T, T, T, T, T];
  const select = selected ? operands[5] : undefined;
  const bias = operands[selected ? 6 : 5];
  return { x, w, bias, A, B, index, select };
}

/** The `loraBank` operands a `loraBankLinear` stands for, with `base` its linear's result. */
function bankOperands<T>(t: LoraBankLinearOperands<T>, base: T): T[] {
  return [t.x, base, t.A, t.B, t.index, ...(t.select === undefined ? [] : [t.select])];
}

function inferLoraBankLinear(types: readonly TensorType[], form: LoraBankForm): TensorType {
  const required = form === 'gathered' ? 5 : 6;
  if (types.length !== required && types.length !== required + 1) {
    shapeError('loraBankLinear', `form '${form}' takes the operands x, w, A, B, index${form === 'gathered' ? '' : ', select'} and an optional bias, got ${String(types.length)}`);
  }
  const t = loraBankLinearOperands(types, form);
  const base = linear.infer([t.x, t.w, ...(t.bias === undefined ? [] : [t.bias])], {})[0]!;
  return inferLoraBank(bankOperands(t, base), form);
}

/**
 * A base linear layer and its per-row low-rank adapter updates from slot tables, in one op: with
 * x [rows, seq, in], w [out, in], an optional bias [out] and the tables, index and select of
 * `loraBank` (same forms),
 *
 *   y = loraBank(form, x, linear(x, w, bias), A, B, index, select)
 *
 * The serving engine's slot projection when its base is a plain linear: an executor that has a
 * kernel computing x·wᵀ and the update together (the torch worker's bank kernel) binds it by this
 * op's name, with no need to find out what produced a `loraBank`'s base; every other executor
 * expands it into that linear and a `loraBank`, exactly the graph the engine emitted before the op
 * existed. Its reference semantics rounds where that pair rounds (the linear's result, then the
 * bank's one rounding).
 */
export const loraBankLinear = defineOp({
  key: 'loraBankLinear',
  summary: 'A linear layer plus per-row low-rank adapter updates drawn from slot tables (multi-LoRA serving with the base projection inside), in the forms of loraBank.',
  semantics: 'y = loraBank(form, x, x·wᵀ + bias, A, B, index, select); operands x, w, A, B, index[, select][, bias] (select present in the grouped and single forms)',
  operands: ['x', 'w', 'A', 'B', 'index', 'select?', 'bias?'],
  attrs: { form: attr.enum(['gathered', 'grouped', 'single'], { default: 'gathered' }), zeroTail: attr.bool({ default: false }) },
  traits: ['contraction'],
  infer: (types, a) => [inferLoraBankLinear(types, a.form)],
  flops: (types, [y], a) => {
    const t = loraBankLinearOperands(types, a.form);
    const [rows, seq, inDim] = t.x.shape as [Dim, Dim, Dim];
    const out = y!.shape[2]!;
    const base = dimProduct([2, rows, seq, out, inDim]);
    const bank = loraBank.cost(bankOperands<TensorType>(t, y!), [y!], a).flops;
    return dimAdd(t.bias === undefined ? base : dimAdd(base, dimProduct([rows, seq, out])), bank);
  },
  evaluate: (operands, a, ctx) => {
    const t = loraBankLinearOperands(operands, a.form);
    const base = linear.evaluate([t.x, t.w, ...(t.bias === undefined ? [] : [t.bias])], {}, ctx)[0]!;
    return [evalLoraBank(bankOperands(t, base), a.form)];
  },
  decompose: (b, operands, a) => {
    const t = loraBankLinearOperands(operands, a.form);
    const base = b.linear(t.x, t.w, t.bias);
    return [b.loraBank(a.form, t.x, base, t.A, t.B, t.index, t.select, { zeroTail: a.zeroTail })];
  },
});

function inferSkipRmsNorm([x, residual, w]: readonly TensorType[]): TensorType[] {
  const op = 'skipRmsNorm';
  requireFloat(op, x!);
  requireRank(op, x!, 1);
  sameDType(op, w === undefined ? [x!, residual!] : [x!, residual!, w]);
  if (residual!.shape.length !== x!.shape.length || !x!.shape.every((d, i) => dimEquals(d, residual!.shape[i]!))) {
    shapeError(op, `x ${shapeToString(x!.shape)} and residual ${shapeToString(residual!.shape)} must have one shape`);
  }
  const normed = rmsNorm.infer(w === undefined ? [x!] : [x!, w], { eps: 1e-6 })[0]!;
  return [x!, normed];
}

/**
 * A residual add and the RMS normalization of its sum, in one op (the transformer block's
 * `h = x + residual; rmsNorm(h)`): with x and residual of one shape and an optional weight over the
 * last axis,
 *
 *   sum = x + residual,   y = sum / √(mean_{last}(sum²) + ε) · w
 *
 * Both results are used: the sum is the residual stream, y the next sub-layer's input. ONNX Runtime
 * lowers it to its `SkipSimplifiedLayerNormalization` kernel (one pass over the row); every other
 * executor expands it into exactly the `add` and `rmsNorm` the model graph held before the op
 * existed (and fuses or expands the `rmsNorm` as it always did).
 */
export const skipRmsNorm = defineOp({
  key: 'skipRmsNorm',
  summary: 'A residual add followed by root-mean-square normalization of the sum, returning both the sum and the normalized value.',
  semantics: 'sum = x + residual; y = sum / √(mean_{last}(sum²) + ε) · w; results (sum, y)',
  operands: ['x', 'residual', 'weight?'],
  attrs: { eps: attr.float({ default: 1e-6 }) },
  results: 2,
  infer: (types) => inferSkipRmsNorm(types),
  flops: ([x]) => dimProduct([5, ...x!.shape]),
  evaluate: ([x, residual, w], a, ctx) => {
    const sum = add.evaluate([x!, residual!], {}, ctx)[0]!;
    const y = rmsNorm.evaluate(w === undefined ? [sum] : [sum, w], { eps: a.eps }, ctx)[0]!;
    return [sum, y];
  },
  decompose: (b, [x, residual, w], a) => {
    const sum = b.add(x!, residual!);
    return [sum, b.rmsNorm(sum, w, a.eps)];
  },
});
