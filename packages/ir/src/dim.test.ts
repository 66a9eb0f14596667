import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';

import {
  type Dim,
  checkDim,
  dimAdd,
  dimDivExact,
  dimEquals,
  dimMul,
  dimProduct,
  dimSub,
  dimSymbols,
  dimToString,
  evalDim,
  isStaticDim,
  isSymbolName,
  parseDim,
  sym,
} from './dim.js';
import { IrCode } from './errors.js';

const seq = sym('seq');
const batch = sym('batch');

describe('sym', () => {
  test('makes a one-symbol polynomial', () => {
    expect(seq).toEqual({ terms: [{ vars: ['seq'], coef: 1 }], constant: 0 });
  });
  test('rejects names that are not identifiers with IR_INVALID_DIM', () => {
    expectCode(() => sym('1x'), IrCode.INVALID_DIM);
    expectCode(() => sym('a b'), IrCode.INVALID_DIM);
    expectCode(() => sym(''), IrCode.INVALID_DIM);
  });
});

describe('isSymbolName', () => {
  test('accepts identifiers and rejects everything else', () => {
    expect(isSymbolName('seq_len2')).toBe(true);
    expect(isSymbolName('_x')).toBe(true);
    expect(isSymbolName('2x')).toBe(false);
    expect(isSymbolName('a-b')).toBe(false);
  });
});

describe('isStaticDim', () => {
  test('is true exactly for numbers', () => {
    expect(isStaticDim(4)).toBe(true);
    expect(isStaticDim(seq)).toBe(false);
  });
});

describe('dimAdd', () => {
  test('adds numbers as numbers', () => {
    expect(dimAdd(2, 3)).toBe(5);
  });
  test('collects like terms and keeps the constant', () => {
    expect(dimToString(dimAdd(dimAdd(seq, 1), seq))).toBe('2*seq + 1');
  });
  test('collapses to a number when the symbolic terms cancel', () => {
    expect(dimAdd(dimAdd(seq, 3), dimMul(seq, -1))).toBe(3);
  });
});

describe('dimSub', () => {
  test('subtracts to zero for equal dims', () => {
    expect(dimSub(dimMul(batch, seq), dimMul(seq, batch))).toBe(0);
  });
  test('gives a negative constant for seq − (seq + 2)', () => {
    expect(dimSub(seq, dimAdd(seq, 2))).toBe(-2);
  });
});

describe('dimMul', () => {
  test('multiplies polynomials and orders terms canonically', () => {
    // (seq + 1)·(batch + 2) = batch·seq + batch + 2·seq + 2
    expect(dimToString(dimMul(dimAdd(seq, 1), dimAdd(batch, 2)))).toBe('batch*seq + batch + 2*seq + 2');
  });
  test('is commutative structurally', () => {
    expect(dimMul(seq, batch)).toEqual(dimMul(batch, seq));
  });
  test('represents powers by repeated symbols', () => {
    expect(dimToString(dimMul(seq, seq))).toBe('seq*seq');
  });
  test('keeps a zero constant +0 when scaling by a negative number (structural equality)', () => {
    const negSeq = dimMul(seq, -1) as { constant: number };
    expect(Object.is(negSeq.constant, 0)).toBe(true);
    expect(dimMul(seq, -1)).toEqual(dimSub(0, seq));
    expect(parseDim('-seq')).toEqual(dimSub(0, seq));
  });
  test('never yields −0, which would break structural equality and print as 0', () => {
    for (const d of [dimMul(0, -1), dimDivExact(0, -2)!, parseDim('-0'), dimProduct([0, -1]), parseDim('0*(-seq)')]) expect(Object.is(d, 0)).toBe(true);
    expect(Object.is((dimDivExact(dimMul(seq, 4), -2) as { constant: number }).constant, 0)).toBe(true);
  });
  test('multiplying by zero gives the number 0', () => {
    expect(dimMul(dimAdd(seq, 4), 0)).toBe(0);
  });
});

describe('dimProduct', () => {
  test('is 1 for no dims and multiplies the rest', () => {
    expect(dimProduct([])).toBe(1);
    expect(dimToString(dimProduct([2, seq, batch, 3]))).toBe('6*batch*seq');
  });
});

describe('dimEquals', () => {
  test('compares canonical forms', () => {
    expect(dimEquals(dimAdd(seq, seq), dimMul(2, seq))).toBe(true);
    expect(dimEquals(seq, batch)).toBe(false);
    expect(dimEquals(seq, 4)).toBe(false);
    expect(dimEquals(4, 4)).toBe(true);
  });
});

describe('dimToString', () => {
  test.each<[Dim, string]>([
    [4096, '4096'],
    [sym('seq'), 'seq'],
    [dimMul(sym('batch'), sym('seq')), 'batch*seq'],
    [dimAdd(sym('seq'), 1), 'seq + 1'],
    [dimSub(dimMul(sym('kv'), 2), 3), '2*kv - 3'],
    [dimSub(4, sym('seq')), '-seq + 4'],
    [dimMul(sym('seq'), -3), '-3*seq'],
    [dimSub(dimMul(sym('a'), sym('b')), sym('a')), 'a*b - a'],
  ])('prints %o as %s', (d, text) => {
    expect(dimToString(d)).toBe(text);
  });
});

describe('parseDim', () => {
  test.each<[string, string]>([
    ['4096', '4096'],
    ['seq', 'seq'],
    ['batch*seq', 'batch*seq'],
    ['seq*batch', 'batch*seq'],
    ['seq + 1', 'seq + 1'],
    ['(a + 1)*2', '2*a + 2'],
    ['(4*hidden)/4', 'hidden'],
    ['batch*seq/seq', 'batch'],
    ['-seq + 4', '-seq + 4'],
    ['2*kv - 3', '2*kv - 3'],
    ['  seq  +  seq ', '2*seq'],
    ['-(seq - 1)', '-seq + 1'],
  ])('parses %s to the canonical %s', (text, canonical) => {
    expect(dimToString(parseDim(text))).toBe(canonical);
  });

  test('inverts dimToString', () => {
    const d = dimSub(dimMul(dimAdd(sym('a'), 2), sym('b')), 7);
    expect(parseDim(dimToString(d))).toEqual(d);
  });

  test('accepts moderate nesting and rejects hostile nesting with IR_INVALID_DIM, not a stack overflow', () => {
    expect(parseDim(`${'('.repeat(100)}seq${')'.repeat(100)}`)).toEqual(seq);
    expect(parseDim(`${'-'.repeat(100)}2`)).toBe(2);
    expectCode(() => parseDim(`${'('.repeat(20000)}1${')'.repeat(20000)}`), IrCode.INVALID_DIM);
    expectCode(() => parseDim(`${'-'.repeat(20000)}1`), IrCode.INVALID_DIM);
  });

  test.each(['', 'seq +', '(seq', 'seq)', '2 3', 'seq % 2', '3/2', 'seq/batch', '(seq + 1)/2', 'hidden/4', 'seq/0', '1e3', '99999999999999999999'])(
    'rejects %j with IR_INVALID_DIM',
    (text) => {
      expectCode(() => parseDim(text), IrCode.INVALID_DIM);
    },
  );
});

describe('dimDivExact', () => {
  test('divides integers exactly or not at all', () => {
    expect(dimDivExact(12, 4)).toBe(3);
    expect(dimDivExact(12, 5)).toBeUndefined();
    expect(dimDivExact(12, 0)).toBeUndefined();
  });
  test('divides a polynomial by an integer when every coefficient divides', () => {
    expect(dimToString(dimDivExact(dimAdd(dimMul(seq, 4), 8), 4)!)).toBe('seq + 2');
    expect(dimDivExact(dimAdd(dimMul(seq, 4), 2), 4)).toBeUndefined();
  });
  test('divides by a monomial', () => {
    expect(dimDivExact(dimMul(dimMul(batch, seq), 4), dimMul(seq, 2))).toEqual(dimMul(batch, 2));
    expect(dimDivExact(dimMul(batch, seq), dimMul(batch, seq))).toBe(1);
    expect(dimDivExact(dimAdd(dimMul(batch, seq), seq), seq)).toEqual(dimAdd(batch, 1));
  });
  test('refuses a monomial divisor that leaves a remainder', () => {
    expect(dimDivExact(dimAdd(seq, 1), seq)).toBeUndefined();
    expect(dimDivExact(batch, seq)).toBeUndefined();
    expect(dimDivExact(8, seq)).toBeUndefined();
  });
  test('divides a multiple of a general polynomial by it', () => {
    const p = dimAdd(seq, 1);
    expect(dimDivExact(dimMul(p, 3), p)).toBe(3);
    expect(dimDivExact(dimMul(p, seq), p)).toBeUndefined();
  });
});

describe('dimSymbols', () => {
  test('lists symbols sorted and unique', () => {
    expect(dimSymbols(parseDim('seq*seq + batch*seq + 1'))).toEqual(['batch', 'seq']);
    expect(dimSymbols(7)).toEqual([]);
  });
});

describe('evalDim', () => {
  test('evaluates polynomials under bindings', () => {
    expect(evalDim(parseDim('2*batch*seq - seq + 3'), { batch: 4, seq: 5 })).toBe(38);
    expect(evalDim(12, {})).toBe(12);
  });
  test('names a symbol without binding with IR_EVAL_ERROR', () => {
    const e = expectCode(() => evalDim(parseDim('seq + batch'), { seq: 1 }), IrCode.EVAL_ERROR);
    expect(e.message).toContain("'batch'");
  });
});

describe('checkDim', () => {
  test('accepts non-negative integers and well-formed polynomials', () => {
    expect(checkDim(0)).toBe(0);
    expect(checkDim(seq)).toEqual(seq);
  });
  test('canonicalizes a hand-written polynomial (unsorted vars, zero terms)', () => {
    const d = checkDim({
      terms: [
        { vars: ['seq', 'batch'], coef: 2 },
        { vars: ['x'], coef: 0 },
      ],
      constant: 1,
    });
    expect(dimToString(d)).toBe('2*batch*seq + 1');
  });
  test.each<[string, unknown]>([
    ['negative', -1],
    ['fractional', 1.5],
    ['NaN', Number.NaN],
    ['infinite', Number.POSITIVE_INFINITY],
    ['unsafe', 2 ** 53],
    ['a string', 'seq'],
    ['null', null],
    ['missing terms', { constant: 0 }],
    ['a fractional constant', { terms: [], constant: 0.5 }],
    ['an empty monomial', { terms: [{ vars: [], coef: 1 }], constant: 0 }],
    ['a bad symbol', { terms: [{ vars: ['1a'], coef: 1 }], constant: 0 }],
    ['a fractional coefficient', { terms: [{ vars: ['a'], coef: 0.5 }], constant: 0 }],
    ['a null term', { terms: [null], constant: 0 }],
  ])('rejects %s with IR_INVALID_DIM', (_what, d) => {
    expectCode(() => checkDim(d), IrCode.INVALID_DIM);
  });
});
