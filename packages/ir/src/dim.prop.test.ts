import { fc, test } from '@fast-check/vitest';
import { describe, expect, it } from 'vitest';

import {
  type Dim,
  dimAdd,
  dimDivExact,
  dimEquals,
  dimMul,
  dimProduct,
  dimSub,
  dimSum,
  dimToString,
  evalDim,
  isStaticDim,
  parseDim,
  substituteDim,
  sym,
} from './dim.js';

const SYMBOLS = ['a', 'b', 'seq'] as const;

/** Random polynomials built through the public arithmetic (so always canonical). */
const arbDim: fc.Arbitrary<Dim> = fc.letrec<{ dim: Dim }>((tie) => ({
  dim: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.integer({ min: -4, max: 6 }),
    fc.constantFrom(...SYMBOLS).map(sym),
    fc.tuple(tie('dim'), tie('dim')).map(([x, y]) => dimAdd(x, y)),
    fc.tuple(tie('dim'), tie('dim')).map(([x, y]) => dimSub(x, y)),
    fc.tuple(tie('dim'), tie('dim')).map(([x, y]) => dimMul(x, y)),
  ),
})).dim;

const arbBindings = fc.record({ a: fc.integer({ min: -3, max: 5 }), b: fc.integer({ min: -3, max: 5 }), seq: fc.integer({ min: 0, max: 9 }) });

describe('dim arithmetic', () => {
  test.prop([arbDim, arbDim, arbBindings])('agrees with integer arithmetic at every binding', (x, y, env) => {
    // `+ 0` because plain JS arithmetic may produce −0 where the dim evaluates to 0.
    expect(evalDim(dimAdd(x, y), env)).toBe(evalDim(x, env) + evalDim(y, env) + 0);
    expect(evalDim(dimSub(x, y), env)).toBe(evalDim(x, env) - evalDim(y, env) + 0);
    expect(evalDim(dimMul(x, y), env)).toBe(evalDim(x, env) * evalDim(y, env) + 0);
  });

  test.prop([arbDim, arbDim])('is commutative structurally (canonical forms)', (x, y) => {
    expect(dimAdd(x, y)).toEqual(dimAdd(y, x));
    expect(dimMul(x, y)).toEqual(dimMul(y, x));
  });

  test.prop([arbDim])('has x − x = 0 and 0 − x = −1 · x structurally', (x) => {
    expect(dimSub(x, x)).toBe(0);
    expect(dimSub(0, x)).toEqual(dimMul(x, -1));
    expect(dimMul(dimMul(x, -1), -1)).toEqual(x);
  });

  test.prop([fc.array(arbDim, { maxLength: 5 })])('dimSum and dimProduct equal folds of dimAdd and dimMul', (xs) => {
    expect(dimSum(xs)).toEqual(xs.reduce<Dim>((acc, d) => dimAdd(acc, d), 0));
    expect(dimProduct(xs)).toEqual(xs.reduce<Dim>((acc, d) => dimMul(acc, d), 1));
  });

  test.prop([arbDim])('keeps symbolic results symbolic and constant results numbers', (x) => {
    if (!isStaticDim(x)) expect(x.terms.length).toBeGreaterThan(0);
    expect(dimEquals(x, x)).toBe(true);
  });
});

describe('parseDim', () => {
  test.prop([arbDim])('inverts dimToString exactly', (x) => {
    expect(parseDim(dimToString(x))).toEqual(x);
  });
});

describe('dimDivExact', () => {
  test.prop([arbDim, fc.oneof(fc.integer({ min: 1, max: 5 }), fc.constantFrom(sym('a'), dimMul(sym('seq'), 3), dimMul(sym('a'), sym('b'))))])(
    'recovers x from x · m for integer and monomial divisors m',
    (x, m) => {
      expect(dimDivExact(dimMul(x, m), m)).toEqual(x);
    },
  );
});

describe('substituteDim', () => {
  it('replaces bound symbols and keeps the rest', () => {
    expect(dimToString(substituteDim(parseDim('batch*seq + 1'), { batch: 2 }))).toBe('2*seq + 1');
    expect(substituteDim(parseDim('batch*seq + 1'), { batch: 2, seq: 3 })).toBe(7);
    const d = parseDim('seq - 1');
    expect(substituteDim(d, { batch: 4 })).toBe(d);
  });

  test.prop([arbDim, arbBindings, fc.subarray([...SYMBOLS])])('then evaluating equals evaluating directly', (x, env, bound) => {
    const partial = Object.fromEntries(bound.map((s) => [s, env[s]]));
    expect(evalDim(substituteDim(x, partial), env)).toBe(evalDim(x, env));
  });
});
