import { normalizeAxis } from '@stageml/ir';

import { ElemType, computeType, isFloat } from './dtypes.js';
import { exactLowering, lowering } from './rule.js';

/**
 * Gather along an axis. NOTE: ONNX Gather accepts negative indices (counting from the end) where
 * the IR rejects them; out-of-range indices fail at run time in both.
 */
export const gather = exactLowering<'gather'>(({ b, inputs, operands, attrs }) => [b.op('Gather', inputs, { axis: normalizeAxis(attrs.axis, operands[0]!.shape.length) })]);

/** index_select: Gather with a 1-D index (the adapter bank's row selection). */
export const indexSelect = exactLowering<'indexSelect'>(({ b, inputs, operands, attrs }) => [
  b.op('Gather', inputs, { axis: normalizeAxis(attrs.axis, operands[0]!.shape.length) }),
]);

/**
 * index_add: ScatterElements with `reduction = add` (repeated indices accumulate), the 1-D index
 * broadcast to the updates' shape along the axis.
 */
export const scatterAdd = lowering<'scatterAdd'>(({ b, inputs, operands, attrs }) => {
  const rank = operands[0]!.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const [x, idx, up] = inputs as [string, string, string];
  const column = Array.from({ length: rank }, (_, i) => (i === axis ? -1 : 1));
  const index = b.op('Expand', [b.op('Reshape', [idx, b.int64s(column)]), b.op('Shape', [up])]);
  return [b.op('ScatterElements', [x, index, up], { axis, reduction: 'add' })];
});

/**
 * The k largest (or smallest) entries, sorted, ties to the lower index (ONNX TopK's documented
 * order). Floats rank NaN above +∞ as the IR does: one TopK over the axis with NaN as 0 orders by
 * value, a second stable TopK over the NaN flags (in that order) moves NaNs first (largest) or
 * last (smallest), and the first k of the composed permutation are taken.
 */
export const topk = exactLowering<'topk'>(({ b, inputs, operands, results, attrs }) => {
  const xType = operands[0]!;
  const axis = normalizeAxis(attrs.axis, xType.shape.length);
  const largest = attrs.largest ? 1 : 0;
  const x = inputs[0]!;
  if (!isFloat(xType.dtype)) return b.emit('TopK', [x, b.dim(results[0]!.shape[axis]!)], { axis, largest, sorted: 1 }, 2);
  const n = b.dim(xType.shape[axis]!);
  const isNaN = b.op('IsNaN', [x]);
  const zeroed = b.op('Where', [isNaN, b.scalar(0, computeType(xType.dtype)), x]);
  const byValue = b.emit('TopK', [zeroed, n], { axis, largest, sorted: 1 }, 2)[1]!;
  const flags = b.op('GatherElements', [b.cast(isNaN, ElemType.FLOAT), byValue], { axis });
  const byFlag = b.emit('TopK', [flags, n], { axis, largest, sorted: 1 }, 2)[1]!;
  const order = b.op('GatherElements', [byValue, byFlag], { axis });
  const indices = b.op('Slice', [order, b.int64s([0]), b.int64s([attrs.k]), b.int64s([axis])]);
  return [b.op('GatherElements', [x, indices], { axis }), indices];
});
