import { typeEquals } from '@stageml/ir';
import { m } from '../pattern.js';
import { type Rule, rule } from '../rule.js';

/** A permutation with negative axes counted from the end. */
export function normalizePerm(perm: readonly number[]): number[] {
  return perm.map((a) => (a < 0 ? a + perm.length : a));
}

/** Whether `perm` is the identity. */
export function isIdentityPerm(perm: readonly number[]): boolean {
  return normalizePerm(perm).every((a, i) => a === i);
}

/** Whether `perm` swaps the last two axes and keeps the others (a matrix transpose of a batch). */
export function swapsLastTwo(perm: readonly number[]): boolean {
  const p = normalizePerm(perm);
  const r = p.length;
  return r >= 2 && p[r - 1] === r - 2 && p[r - 2] === r - 1 && p.slice(0, r - 2).every((a, i) => a === i);
}

/** transpose(transpose(x, p), q) → transpose(x, p∘q), or x when p∘q is the identity. */
export const transposeCompose: Rule = rule({
  name: 'transpose.compose',
  identity: 'transpose(transpose(x, p), q) = transpose(x, r), r[j] = p[q[j]] (= x when r = id)',
  conditions: 'none; the inner transpose may have other users (it stays for them)',
  match: m.op('transpose', m.op('transpose', m.capture('x'), { as: 'inner', shared: true }), { as: 'outer' }),
  build: ({ x, inner, outer }, b, ctx) => {
    const p = normalizePerm(ctx.attrs(inner, 'transpose').perm);
    const q = normalizePerm(ctx.attrs(outer, 'transpose').perm);
    const r = q.map((j) => p[j]!);
    return isIdentityPerm(r) ? x : b.transpose(x, r);
  },
});

/** transpose(x, id) → x. */
export const transposeDropIdentity: Rule = rule({
  name: 'transpose.drop-identity',
  identity: 'transpose(x, id) = x',
  conditions: 'the permutation is the identity',
  match: m.op('transpose', m.capture('x'), { as: 't' }),
  when: ({ t }, ctx) => isIdentityPerm(ctx.attrs(t, 'transpose').perm),
  build: ({ x }) => x,
});

/** reshape(reshape(x, s₁), s₂) → reshape(x, s₂), or x when s₂ is x's shape. */
export const reshapeCompose: Rule = rule({
  name: 'reshape.compose',
  identity: 'reshape(reshape(x, s₁), s₂) = reshape(x, s₂) (= x when s₂ = shape(x))',
  conditions: 'none (row-major order is kept by both); the inner reshape may have other users',
  match: m.op('reshape', m.op('reshape', m.capture('x'), { shared: true }), { as: 'outer' }),
  // NOTE: the outer result's resolved shape is used, so a −1 in s₂ never refers to s₁.
  build: ({ x, outer }, b) => (typeEquals(x.type, outer.type) ? x : b.reshape(x, outer.type.shape)),
});

/** reshape(x, shape(x)) → x. */
export const reshapeDropIdentity: Rule = rule({
  name: 'reshape.drop-identity',
  identity: 'reshape(x, shape(x)) = x',
  conditions: 'the result type equals the operand type',
  match: m.op('reshape', m.capture('x'), { as: 'y' }),
  when: ({ x, y }) => typeEquals(x.type, y.type),
  build: ({ x }) => x,
});
