import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';
import { parseDim, sym } from './dim.js';
import { IrCode } from './errors.js';
import { broadcastShapes, normalizeAxis, parseType, shapeToString, tensorType, typeBytes, typeEquals, typeToString } from './types.js';

describe('broadcastShapes', () => {
  test.each<[number[][], number[]]>([
    [[[2, 1, 3], [4, 1]], [2, 4, 3]],
    [[[], [3]], [3]],
    [[[1], [0]], [0]],
    [[[5, 1], [1, 1, 6], [6]], [1, 5, 6]],
  ])('broadcasts %j to %j', (shapes, want) => {
    expect(broadcastShapes(shapes)).toEqual(want);
  });
  test('keeps equal symbolic dims and stretches 1 to a symbol', () => {
    expect(shapeToString(broadcastShapes([[sym('seq'), 1], [1, parseDim('2*seq')]]))).toBe('[seq, 2*seq]');
  });
  test.each<[string, (number | ReturnType<typeof sym>)[][]]>([
    ['two different sizes', [[2], [3]]],
    ['0 against 2', [[0], [2]]],
    ['two different symbols (not provably equal)', [[sym('a')], [sym('b')]]],
    ['a symbol against a size', [[sym('a')], [4]]],
  ])('rejects %s with IR_SHAPE_MISMATCH', (_what, shapes) => {
    expectCode(() => broadcastShapes(shapes), IrCode.SHAPE_MISMATCH);
  });
});

describe('normalizeAxis', () => {
  test('counts negative axes from the end', () => {
    expect(normalizeAxis(-1, 3)).toBe(2);
    expect(normalizeAxis(0, 1)).toBe(0);
  });
  test.each<[number, number]>([
    [3, 3],
    [-4, 3],
    [0, 0],
    [0.5, 2],
  ])('rejects axis %d of rank %d with IR_BAD_ATTR', (axis, rank) => {
    expectCode(() => normalizeAxis(axis, rank), IrCode.BAD_ATTR);
  });
});

describe('parseType', () => {
  test('inverts typeToString', () => {
    const t = tensorType('bf16', ['batch', 'seq + 1', 4096]);
    expect(typeToString(t)).toBe('bf16[batch, seq + 1, 4096]');
    expect(typeEquals(parseType(typeToString(t)), t)).toBe(true);
    expect(parseType('f32[]')).toEqual({ dtype: 'f32', shape: [] });
  });
  test('rejects malformed text with its code', () => {
    expectCode(() => parseType('f32'), IrCode.PARSE_ERROR);
    expectCode(() => parseType('q8[2]'), IrCode.UNKNOWN_DTYPE);
    expectCode(() => parseType('f32[2, x +]'), IrCode.INVALID_DIM);
  });
});

describe('typeBytes', () => {
  test('multiplies elements by the dtype width, symbolically', () => {
    expect(typeBytes(tensorType('f16', [3, 4]))).toBe(24);
    expect(shapeToString([typeBytes(tensorType('f32', ['seq', 2]))])).toBe('[8*seq]');
  });
});
