import { test } from '@fast-check/vitest';
import type { DType, GraphBuilder, Value } from '@stageml/ir';
import fc from 'fast-check';
import { describe, expect } from 'vitest';
import { arbCase, checkRewrite } from '../../test/harness.js';
import { addDropZero, divDropOne, foldConstants, mulDropOne, negCancelDouble, subDropZero } from '../index.js';

const dtypes = fc.constantFrom<DType>('f32', 'f32', 'f64', 'i32');
const width = fc.integer({ min: 1, max: 4 });

/** x : dtype[batch, d], coupled to the noise when f32; optionally also returned (shared). */
function input(b: GraphBuilder, dtype: DType, d: number, couple: (v: Value) => Value): Value {
  return couple(b.input('in', [dtype, ['batch', d]]));
}

// Shapes of a splat constant: [] and [1] never broadcast x up; [d] matches its last axis; [2, 1, 1]
// broadcasts it to a larger type, which the identities must refuse.
const constShape = (d: number): fc.Arbitrary<number[]> => fc.constantFrom([], [1], [d], [2, 1, 1]);
const keepsType = (shape: readonly number[]): boolean => shape.length <= 2;

const identityCase = (op: 'mul' | 'div' | 'add' | 'sub', value: number) =>
  arbCase(fc.record({ dtype: dtypes, d: width, swap: fc.boolean(), shape: width.chain(constShape), shared: fc.boolean(), neg0: fc.boolean() }), (b, p, couple) => {
    const x = input(b, op === 'div' && p.dtype === 'i32' ? 'f32' : p.dtype, p.d, couple);
    const shape = p.shape.length === 1 && p.shape[0] !== 1 ? [p.d] : p.shape;
    const c = b.constant(value === 0 && p.neg0 ? -0 : value, x.type.dtype, shape);
    const commutes = op === 'mul' || op === 'add';
    const y = b.op(op, commutes && p.swap ? [c, x] : [x, c], undefined, { name: 'root' });
    return p.shared ? { y, x } : { y };
  });

describe('mul.drop-one', () => {
  test.prop([identityCase('mul', 1)])('x · 1 → x keeps semantics, verifies and is idempotent', (c) => {
    checkRewrite(c, [mulDropOne], keepsType(c.params.shape) ? { fires: 'mul.drop-one' } : { notAt: 'root' });
  });
});

describe('div.drop-one', () => {
  test.prop([identityCase('div', 1)])('x / 1 → x keeps semantics, verifies and is idempotent', (c) => {
    checkRewrite(c, [divDropOne], keepsType(c.params.shape) ? { fires: 'div.drop-one' } : { notAt: 'root' });
  });
});

describe('add.drop-zero', () => {
  test.prop([identityCase('add', 0)])('x + 0 → x keeps semantics (either zero), verifies and is idempotent', (c) => {
    checkRewrite(c, [addDropZero], keepsType(c.params.shape) ? { fires: 'add.drop-zero' } : { notAt: 'root' });
  });
});

describe('sub.drop-zero', () => {
  test.prop([identityCase('sub', 0)])('x − 0 → x keeps semantics, verifies and is idempotent', (c) => {
    checkRewrite(c, [subDropZero], keepsType(c.params.shape) ? { fires: 'sub.drop-zero' } : { notAt: 'root' });
  });
});

describe('neg.cancel-double', () => {
  const arb = arbCase(fc.record({ dtype: dtypes, d: width, depth: fc.integer({ min: 2, max: 5 }), shared: fc.boolean() }), (b, p, couple) => {
    let v = input(b, p.dtype, p.d, couple);
    const chain: Value[] = [];
    for (let i = 0; i < p.depth; i++) chain.push((v = b.neg(v)));
    return p.shared ? { y: v, inner: chain[0]! } : { y: v };
  });
  test.prop([arb])('−(−x) → x on chains of negations keeps semantics and is idempotent', (c) => {
    const r = checkRewrite(c, [negCancelDouble], { fires: 'neg.cancel-double' });
    // An even chain collapses to x, an odd one to a single negation.
    let negs = 0;
    for (let v = r.graph.outputs.find((o) => o.name === 'y')!.value; ; negs++) {
      const n = r.graph.nodes[r.graph.values[v]!.node]!;
      if (n.kind !== 'op' || n.op !== 'neg') break;
      v = n.operands[0]!;
    }
    if (!c.params.shared) expect(negs).toBe(c.params.depth % 2);
  });
});

describe('pure.fold-constants', () => {
  const ops = ['add', 'sub', 'mul', 'maximum', 'neg', 'exp', 'tanh', 'reshape', 'transpose', 'sum', 'matmul'] as const;
  const values = (n: number) => fc.array(fc.integer({ min: -8, max: 8 }).map((k) => k / 4), { minLength: n, maxLength: n });
  const arb = arbCase(fc.record({ op: fc.constantFrom(...ops), a: values(6), c: values(6), nested: fc.boolean() }), (b, p, couple) => {
    const ca = b.constant(p.a, 'f32', [2, 3]);
    const cc = b.constant(p.c, 'f32', [2, 3]);
    const fold = (u: Value, w: Value): Value => {
      switch (p.op) {
        case 'neg':
        case 'exp':
        case 'tanh':
          return b.op(p.op, [u]);
        case 'reshape':
          return b.reshape(u, [3, 2]);
        case 'transpose':
          return b.transpose(u, [1, 0]);
        case 'sum':
          return b.sum(u, [1], true);
        case 'matmul':
          return b.matmul(u, w, { transposeB: true });
        case 'add':
        case 'sub':
        case 'mul':
        case 'maximum':
          return b.op(p.op, [u, w]);
      }
    };
    let k = fold(ca, cc);
    if (p.nested) k = b.add(k, b.scalar(0.5));
    const x = input(b, 'f32', k.type.shape.length === 0 ? 1 : Number(k.type.shape[k.type.shape.length - 1]), couple);
    return { y: b.add(b.reshape(x, ['batch', 1, x.type.shape[1]!]), k) };
  });
  test.prop([arb])('f(c₁, c₂) → c keeps semantics, verifies and is idempotent', (c) => {
    const r = checkRewrite(c, [foldConstants], { fires: 'pure.fold-constants', rtol: 0, atol: 0 });
    const leftover = r.graph.nodes.filter((n) => n.kind === 'op' && n.op !== 'constant' && n.operands.every((v) => r.graph.nodes[r.graph.values[v]!.node]!.kind === 'op' && (r.graph.nodes[r.graph.values[v]!.node] as { op: string }).op === 'constant'));
    expect(leftover).toEqual([]);
  });
});
