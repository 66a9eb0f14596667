import { type Dim, type TensorType, dimDivExact, dimEquals, dimMul, dimProduct } from '@stageml/ir';
import type { FunctionEmitter, ValueRef } from './emitter.js';
import { tensorTypeOf } from './types.js';

/** Source and target dims that cover the same elements: one reassociation group. */
interface Group {
  readonly src: number[];
  readonly dst: number[];
}

function isOne(d: Dim): boolean {
  return d === 1;
}

/** Whether `a / b` is an exact polynomial other than 1 (so `b` must grow to reach `a`). */
function strictlyDivides(b: Dim, a: Dim): boolean {
  if (b === 0 || a === 0) return false;
  const q = dimDivExact(a, b);
  return q !== undefined && q !== 1;
}

/**
 * Groups a reshape into runs of source and target dims with equal products (symbolic products
 * compare as polynomials), or `undefined` when no such grouping exists (e.g. `[past + seq]` into
 * `[past, seq]`). Unit dims at the ends join the neighbouring group.
 */
export function reassociate(src: readonly Dim[], dst: readonly Dim[]): Group[] | undefined {
  const groups: Group[] = [];
  let i = 0;
  let j = 0;
  while (i < src.length && j < dst.length) {
    const g: Group = { src: [i], dst: [j] };
    let ps = src[i++]!;
    let pt = dst[j++]!;
    while (!dimEquals(ps, pt)) {
      if (j < dst.length && strictlyDivides(pt, ps)) {
        g.dst.push(j);
        pt = dimMul(pt, dst[j++]!);
      } else if (i < src.length && strictlyDivides(ps, pt)) {
        g.src.push(i);
        ps = dimMul(ps, src[i++]!);
      } else return undefined;
    }
    groups.push(g);
  }
  for (; i < src.length; i++) {
    if (!isOne(src[i]!) || groups.length === 0) return undefined;
    groups[groups.length - 1]!.src.push(i);
  }
  for (; j < dst.length; j++) {
    if (!isOne(dst[j]!) || groups.length === 0) return undefined;
    groups[groups.length - 1]!.dst.push(j);
  }
  return groups;
}

function reassocText(lists: readonly (readonly number[])[]): string {
  return `[${lists.map((l) => `[${l.join(', ')}]`).join(', ')}]`;
}

function collapse(e: FunctionEmitter, x: ValueRef, lists: readonly (readonly number[])[], to: TensorType, hint: string): ValueRef {
  return { ssa: e.def(hint, `tensor.collapse_shape ${x.ssa} ${reassocText(lists)} : ${tensorTypeOf(x.type)} into ${tensorTypeOf(to)}`), type: to };
}

function expand(e: FunctionEmitter, x: ValueRef, lists: readonly (readonly number[])[], to: TensorType, hint: string): ValueRef {
  return {
    ssa: e.def(hint, `tensor.expand_shape ${x.ssa} ${reassocText(lists)} output_shape ${e.sizeList(to.shape)} : ${tensorTypeOf(x.type)} into ${tensorTypeOf(to)}`),
    type: to,
  };
}

/** Whether an expand group is legal for `tensor.expand_shape`: at most one dynamic dim in it. */
function expandable(groups: readonly Group[], dst: readonly Dim[]): boolean {
  return groups.every((g) => g.dst.filter((k) => typeof dst[k] !== 'number').length <= 1);
}

/**
 * Reshapes `x` to `to` (same elements, row-major): `tensor.collapse_shape` and/or
 * `tensor.expand_shape` when the shapes reassociate, else `tensor.reshape` with a shape tensor
 * built from the target's sizes. Rank-0 sides use the empty reassociation.
 */
export function reshapeValue(e: FunctionEmitter, x: ValueRef, to: TensorType, hint: string): ValueRef {
  const src = x.type.shape;
  const dst = to.shape;
  if (src.length === dst.length && src.every((d, i) => dimEquals(d, dst[i]!))) return x;
  if (src.length === 0 && dst.every(isOne)) return expand(e, x, [], to, hint);
  if (dst.length === 0 && src.every(isOne)) return collapse(e, x, [], to, hint);
  const groups = reassociate(src, dst);
  if (groups !== undefined) {
    if (groups.every((g) => g.src.length === 1) && expandable(groups, dst)) {
      return expand(e, x, groups.map((g) => g.dst), to, hint);
    }
    if (groups.every((g) => g.dst.length === 1)) return collapse(e, x, groups.map((g) => g.src), to, hint);
    if (expandable(groups, dst)) {
      const mid: TensorType = { dtype: x.type.dtype, shape: groups.map((g) => dimProduct(g.src.map((k) => src[k]!))) };
      const c = collapse(e, x, groups.map((g) => g.src), mid, `${hint}_flat`);
      return expand(e, c, groups.map((g) => g.dst), to, hint);
    }
  }
  const shape = e.def(`${hint}_shape`, `tensor.from_elements ${dst.map((d) => e.dim(d)).join(', ')} : tensor<${String(dst.length)}xindex>`);
  return {
    ssa: e.def(hint, `tensor.reshape ${x.ssa}(${shape}) : (${tensorTypeOf(x.type)}, tensor<${String(dst.length)}xindex>) -> ${tensorTypeOf(to)}`),
    type: to,
  };
}
