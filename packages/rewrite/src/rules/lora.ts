import { type Value, dimEquals, typeEquals } from '@stageml/ir';
import { type Pattern, m } from '../pattern.js';
import { type Rule, type RuleContext, rule } from '../rule.js';
import { isScalarLike } from './algebra.js';
import { asRank0 } from './matmul.js';

const scale = <const N extends string>(name: N): Pattern<N, never> => m.capture(name, { type: isScalarLike });

// Every written form of a scaled LoRA delta s·(x·Aᵀ)·Bᵀ: the scale on x, on the shrink output,
// on the expand output, and a second (alpha) factor on the output, as traced from
// `torch.add(base, delta, alpha=k)`. Scales on A or B themselves need no form: the captured A or
// B is then the scaled matrix.
const xIn = m.oneOf(m.capture('x'), m.commutative('mul', m.capture('x'), scale('sx')));
const shrink = m.op('linear', xIn, m.capture('loraA'));
const mid = m.oneOf(shrink, m.commutative('mul', shrink, scale('sh')));
const expand = m.op('linear', mid, m.capture('loraB'));
const delta = m.oneOf(expand, m.commutative('mul', expand, scale('sy')), m.commutative('mul', m.commutative('mul', expand, scale('sy')), scale('alpha')));
const base = m.oneOf(
  m.op('linear', m.capture('x'), m.capture('w'), { as: 'base' }),
  m.op('linear', m.capture('x'), m.capture('w'), m.capture('bias'), { as: 'base' }),
);

interface MergeCaptures {
  readonly x: Value;
  readonly w: Value;
  readonly loraA: Value;
  readonly loraB: Value;
  readonly base: Value;
  readonly y: Value;
  readonly bias?: Value;
  readonly sx?: Value;
  readonly sh?: Value;
  readonly sy?: Value;
  readonly alpha?: Value;
}

function mergeApplies(c: MergeCaptures, ctx: RuleContext): boolean {
  const [out, inW] = c.w.type.shape;
  return (
    ctx.isDynamic(c.x) &&
    typeEquals(c.y.type, c.base.type) &&
    dimEquals(c.loraB.type.shape[0]!, out!) &&
    dimEquals(c.loraA.type.shape[1]!, inW!)
  );
}

function buildMerged(c: MergeCaptures, b: Parameters<Rule['build']>[1], negate: boolean): Value {
  let s: Value | undefined;
  for (const f of [c.sx, c.sh, c.sy, c.alpha]) {
    if (f === undefined) continue;
    const f0 = asRank0(b, f);
    s = s === undefined ? f0 : b.mul(s, f0);
  }
  const product = b.matmul(c.loraB, c.loraA);
  const d = s === undefined ? product : b.mul(product, s);
  const merged = negate ? b.sub(c.w, d) : b.add(c.w, d);
  return c.bias === undefined ? b.linear(c.x, merged) : b.linear(c.x, merged, c.bias);
}

const MERGE_CONDITIONS =
  'the same x in both branches and x dynamic; A [r, in], B [out, r], W [out, in]; scales are scalars (all product scales multiply, alpha included); ' +
  'the interior nodes have no other users; cost-checked: fires only if the residual gets faster per request (or smaller at equal time) and the constant table fits the budget';

/**
 * LoRA merge: x·Wᵀ (+ c) + s·(x·Aᵀ)·Bᵀ → x·(W + s·B·A)ᵀ (+ c), in every written form (see
 * `MERGE_CONDITIONS`). With static adapters the merged weight is folded ahead of time and the
 * whole LoRA path leaves the residual; with dynamic adapters the merge is computed per request,
 * which pays only at large batch·seq: the cost model decides. Unlike the original StageML rule,
 * an alpha factor (`torch.add(a, b, alpha=k)` traced as `add(a, mul(b, k))`) is kept.
 */
export const addMergeLora: Rule = rule({
  name: 'add.merge-lora',
  identity: 'x·Wᵀ + s·(x·Aᵀ)·Bᵀ = x·(W + s·B·A)ᵀ',
  conditions: MERGE_CONDITIONS,
  match: m.commutative('add', base, delta, { as: 'y' }),
  when: (c, ctx) => mergeApplies(c, ctx),
  build: (c, b) => buildMerged(c, b, false),
  costGuard: 'improving',
});

/** LoRA merge with a subtracted delta: x·Wᵀ − s·(x·Aᵀ)·Bᵀ → x·(W − s·B·A)ᵀ, in every written form. */
export const subMergeLora: Rule = rule({
  name: 'sub.merge-lora',
  identity: 'x·Wᵀ − s·(x·Aᵀ)·Bᵀ = x·(W − s·B·A)ᵀ',
  conditions: MERGE_CONDITIONS,
  match: m.op('sub', base, delta, { as: 'y' }),
  when: (c, ctx) => mergeApplies(c, ctx),
  build: (c, b) => buildMerged(c, b, true),
  costGuard: 'improving',
});

/**
 * LoRA re-association, factored → product: (x·Aᵀ)·Bᵀ → x·(B·A)ᵀ. The static product B·A is
 * folded ahead of time; per request this trades b·r·(in + out) for b·in·out multiply-adds, so it
 * pays only when the rank is large against in·out/(in + out), and never for r ≪ d.
 */
export const linearAssociateFactors: Rule = rule({
  name: 'linear.associate-factors',
  identity: '(x·Aᵀ)·Bᵀ = x·(B·A)ᵀ',
  conditions: 'x dynamic; no bias on either product; the inner product has no other users; cost-checked',
  match: m.op('linear', m.op('linear', m.capture('x', { stage: 'dynamic' }), m.capture('loraA')), m.capture('loraB')),
  build: ({ x, loraA, loraB }, b) => b.linear(x, b.matmul(loraB, loraA)),
  costGuard: 'improving',
});

/**
 * LoRA re-association, product → factored: x·(B·A)ᵀ → (x·Aᵀ)·Bᵀ, un-folding a low-rank product
 * (the form the original StageML's right re-association produced) when that is cheaper.
 */
export const linearSplitFactors: Rule = rule({
  name: 'linear.split-factors',
  identity: 'x·(B·A)ᵀ = (x·Aᵀ)·Bᵀ',
  conditions: 'x dynamic; B·A a plain matrix product (no transpose flags, both matrices) with no other users; cost-checked',
  match: m.op(
    'linear',
    m.capture('x', { stage: 'dynamic' }),
    m.op('matmul', m.capture('loraB', { type: (t) => t.shape.length === 2 }), m.capture('loraA', { type: (t) => t.shape.length === 2 }), {
      attrs: { transposeA: false, transposeB: false },
    }),
  ),
  build: ({ x, loraA, loraB }, b) => b.linear(b.linear(x, loraA), loraB),
  costGuard: 'improving',
});

const linearOf = (w: 'w1' | 'w2', bias: 'b1' | 'b2', as: 'base' | 'other') =>
  m.oneOf(m.op('linear', m.capture('x'), m.capture(w), { as }), m.op('linear', m.capture('x'), m.capture(w), m.capture(bias), { as }));
const scaledLinear = m.oneOf(
  linearOf('w2', 'b2', 'other'),
  m.commutative('mul', linearOf('w2', 'b2', 'other'), scale('s')),
  m.commutative('mul', m.commutative('mul', linearOf('w2', 'b2', 'other'), scale('s')), scale('alpha')),
);

interface DistributeCaptures {
  readonly x: Value;
  readonly w1: Value;
  readonly w2: Value;
  readonly base: Value;
  readonly y: Value;
  readonly b1?: Value;
  readonly b2?: Value;
  readonly s?: Value;
  readonly alpha?: Value;
}

function buildDistributed(c: DistributeCaptures, b: Parameters<Rule['build']>[1], negate: boolean): Value {
  let s: Value | undefined;
  for (const f of [c.s, c.alpha]) {
    if (f === undefined) continue;
    const f0 = asRank0(b, f);
    s = s === undefined ? f0 : b.mul(s, f0);
  }
  const scaled = (v: Value): Value => (s === undefined ? v : b.mul(v, s));
  const combine = (u: Value, v: Value): Value => (negate ? b.sub(u, scaled(v)) : b.add(u, scaled(v)));
  const w = combine(c.w1, c.w2);
  let bias: Value | undefined;
  if (c.b1 !== undefined && c.b2 !== undefined) bias = combine(c.b1, c.b2);
  else if (c.b1 !== undefined) bias = c.b1;
  else if (c.b2 !== undefined) bias = negate ? b.neg(scaled(c.b2)) : scaled(c.b2);
  return bias === undefined ? b.linear(c.x, w) : b.linear(c.x, w, bias);
}

const DISTRIBUTE_CONDITIONS =
  'the same x in both products and x dynamic; W₁ and W₂ of one type; scales are scalars; both products have no other users; cost-checked (with static weights W₁ ± s·W₂ is folded ahead of time)';

/**
 * Distributive merge (the original StageML's Rule B, generalized): x·W₁ᵀ (+ c₁) + s·(x·W₂ᵀ (+ c₂))
 * → x·(W₁ + s·W₂)ᵀ (+ c₁ + s·c₂), with an alpha factor kept.
 */
export const addMergeLinears: Rule = rule({
  name: 'add.merge-linears',
  identity: 'x·W₁ᵀ + s·x·W₂ᵀ = x·(W₁ + s·W₂)ᵀ',
  conditions: DISTRIBUTE_CONDITIONS,
  match: m.commutative('add', linearOf('w1', 'b1', 'base'), scaledLinear, { as: 'y' }),
  when: (c, ctx) => ctx.isDynamic(c.x) && typeEquals(c.y.type, c.base.type) && typeEquals(c.w1.type, c.w2.type),
  build: (c, b) => buildDistributed(c, b, false),
  costGuard: 'improving',
});

/** Distributive merge of a difference: x·W₁ᵀ − s·x·W₂ᵀ → x·(W₁ − s·W₂)ᵀ (biases likewise). */
export const subMergeLinears: Rule = rule({
  name: 'sub.merge-linears',
  identity: 'x·W₁ᵀ − s·x·W₂ᵀ = x·(W₁ − s·W₂)ᵀ',
  conditions: DISTRIBUTE_CONDITIONS,
  match: m.op('sub', linearOf('w1', 'b1', 'base'), scaledLinear, { as: 'y' }),
  when: (c, ctx) => ctx.isDynamic(c.x) && typeEquals(c.y.type, c.base.type) && typeEquals(c.w1.type, c.w2.type),
  build: (c, b) => buildDistributed(c, b, true),
  costGuard: 'improving',
});
