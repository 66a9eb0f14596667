import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';
import { DTYPES, allocData, dtypeBytes, f16Bits, f16FromBits, isFloatDType, isIntDType, parseDType, roundBf16, roundF16, rounderFor } from './dtype.js';
import { IrCode } from './errors.js';

describe('parseDType', () => {
  test('accepts every dtype and rejects others with IR_UNKNOWN_DTYPE', () => {
    for (const d of DTYPES) expect(parseDType(d)).toBe(d);
    expectCode(() => parseDType('float32'), IrCode.UNKNOWN_DTYPE);
  });
});

describe('dtype predicates', () => {
  test('classify float, integer and bool types and give their widths', () => {
    expect(DTYPES.filter(isFloatDType)).toEqual(['f64', 'f32', 'f16', 'bf16']);
    expect(DTYPES.filter(isIntDType)).toEqual(['i64', 'i32', 'i8', 'u8']);
    expect(DTYPES.map(dtypeBytes)).toEqual([8, 4, 2, 2, 8, 4, 1, 1, 1]);
    expect(allocData('i8', 3)).toBeInstanceOf(Int8Array);
  });
});

describe('f16Bits', () => {
  test.each<[number, number]>([
    [0, 0x0000],
    [-0, 0x8000],
    [1, 0x3c00],
    [-2, 0xc000],
    [65504, 0x7bff],
    [Number.POSITIVE_INFINITY, 0x7c00],
    [2 ** -24, 0x0001],
    [2 ** -14, 0x0400],
    [2 ** -14 - 2 ** -25, 0x0400],
  ])('encodes %d as 0x%s', (x, bits) => {
    expect(f16Bits(x)).toBe(bits);
  });
  test('encodes NaN as a quiet NaN', () => {
    expect(Number.isNaN(f16FromBits(f16Bits(Number.NaN)))).toBe(true);
  });
  test('round-trips every finite half-precision value', () => {
    const wrong: number[] = [];
    for (let h = 0; h < 0x10000; h++) {
      const x = f16FromBits(h);
      if (!Number.isNaN(x) && f16Bits(x) !== h) wrong.push(h);
    }
    expect(wrong).toEqual([]);
  });
});

describe('roundF16', () => {
  test('rounds to nearest, ties to even, including subnormals', () => {
    expect(roundF16(1 + 2 ** -11)).toBe(1);
    expect(roundF16(1 + 3 * 2 ** -11)).toBe(1 + 2 ** -9);
    expect(roundF16(3 * 2 ** -25)).toBe(2 ** -23);
    expect(roundF16(2 ** -25)).toBe(0);
  });
});

describe('roundBf16', () => {
  test('rounds to nearest, ties to even, and keeps NaN and infinities', () => {
    expect(roundBf16(1 + 2 ** -8)).toBe(1);
    expect(roundBf16(1 + 3 * 2 ** -8)).toBe(1 + 2 ** -6);
    expect(roundBf16(Number.NEGATIVE_INFINITY)).toBe(Number.NEGATIVE_INFINITY);
    expect(Number.isNaN(roundBf16(Number.NaN))).toBe(true);
    expect(roundBf16(3.4e38)).toBe(Number.POSITIVE_INFINITY);
  });
});

describe('rounderFor', () => {
  test('truncates and wraps integers and maps bool to 0/1', () => {
    expect([1.9, -1.9, 2 ** 32 + 5].map(rounderFor('i32'))).toEqual([1, -1, 5]);
    expect([255.5, 256, -1].map(rounderFor('u8'))).toEqual([255, 0, 255]);
    expect([128, -129].map(rounderFor('i8'))).toEqual([-128, 127]);
    expect([Number.NaN, Number.POSITIVE_INFINITY].map(rounderFor('i64'))).toEqual([0, 0]);
    expect([0, 3, -0.1].map(rounderFor('bool'))).toEqual([0, 1, 1]);
  });
});

describe('narrow rounding from f64', () => {
  test('rounds to f16 and bf16 once, not through f32 (no double rounding)', () => {
    // 1 + 2^-11 + 2^-40 is just above the f16 halfway point between 1 and 1 + 2^-10; rounding to
    // f32 first would land exactly on the halfway point and round (ties to even) down to 1.
    const x = 1 + 2 ** -11 + 2 ** -40;
    expect(rounderFor('f16')(x)).toBe(1 + 2 ** -10);
    const y = 1 + 2 ** -8 + 2 ** -40;
    expect(rounderFor('bf16')(y)).toBe(1 + 2 ** -7);
    expect(rounderFor('f16')(65520)).toBe(Number.POSITIVE_INFINITY);
    expect(rounderFor('f16')(65519)).toBe(65504);
    expect(rounderFor('f16')(2 ** -25)).toBe(0);
    expect(rounderFor('f16')(3 * 2 ** -26)).toBe(2 ** -24);
  });
});
