import { test } from '@fast-check/vitest';
import type { Value } from '@stageml/ir';
import fc from 'fast-check';
import { describe } from 'vitest';
import { arbCase, checkRewrite } from '../../test/harness.js';
import { linearFoldInputScale, matmulAbsorbTranspose, matmulToLinear, matmulTransposeStaticWeight, mulFoldScaleIntoWeight } from '../index.js';

const dim = fc.integer({ min: 1, max: 4 });

describe('matmul.absorb-transpose', () => {
  // op(lhs) is [batch, m, k] (rank 3) or [m, k]; op(rhs) is [k, n]; each may be written as a
  // transpose of a stored operand, and each flag may already be set.
  const arb = arbCase(
    fc.record({ m: dim, k: dim, n: dim, batched: fc.boolean(), tl: fc.boolean(), tr: fc.boolean(), fa: fc.boolean(), fb: fc.boolean(), shared: fc.boolean() }).filter((p) => p.tl || p.tr),
    (b, p, couple) => {
      const lead = p.batched ? ['batch'] : [];
      // The stored lhs is what the transpose (if any) and the flag turn into [.., m, k].
      const lhsStored = p.tl !== p.fa ? [p.k, p.m] : [p.m, p.k];
      const rhsStored = p.tr !== p.fb ? [p.n, p.k] : [p.k, p.n];
      const a = couple(b.input('in', ['f32', [...lead, ...lhsStored]]));
      const w = b.param('w', ['f32', rhsStored]);
      const swap = (v: Value): Value => b.transpose(v, [...Array(v.type.shape.length).keys()].map((i, _, all) => (i >= all.length - 2 ? all.length * 2 - 3 - i : i)));
      const lhs = p.tl ? swap(a) : a;
      const rhs = p.tr ? swap(w) : w;
      const y = b.matmul(lhs, rhs, { transposeA: p.fa, transposeB: p.fb });
      return p.shared && p.tl ? { y, t: lhs } : { y };
    },
  );
  test.prop([arb])('a transpose of the last two axes moves into the matmul flag, keeping semantics', (c) => {
    checkRewrite(c, [matmulAbsorbTranspose], { fires: 'matmul.absorb-transpose', rtol: 0, atol: 0 });
  });
});

describe('matmul.to-linear', () => {
  const arb = arbCase(fc.record({ k: dim, n: dim, rank3: fc.boolean() }), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', p.rank3 ? ['batch', 2, p.k] : ['batch', p.k]]));
    return { y: b.matmul(x, b.param('w', ['f32', [p.n, p.k]]), { transposeB: true }) };
  });
  test.prop([arb])('x · wᵀ → linear(x, w) keeps semantics and is idempotent', (c) => {
    checkRewrite(c, [matmulToLinear], { fires: 'matmul.to-linear', rtol: 0, atol: 0 });
  });
});

describe('matmul.transpose-static-weight', () => {
  const arb = arbCase(fc.record({ k: dim, n: dim, shared: fc.boolean() }), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', p.k]]));
    const w = b.param('w', ['f32', [p.k, p.n]]);
    const y = b.op('matmul', [x, w], {}, { name: 'root' });
    // A shared weight would be stored twice (w and wᵀ): the rule must not fire then.
    return p.shared ? { y, z: b.matmul(b.input('other', ['f32', [1, p.k]]), w) } : { y };
  });
  test.prop([arb])('x · w → linear(x, wᵀ) for a static w fires only when it costs no memory', (c) => {
    checkRewrite(c, [matmulTransposeStaticWeight], c.params.shared ? { notAt: 'root' } : { fires: 'matmul.transpose-static-weight', rtol: 0, atol: 0 });
  });
});

describe('mul.fold-scale-into-weight', () => {
  const arb = arbCase(
    fc.record({ k: dim, n: dim, form: fc.constantFrom('linear', 'linear-bias', 'matmul-right', 'matmul-left'), swap: fc.boolean(), scale: fc.constantFrom('literal', 'param', 'param1'), s: fc.integer({ min: -8, max: 8 }) }),
    (b, p, couple) => {
      const x = couple(b.input('in', ['f32', p.form === 'matmul-left' ? [p.k, 'batch'] : ['batch', p.k]]));
      let prod: Value;
      if (p.form === 'matmul-left') prod = b.matmul(b.param('w', ['f32', [p.n, p.k]]), x);
      else if (p.form === 'matmul-right') prod = b.matmul(x, b.param('w', ['f32', [p.k, p.n]]));
      else prod = b.linear(x, b.param('w', ['f32', [p.n, p.k]]), p.form === 'linear-bias' ? b.param('bias', ['f32', [p.n]]) : undefined);
      const s = p.scale === 'literal' ? b.scalar(p.s / 4) : b.param('s', ['f32', p.scale === 'param1' ? [1] : []]);
      return { y: p.swap ? b.mul(s, prod) : b.mul(prod, s) };
    },
  );
  test.prop([arb])('s · (x · W) → x · (s · W) for static s and W keeps semantics and is idempotent', (c) => {
    checkRewrite(c, [mulFoldScaleIntoWeight], { fires: 'mul.fold-scale-into-weight' });
  });
});

describe('linear.fold-input-scale', () => {
  const arb = arbCase(fc.record({ k: dim, n: dim, bias: fc.boolean(), swap: fc.boolean(), s: fc.integer({ min: -8, max: 8 }), param: fc.boolean() }), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', p.k]]));
    const s = p.param ? b.param('s', ['f32', [1]]) : b.scalar(p.s / 4);
    const xs = p.swap ? b.mul(s, x) : b.mul(x, s);
    return { y: b.linear(xs, b.param('w', ['f32', [p.n, p.k]]), p.bias ? b.param('bias', ['f32', [p.n]]) : undefined) };
  });
  test.prop([arb])('(s · x)·Wᵀ → x·(s · W)ᵀ for static s and W keeps semantics and is idempotent', (c) => {
    checkRewrite(c, [linearFoldInputScale], { fires: 'linear.fold-input-scale' });
  });
});
