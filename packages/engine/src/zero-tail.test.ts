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

describe('SlotTables keeps the zeroTail promise', () => {
  test("an adapter's all-zero A rows are written after its other rows, their B rows zero", async () => {
    const { SlotTables } = await import('./slots.js');
    const module = 'model.layers.0.self_attn.q_proj';
    const tables = new SlotTables(2, 4, [{ module, inDim: 2, outDim: 3 }]);
    // rank 3: A [3, 2] with row 1 zero; B [out 3, r 3]; scale 2.
    const A = { dtype: 'f32', shape: [3, 2], data: Float32Array.from([1, 2, 0, 0, 3, 4]) } as const;
    const B = { dtype: 'f32', shape: [3, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6, 7, 8, 9]) } as const;
    const adapter = { name: 'z', dir: '', config: {}, modules: new Map([[module, { module, rank: 3, alpha: 6, scale: 2, A, B }]]), parameterFactors: [], overrides: new Map(), tokenRows: [], bytes: 0 };
    const slot = tables.write(adapter as unknown as Parameters<typeof tables.write>[0]);
    const a = tables.inputs[`slots.${module}.A`]!.data as Float32Array;
    const b = tables.inputs[`slots.${module}.B`]!.data as Float32Array;
    expect(Array.from(a.subarray(slot * 8, slot * 8 + 8))).toEqual([1, 2, 3, 4, 0, 0, 0, 0]);
    // B rows of the kept rank rows 0 and 2 (scale folded in), then zeros.
    expect(Array.from(b.subarray(slot * 12, slot * 12 + 12))).toEqual([2, 8, 14, 6, 12, 18, 0, 0, 0, 0, 0, 0]);
  });
});
