import { type GraphBuilder, type TensorType, type Value, typeEquals } from '@stageml/ir';
import { m } from '../pattern.js';
import { type Rule, rule } from '../rule.js';
import { isScalarLike } from './algebra.js';
import { swapsLastTwo } from './shape.js';

const isMatrix = (t: TensorType): boolean => t.shape.length === 2;

/** A scalar-like value as a rank-0 one, so multiplying by it never broadcasts a weight up. */
export function asRank0(b: GraphBuilder, s: Value): Value {
  return s.type.shape.length === 0 ? s : b.reshape(s, []);
}

/**
 * matmul(transpose(a), b) → matmul(a, b) with the transpose flag flipped, on either operand, when
 * the transpose swaps the last two axes only (a batch of matrix transposes).
 */
export const matmulAbsorbTranspose: Rule = rule({
  name: 'matmul.absorb-transpose',
  identity: 'op(aᵀ) · op(b) = op′(a) · op(b), op′ = op with its transpose flag flipped',
  conditions: 'the transpose swaps the last two axes and keeps the batch axes; it may have other users (it stays for them)',
  match: m.op(
    'matmul',
    m.oneOf(m.op('transpose', m.capture('lhs'), { as: 'tl', shared: true }), m.capture('lhs')),
    m.oneOf(m.op('transpose', m.capture('rhs'), { as: 'tr', shared: true }), m.capture('rhs')),
    { as: 'mm' },
  ),
  when: ({ tl, tr }, ctx) =>
    (tl !== undefined || tr !== undefined) &&
    (tl === undefined || swapsLastTwo(ctx.attrs(tl, 'transpose').perm)) &&
    (tr === undefined || swapsLastTwo(ctx.attrs(tr, 'transpose').perm)),
  build: ({ lhs, rhs, tl, tr, mm }, b, ctx) => {
    const at = ctx.attrs(mm, 'matmul');
    return b.matmul(lhs, rhs, { transposeA: at.transposeA !== (tl !== undefined), transposeB: at.transposeB !== (tr !== undefined) });
  },
});

/** matmul(x, w, transposeB) → linear(x, w) for a matrix w: the canonical form LoRA rules match. */
export const matmulToLinear: Rule = rule({
  name: 'matmul.to-linear',
  identity: 'x · wᵀ = linear(x, w)',
  conditions: 'w is a matrix (rank 2), x is not transposed; same FLOPs and bytes',
  match: m.op('matmul', m.capture('x'), m.capture('w', { type: isMatrix }), { attrs: { transposeA: false, transposeB: true } }),
  build: ({ x, w }, b) => b.linear(x, w),
});

/**
 * matmul(x, w) → linear(x, wᵀ) for a static matrix w: the transpose is folded ahead of time, and
 * the product is then in the form LoRA merging matches (`x @ W` with W stored [in, out]).
 */
export const matmulTransposeStaticWeight: Rule = rule({
  name: 'matmul.transpose-static-weight',
  identity: 'x · w = linear(x, wᵀ)',
  conditions: 'x dynamic, w a static matrix; fires only if it costs no time and no constant memory (a shared w would be stored twice)',
  match: m.op('matmul', m.capture('x', { stage: 'dynamic' }), m.capture('w', { stage: 'static', type: isMatrix }), { attrs: { transposeA: false, transposeB: false } }),
  build: ({ x, w }, b) => b.linear(x, b.transpose(w, [1, 0])),
  costGuard: 'no-worse',
});

const xCap = m.capture('x');
const wCap = m.capture('w');

/**
 * s · (x · W) → x · (s · W): a static scalar scale moves onto the static operand of a product
 * (with a bias, s · (x·Wᵀ + c) → x·(s·W)ᵀ + s·c), so it is folded ahead of time instead of
 * scaling every output element per request.
 */
export const mulFoldScaleIntoWeight: Rule = rule({
  name: 'mul.fold-scale-into-weight',
  identity: 's · (x · W) = x · (s · W); s · linear(x, W, c) = linear(x, s·W, s·c)',
  conditions: 's a static scalar, W (and c) static, x dynamic; the product type is kept; cost-checked (a shared W is stored twice)',
  match: m.commutative(
    'mul',
    m.oneOf(
      m.op('linear', xCap, wCap, { as: 'lin' }),
      m.op('linear', xCap, wCap, m.capture('bias'), { as: 'lin' }),
      m.op('matmul', xCap, wCap, { as: 'right' }),
      m.op('matmul', wCap, xCap, { as: 'left' }),
    ),
    m.capture('s', { stage: 'static', type: isScalarLike }),
    { as: 'y' },
  ),
  when: ({ x, w, bias, lin, right, left, y }, ctx) =>
    ctx.isDynamic(x) && ctx.isStatic(w) && (bias === undefined || ctx.isStatic(bias)) && typeEquals(y.type, (lin ?? right ?? left)!.type),
  build: ({ x, w, s, bias, lin, right, left }, b, ctx) => {
    const s0 = asRank0(b, s);
    const sw = b.mul(w, s0);
    if (lin !== undefined) return bias === undefined ? b.linear(x, sw) : b.linear(x, sw, b.mul(bias, s0));
    const p = (right ?? left)!;
    const at = ctx.attrs(p, 'matmul');
    return right !== undefined ? b.matmul(x, sw, at) : b.matmul(sw, x, at);
  },
  costGuard: 'improving',
});

/**
 * linear(s · x, W) → linear(x, s · W): a static scalar scale on the input of a product moves onto
 * its static weight ((s·x)·Wᵀ + c = x·(s·W)ᵀ + c; the bias is not scaled).
 */
export const linearFoldInputScale: Rule = rule({
  name: 'linear.fold-input-scale',
  identity: '(s · x)·Wᵀ + c = x·(s · W)ᵀ + c',
  conditions: 's a static scalar that does not broadcast x up, W static, x dynamic; the scaled x has no other users; cost-checked',
  match: m.oneOf(
    m.op('linear', m.commutative('mul', xCap, m.capture('s', { stage: 'static', type: isScalarLike }), { as: 'xs' }), wCap),
    m.op('linear', m.commutative('mul', xCap, m.capture('s', { stage: 'static', type: isScalarLike }), { as: 'xs' }), wCap, m.capture('bias')),
  ),
  when: ({ x, w, xs }, ctx) => ctx.isDynamic(x) && ctx.isStatic(w) && typeEquals(x.type, xs.type),
  build: ({ x, w, s, bias }, b) => {
    const sw = b.mul(w, asRank0(b, s));
    return bias === undefined ? b.linear(x, sw) : b.linear(x, sw, bias);
  },
  costGuard: 'improving',
});
