import { test } from '@fast-check/vitest';
import type { GraphBuilder, Value } from '@stageml/ir';
import fc from 'fast-check';
import { describe, expect } from 'vitest';
import { type Couple, arbCase, checkRewrite } from '../../test/harness.js';
import { analyticCostModel, linearReorderChain, matmulReorderChain } from '../index.js';

const rules = [matmulReorderChain, linearReorderChain];
// A compute-bound machine, so per-request time follows FLOPs as the chain DP does.
const context = { costModel: analyticCostModel({ peakFlopsPerSecond: 1e9 }) };

interface ChainSpec {
  /** Chain dims p₀ … pₙ: factor i is p_i × p_{i+1}. */
  readonly dims: readonly number[];
  /** Whether each non-first factor is an input (dynamic) rather than a parameter (static). */
  readonly dynamic: readonly boolean[];
  /** Whether each non-first factor is stored transposed ([p_{i+1}, p_i]). */
  readonly stored: readonly boolean[];
  /** Split choices of the parenthesization, consumed in order. */
  readonly splits: readonly number[];
  /** Whether a product with a transposed leaf on the right is written as `linear`. */
  readonly linear: readonly boolean[];
  readonly batched: boolean;
}

/** Builds the product of the chain in the order the split choices give. */
function buildChain(b: GraphBuilder, s: ChainSpec, couple: Couple): Value {
  const n = s.dims.length - 1;
  const leaf = (i: number): { v: Value; t: boolean } => {
    const [r, c] = [s.dims[i]!, s.dims[i + 1]!];
    if (i === 0) return { v: couple(b.input('in', ['f32', s.batched ? ['batch', r, c] : ['batch', c]])), t: false };
    const t = s.stored[i - 1]!;
    const shape = t ? [c, r] : [r, c];
    return { v: s.dynamic[i - 1]! ? b.input(`m${String(i)}`, ['f32', shape]) : b.param(`m${String(i)}`, ['f32', shape]), t };
  };
  let split = 0;
  let form = 0;
  const rec = (i: number, j: number): { v: Value; t: boolean } => {
    if (i === j) return leaf(i);
    const k = i + (s.splits[split++ % s.splits.length]! % (j - i));
    const l = rec(i, k);
    const r = rec(k + 1, j);
    if (r.t && !l.t && s.linear[form++ % s.linear.length]!) return { v: b.linear(l.v, r.v), t: false };
    return { v: b.matmul(l.v, r.v, { transposeA: l.t, transposeB: r.t }), t: false };
  };
  return rec(0, n - 1).v;
}

const arbSpec = (n: fc.Arbitrary<number>, dim: fc.Arbitrary<number>): fc.Arbitrary<ChainSpec> =>
  n.chain((k) =>
    fc.record({
      dims: fc.array(dim, { minLength: k + 1, maxLength: k + 1 }),
      dynamic: fc.array(fc.boolean(), { minLength: k, maxLength: k }),
      stored: fc.array(fc.boolean(), { minLength: k, maxLength: k }),
      splits: fc.array(fc.nat(7), { minLength: 1, maxLength: 6 }),
      linear: fc.array(fc.boolean(), { minLength: 1, maxLength: 4 }),
      batched: fc.boolean(),
    }),
  );

describe('matmul.reorder-chain and linear.reorder-chain', () => {
  // The first factor is [batch, p₁] or, batched, [batch, p₀, p₁] (a batch of p₀ × p₁ matrices).
  const arb = arbCase(arbSpec(fc.integer({ min: 3, max: 5 }), fc.integer({ min: 1, max: 4 })), (b, s, couple) => ({ y: buildChain(b, s, couple) }));
  test.prop([arb])('any chain, written any way, keeps semantics and never gets slower', (c) => {
    checkRewrite(c, rules, { context });
  });

  // (x·M₁)·M₂ with a wide middle dim and static M's: x·(M₁·M₂) folds M₁·M₂ and is far cheaper.
  const wide = arbCase(
    fc.record({ d0: fc.integer({ min: 1, max: 3 }), d1: fc.integer({ min: 7, max: 9 }), d2: fc.integer({ min: 1, max: 3 }), stored: fc.array(fc.boolean(), { minLength: 2, maxLength: 2 }), linear: fc.array(fc.boolean(), { minLength: 2, maxLength: 2 }), batched: fc.boolean() }),
    (b, p, couple) => ({ y: buildChain(b, { dims: [p.d0, p.d0, p.d1, p.d2], dynamic: [false, false], stored: p.stored, splits: [1, 0], linear: p.linear, batched: p.batched }, couple) }),
  );
  test.prop([wide])('re-associates a left-leaning chain with a wide static middle (static right re-association)', (c) => {
    const r = checkRewrite(c, rules, { context });
    expect(r.applied['matmul.reorder-chain']! + r.applied['linear.reorder-chain']!).toBeGreaterThan(0);
  });

  // Classic dynamic case: A·B·C with dims 8×1, 1×8, 8×1 written (A·B)·C costs 8× more than A·(B·C).
  const classic = arbCase(fc.record({ stored: fc.array(fc.boolean(), { minLength: 2, maxLength: 2 }), big: fc.integer({ min: 6, max: 8 }) }), (b, p, couple) => ({
    y: buildChain(b, { dims: [p.big, 1, p.big, 1], dynamic: [true, true], stored: p.stored, splits: [1, 0], linear: [false], batched: false }, couple),
  }));
  test.prop([classic])('orders a chain of dynamic matrices by FLOPs', (c) => {
    const r = checkRewrite(c, rules, { context });
    expect(r.applied['matmul.reorder-chain']! + r.applied['linear.reorder-chain']!).toBeGreaterThan(0);
  });
});
