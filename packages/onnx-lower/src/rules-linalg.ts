import { type DType, normalizeAxis } from '@stageml/ir';

import type { OnnxGraphBuilder } from './builder.js';
import { ElemType, computeType, isFloat } from './dtypes.js';
import { exactLowering, lowering } from './rule.js';

/** Swaps the last two axes of a rank-`rank` tensor. */
export function swapLast(b: OnnxGraphBuilder, x: string, rank: number): string {
  const perm = Array.from({ length: rank }, (_, i) => i);
  perm[rank - 2] = rank - 1;
  perm[rank - 1] = rank - 2;
  return b.op('Transpose', [x], { perm });
}

/** y = op(a)·op(b): MatMul (numpy batch broadcasting) after the requested transposes. */
export const matmul = lowering<'matmul'>(({ b, inputs, operands, attrs }) => {
  const a = attrs.transposeA ? swapLast(b, inputs[0]!, operands[0]!.shape.length) : inputs[0]!;
  const w = attrs.transposeB ? swapLast(b, inputs[1]!, operands[1]!.shape.length) : inputs[1]!;
  return [b.op('MatMul', [a, w])];
});

/**
 * y = x·wᵀ + bias as MatMul(x, Transpose(w)) (+ Add): the transpose of a constant weight is folded
 * by the runtime's constant folding, and MatMul takes any rank of x.
 */
export const linear = lowering<'linear'>(({ b, inputs }) => {
  const y = b.op('MatMul', [inputs[0]!, b.op('Transpose', [inputs[1]!], { perm: [1, 0] })]);
  return [inputs[2] === undefined ? y : b.op('Add', [y, inputs[2]])];
});

/**
 * y[n] = x[n]·w[g_n]: the rows' matrices are gathered (Gather of w by the groups) and multiplied
 * as a batch of [1, k]·[k, m] products. Reads exactly the matrices the rows use, which is what
 * decode steps (a few rows) want; a prefill of many rows pays one copy of a matrix per row.
 */
export const groupedMatmul = lowering<'groupedMatmul'>(({ b, inputs, attrs }) => {
  const w = attrs.transposeW ? b.op('Transpose', [inputs[1]!], { perm: [0, 2, 1] }) : inputs[1]!;
  const rows = b.op('Gather', [w, inputs[2]!], { axis: 0 });
  const x = b.op('Unsqueeze', [inputs[0]!, b.int64s([1])]);
  return [b.op('Squeeze', [b.op('MatMul', [x, rows]), b.int64s([1])])];
});

function axesOf(axes: readonly number[], rank: number): number[] {
  return [...new Set(axes.map((a) => normalizeAxis(a, rank)))].sort((p, q) => p - q);
}

function reduce(b: OnnxGraphBuilder, opType: string, x: string, axes: readonly number[], keepDims: boolean): string {
  // An empty axes list reduces every axis (noop_with_empty_axes = 0).
  return b.op(opType, axes.length === 0 ? [x] : [x, b.int64s(axes)], { keepdims: keepDims ? 1 : 0 });
}

/** Σ over axes (all when empty). */
export const sum = lowering<'sum'>(({ b, inputs, operands, attrs }) => [reduce(b, 'ReduceSum', inputs[0]!, axesOf(attrs.axes, operands[0]!.shape.length), attrs.keepDims)]);

/** Mean over axes (all when empty). */
export const mean = lowering<'mean'>(({ b, inputs, operands, attrs }) => [reduce(b, 'ReduceMean', inputs[0]!, axesOf(attrs.axes, operands[0]!.shape.length), attrs.keepDims)]);

/** NaN where any reduced element is NaN (the IR propagates NaN; ONNX leaves it to the runtime). */
function anyNaN(b: OnnxGraphBuilder, x: string, axes: readonly number[], keepDims: boolean): string {
  const flags = b.cast(b.op('IsNaN', [x]), ElemType.INT32);
  return b.op('Greater', [reduce(b, 'ReduceMax', flags, axes, keepDims), b.scalar(0, ElemType.INT32)]);
}

/** Max over axes (all when empty); NaN propagates. */
export const max = exactLowering<'max'>(({ b, inputs, operands, attrs }) => {
  const dtype = operands[0]!.dtype;
  const axes = axesOf(attrs.axes, operands[0]!.shape.length);
  const m = reduce(b, 'ReduceMax', inputs[0]!, axes, attrs.keepDims);
  if (!isFloat(dtype)) return [m];
  return [b.op('Where', [anyNaN(b, inputs[0]!, axes, attrs.keepDims), b.scalar(Number.NaN, computeType(dtype)), m])];
});

/** Index of the first maximum; the first NaN counts as the maximum, as in the IR. */
export const argmax = exactLowering<'argmax'>(({ b, inputs, operands, attrs }) => {
  const dtype: DType = operands[0]!.dtype;
  const axis = normalizeAxis(attrs.axis, operands[0]!.shape.length);
  const keepdims = attrs.keepDims ? 1 : 0;
  const x = inputs[0]!;
  const best = b.op('ArgMax', [x], { axis, keepdims, select_last_index: 0 });
  if (!isFloat(dtype)) return [best];
  const flags = b.cast(b.op('IsNaN', [x]), ElemType.INT32);
  const firstNaN = b.op('ArgMax', [flags], { axis, keepdims, select_last_index: 0 });
  return [b.op('Where', [anyNaN(b, x, [axis], attrs.keepDims), firstNaN, best])];
});

/** Softmax along one axis (opset 13 semantics: that axis only). */
export const softmax = lowering<'softmax'>(({ b, inputs, operands, attrs }) => [b.op('Softmax', inputs, { axis: normalizeAxis(attrs.axis, operands[0]!.shape.length) })]);

/**
 * x / √(mean(x²) + ε) · w, written as Pow → ReduceMean → Add → Sqrt → Div (→ Mul), the pattern
 * ORT fuses into SimplifiedLayerNormalization. NOTE: that fused kernel loses double precision
 * (errors ~1e-6), so f64 squares with Mul, which the fusion does not match.
 */
export const rmsNorm = lowering<'rmsNorm'>(({ b, inputs, operands, attrs }) => {
  const x = inputs[0]!;
  const t = computeType(operands[0]!.dtype);
  const last = operands[0]!.shape.length - 1;
  const square = operands[0]!.dtype === 'f64' ? b.op('Mul', [x, x]) : b.op('Pow', [x, b.scalar(2, t)]);
  const ms = reduce(b, 'ReduceMean', square, [last], true);
  const y = b.op('Div', [x, b.op('Sqrt', [b.op('Add', [ms, b.scalar(attrs.eps, t)])])]);
  return [inputs[1] === undefined ? y : b.op('Mul', [y, inputs[1]])];
});

/** LayerNormalization over the last axis; a missing weight is a vector of ones. */
export const layerNorm = lowering<'layerNorm'>(({ b, inputs, operands, attrs }) => {
  const x = operands[0]!;
  const t = computeType(x.dtype);
  const d = b.resolve(x.shape[x.shape.length - 1]!);
  const ones = (): string => (typeof d === 'number' ? b.constant(t, [d], new Array<number>(d).fill(1)) : b.op('Expand', [b.scalar(1, t), b.dim(d)]));
  const scale = inputs[1] ?? ones();
  const ins = inputs[2] === undefined ? [inputs[0]!, scale] : [inputs[0]!, scale, inputs[2]];
  return [b.op('LayerNormalization', ins, { axis: -1, epsilon: { float: attrs.eps } })];
});
