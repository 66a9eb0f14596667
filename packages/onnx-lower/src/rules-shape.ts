import { type Dim, normalizeAxis, rounderFor, sizeOf } from '@stageml/ir';

import { SLICE_END } from './builder.js';
import { conform, convert } from './convert.js';
import { ElemType, computeType } from './dtypes.js';
import { exactLowering } from './rule.js';

/**
 * Reshape with `allowzero = 1`, so a dim that is 0 at run time (an empty KV cache) means 0 rather
 * than "copy the input's dim"; −1 is inferred as in the IR.
 */
export const reshape = exactLowering<'reshape'>(({ b, inputs, attrs }) => [b.op('Reshape', [inputs[0]!, b.shape(attrs.shape)], { allowzero: 1 })]);

/** Transpose with the permutation normalized. */
export const transpose = exactLowering<'transpose'>(({ b, inputs, operands, attrs }) => {
  const rank = operands[0]!.shape.length;
  return [b.op('Transpose', inputs, { perm: attrs.perm.map((a) => normalizeAxis(a, rank)) })];
});

/** Expand to the target shape (ONNX broadcasting equals the IR's when x broadcasts to it). */
export const broadcastTo = exactLowering<'broadcastTo'>(({ b, inputs, attrs }) => [b.op('Expand', [inputs[0]!, b.shape(attrs.shape)])]);

/** Concat along the normalized axis. */
export const concat = exactLowering<'concat'>(({ b, inputs, operands, attrs }) => [b.op('Concat', inputs, { axis: normalizeAxis(attrs.axis, operands[0]!.shape.length) })]);

/**
 * Slice with Python semantics: ONNX Slice counts negative bounds from the end and clamps to the
 * axis, as the IR does; symbolic bounds are computed at run time; no end is "to the end".
 */
export const slice = exactLowering<'slice'>(({ b, inputs, operands, attrs }) => {
  const axis = normalizeAxis(attrs.axis, operands[0]!.shape.length);
  const end = attrs.end === undefined ? b.int64s([SLICE_END]) : b.dim(attrs.end);
  return [b.op('Slice', [inputs[0]!, b.dim(attrs.start), end, b.int64s([axis]), b.int64s([attrs.step])])];
});

/** A literal tensor: an initializer holding the values rounded to the dtype (splats expanded). */
export const constant = exactLowering<'constant'>(({ b, attrs }) => {
  const shape = attrs.shape as readonly number[];
  const n = sizeOf(shape);
  const round = rounderFor(attrs.dtype);
  const values = Array.from({ length: n }, (_, i) => round(attrs.value.length === 1 ? attrs.value[0]! : attrs.value[i]!));
  return [b.constant(computeType(attrs.dtype), shape, values)];
});

/** Indices along one axis: Range over the axis, reshaped to broadcast, expanded, then cast as the IR casts. */
export const iota = exactLowering<'iota'>(({ b, attrs }) => {
  const rank = attrs.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const n = attrs.shape[axis]!;
  const range = b.op('Range', [b.scalar(0, ElemType.INT64), b.dimScalar(n), b.scalar(1, ElemType.INT64)]);
  const column: Dim[] = attrs.shape.map((d, i) => (i === axis ? -1 : 1));
  const full = b.op('Expand', [b.op('Reshape', [range, b.shape(column)]), b.shape(attrs.shape)]);
  return [convert(b, full, 'i64', attrs.dtype)];
});

/** The largest value below 1 of each float dtype (samples must stay in [0, 1)). */
const BELOW_ONE = { f64: 1 - 2 ** -53, f32: 1 - 2 ** -24, f16: 1 - 2 ** -11, bf16: 1 - 2 ** -8 } as const;

/**
 * Fresh U[0, 1) samples on every run: RandomUniform for static shapes, RandomUniformLike over
 * ConstantOfShape for symbolic ones; no seed, so the runtime advances its generator per run. The
 * samples are rounded to the dtype and clamped below 1.
 */
export const randomUniform = exactLowering<'randomUniform'>(({ b, attrs }) => {
  const dtype = attrs.dtype as keyof typeof BELOW_ONE;
  const t = computeType(dtype);
  const dims = attrs.shape.map((d) => b.resolve(d));
  const range = { low: { float: 0 }, high: { float: 1 }, dtype: t };
  const u = dims.every((d): d is number => typeof d === 'number')
    ? b.op('RandomUniform', [], { ...range, shape: dims })
    : b.op('RandomUniformLike', [b.op('ConstantOfShape', [b.shape(dims)])], range);
  return [b.op('Min', [conform(b, u, dtype), b.scalar(BELOW_ONE[dtype], t)])];
});
