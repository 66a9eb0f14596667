import { describe, expect, test } from 'vitest';
import { GraphBuilder } from './builder.js';

// Regression: interning keyed attributes by plain JSON text, where NaN and ±Infinity both print as
// null and −0 prints as 0, so distinct literals became one node.
describe('GraphBuilder interning of literals', () => {
  test('keeps NaN, +Infinity, −Infinity, 0 and −0 constants apart', () => {
    const b = new GraphBuilder('g');
    const ids = [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 0, -0].map((v) => b.constant(v).id);
    expect(new Set(ids).size).toBe(5);
    expect(b.constant(Number.NaN).id).toBe(ids[0]);
    expect(b.constant(-0).id).toBe(ids[4]);
  });
});
