import { describe, expect, test } from 'vitest';

import { zeroRowsLast } from './zero-tail.js';

describe('zeroRowsLast', () => {
  test('moves all-zero A rows after the others, keeping their order, and zeroes those rows of B', () => {
    // rank 4, in 2, out 3, at offsets 2 (A) and 1 (B) of larger tables.
    const A = Float32Array.from([9, 9, /* r0 */ 0, 0, /* r1 */ 1, 2, /* r2 */ 0, 0, /* r3 */ 3, 0, 9]);
    const B = Float32Array.from([7, /* r0 */ 1, 1, 1, /* r1 */ 2, 2, 2, /* r2 */ 5, 5, 5, /* r3 */ 3, 3, 3, 7]);
    expect(zeroRowsLast(A, 2, B, 1, 4, 2, 3)).toBe(2);
    expect(Array.from(A)).toEqual([9, 9, 1, 2, 3, 0, 0, 0, 0, 0, 9]);
    expect(Array.from(B)).toEqual([7, 2, 2, 2, 3, 3, 3, 0, 0, 0, 0, 0, 0, 7]);
  });
  test('leaves a slot without zero rows as it is', () => {
    const A = Float32Array.from([1, 2, 3, 4]);
    const B = Float32Array.from([5, 6]);
    expect(zeroRowsLast(A, 0, B, 0, 2, 2, 1)).toBe(2);
    expect(Array.from(A)).toEqual([1, 2, 3, 4]);
    expect(Array.from(B)).toEqual([5, 6]);
  });
});
