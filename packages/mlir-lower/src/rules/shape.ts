import { type Dim, dimAdd, normalizeAxis } from '@stageml/ir';
import type { FunctionEmitter, ValueRef } from '../emitter.js';
import { reshapeValue } from '../reshape.js';
import type { MlirRuleFn } from '../rule.js';
import { tensorTypeOf } from '../types.js';

/** flat(y) = flat(x): `tensor.collapse_shape`/`expand_shape`, or `tensor.reshape` (see `reshapeValue`). */
export const reshapeRule: MlirRuleFn<'reshape'> = ({ e, operands, results, names }) => [reshapeValue(e, operands[0]!, results[0]!, names[0]!)];

/** y = x with axes permuted: `linalg.transpose` into a `tensor.empty`. */
export const transposeRule: MlirRuleFn<'transpose'> = ({ e, attrs, operands, results, names }) => {
  const x = operands[0]!;
  const rank = x.type.shape.length;
  const perm = attrs.perm.map((a) => normalizeAxis(a, rank));
  if (perm.every((p, i) => p === i)) return [x];
  const init = e.empty(results[0]!, `${names[0]!}_init`);
  return [
    {
      ssa: e.def(names[0]!, `linalg.transpose ins(${x.ssa} : ${tensorTypeOf(x.type)}) outs(${init.ssa} : ${tensorTypeOf(init.type)}) permutation = [${perm.join(', ')}]`),
      type: results[0]!,
    },
  ];
};

/** A mixed static/dynamic offset or size list entry. */
function entry(e: FunctionEmitter, d: Dim): string {
  return typeof d === 'number' ? String(d) : e.dim(d);
}

/** `[o0, o1] [s0, s1] [1, 1]` of a slice of `x` at `offset` (along `axis`) with `sizes`. */
export function sliceSpec(e: FunctionEmitter, rank: number, axis: number, offset: Dim | string, sizes: readonly Dim[], step = 1): string {
  const offs = Array.from({ length: rank }, (_, i) => (i === axis ? (typeof offset === 'string' ? offset : entry(e, offset)) : '0'));
  const strides = Array.from({ length: rank }, (_, i) => (i === axis ? String(step) : '1'));
  return `[${offs.join(', ')}] [${sizes.map((d) => entry(e, d)).join(', ')}] [${strides.join(', ')}]`;
}

/** y = [x₀ ‖ x₁ ‖ …] along an axis: `tensor.insert_slice` of each piece into a `tensor.empty`. */
export const concatRule: MlirRuleFn<'concat'> = ({ e, attrs, operands, results, names }) => {
  if (operands.length === 1) return [operands[0]!];
  const out = results[0]!;
  const rank = out.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  let acc: ValueRef = e.empty(out, `${names[0]!}_init`);
  let offset: Dim = 0;
  operands.forEach((x, k) => {
    const spec = sliceSpec(e, rank, axis, offset, x.type.shape);
    const hint = k === operands.length - 1 ? names[0]! : `${names[0]!}_part`;
    acc = { ssa: e.def(hint, `tensor.insert_slice ${x.ssa} into ${acc.ssa}${spec} : ${tensorTypeOf(x.type)} into ${tensorTypeOf(out)}`), type: out };
    offset = dimAdd(offset, x.type.shape[axis]!);
  });
  return [acc];
};

/** The start of a slice in IR semantics (negative counts from the end; static bounds clamp). */
function sliceStart(size: Dim, start: Dim): Dim {
  if (typeof size === 'number' && typeof start === 'number') {
    const s = start < 0 ? start + size : start;
    return Math.min(Math.max(s, 0), size);
  }
  return typeof start === 'number' && start < 0 ? dimAdd(size, start) : start;
}

/** y = x[start:end:step] along an axis: `tensor.extract_slice` with the step as the stride. */
export const sliceRule: MlirRuleFn<'slice'> = ({ e, attrs, operands, results, names }) => {
  const x = operands[0]!;
  const out = results[0]!;
  const rank = out.shape.length;
  const axis = normalizeAxis(attrs.axis, rank);
  const start = sliceStart(x.type.shape[axis]!, attrs.start);
  const spec = sliceSpec(e, rank, axis, start, out.shape, attrs.step);
  return [{ ssa: e.def(names[0]!, `tensor.extract_slice ${x.ssa}${spec} : ${tensorTypeOf(x.type)} to ${tensorTypeOf(out)}`), type: out }];
};
