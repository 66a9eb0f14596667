import { test } from '@fast-check/vitest';
import type { Dim } from '@stageml/ir';
import fc from 'fast-check';
import { describe, expect } from 'vitest';
import { arbCase, checkRewrite } from '../../test/harness.js';
import { reshapeCompose, reshapeDropIdentity, transposeCompose, transposeDropIdentity } from '../index.js';

const perm = (rank: number): fc.Arbitrary<number[]> =>
  fc.shuffledSubarray([...Array(rank).keys()], { minLength: rank, maxLength: rank }).chain((p) => fc.tuple(...p.map((a) => fc.constantFrom(a, a - rank))));

describe('transpose.compose', () => {
  const arb = arbCase(
    fc.integer({ min: 2, max: 4 }).chain((rank) => fc.record({ rank: fc.constant(rank), p: perm(rank), q: perm(rank), shared: fc.boolean(), dims: fc.array(fc.integer({ min: 1, max: 3 }), { minLength: rank, maxLength: rank }) })),
    (b, p, couple) => {
      const x = couple(b.input('in', ['f32', ['batch', ...p.dims.slice(1)]]));
      const inner = b.transpose(x, p.p);
      const y = b.transpose(inner, p.q);
      return p.shared ? { y, inner } : { y };
    },
  );
  test.prop([arb])('transpose∘transpose → one transpose (or x) keeps semantics and is idempotent', (c) => {
    const r = checkRewrite(c, [transposeCompose], { fires: 'transpose.compose', rtol: 0, atol: 0 });
    const y = r.graph.values[r.graph.outputs.find((o) => o.name === 'y')!.value]!;
    const n = r.graph.nodes[y.node]!;
    // The result is x itself or one transpose of it (never a transpose of a transpose).
    if (n.kind === 'op' && n.op === 'transpose') {
      expect(r.graph.nodes[r.graph.values[n.operands[0]!]!.node]!.kind === 'op' && (r.graph.nodes[r.graph.values[n.operands[0]!]!.node] as { op: string }).op === 'transpose').toBe(false);
    }
  });
});

describe('transpose.drop-identity', () => {
  const arb = arbCase(fc.record({ rank: fc.integer({ min: 1, max: 4 }), negative: fc.boolean() }), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', ...Array<number>(p.rank - 1).fill(2)]]));
    return { y: b.exp(b.transpose(x, [...Array(p.rank).keys()].map((a) => (p.negative ? a - p.rank : a)))) };
  });
  test.prop([arb])('transpose(x, id) → x keeps semantics and is idempotent', (c) => {
    checkRewrite(c, [transposeDropIdentity], { fires: 'transpose.drop-identity', rtol: 0, atol: 0 });
  });
});

describe('reshape.compose', () => {
  const targets = (a: number, d: number): Dim[][] => [['batch', a * d], [-1], ['batch', a, d], ['batch', d, a], [a, 'batch', d], ['batch', 1, a * d]] as Dim[][];
  const arb = arbCase(
    fc.record({ a: fc.integer({ min: 1, max: 3 }), d: fc.integer({ min: 1, max: 3 }), s1: fc.nat(5), s2: fc.nat(5), shared: fc.boolean() }),
    (b, p, couple) => {
      const x = couple(b.input('in', ['f32', ['batch', p.a, p.d]]));
      const inner = b.reshape(x, targets(p.a, p.d)[p.s1]!);
      const y = b.reshape(inner, targets(p.a, p.d)[p.s2]!);
      return p.shared ? { y, inner } : { y };
    },
  );
  test.prop([arb])('reshape∘reshape → one reshape (or x) keeps semantics and is idempotent', (c) => {
    checkRewrite(c, [reshapeCompose], { fires: 'reshape.compose', rtol: 0, atol: 0 });
  });
});

describe('reshape.drop-identity', () => {
  const arb = arbCase(fc.record({ d: fc.integer({ min: 1, max: 4 }), hole: fc.boolean() }), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', p.d]]));
    return { y: b.neg(b.reshape(x, p.hole ? ['batch', -1] : ['batch', p.d])) };
  });
  test.prop([arb])('reshape(x, shape(x)) → x keeps semantics and is idempotent', (c) => {
    checkRewrite(c, [reshapeDropIdentity], { fires: 'reshape.drop-identity', rtol: 0, atol: 0 });
  });
});
