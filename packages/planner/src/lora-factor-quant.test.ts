import { type HostTensor, seededRandom } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { PlanCode, loraFactorQuantBound, quantizeFactorRows } from './index.js';

function mat(rows: number, cols: number, seed: number, spread = 1): HostTensor {
  const r = seededRandom(seed);
  return { dtype: 'f32', shape: [rows, cols], data: Float32Array.from({ length: rows * cols }, () => (r() - 0.5) * spread) };
}

describe('quantizeFactorRows', () => {
  it('uses [−127, 127] with one f32 scale per row, half a step of error at most, zero rows as scale 0', () => {
    const src = Float32Array.from([3, -1, 0.25, 0, 0, 0, -0.001, 0.0005, 0]);
    const codes = new Int8Array(9);
    const scales = new Float32Array(3);
    const worst = quantizeFactorRows(src, 3, 3, codes, 0, scales, 0);
    expect([...codes.subarray(0, 3)]).toEqual([127, -42, 11]);
    expect(scales[0]).toBe(Math.fround(3 / 127));
    expect(scales[1]).toBe(0);
    expect(codes[6]).toBe(-127);
    expect(worst).toBeLessThanOrEqual(scales[0]! / 2);
  });
});

describe('loraFactorQuantBound', () => {
  it('measures ‖D̂ − D‖_F within the a-priori bound, and the measure is what the dequantized factors give', () => {
    const r = 6;
    const A = mat(r, 40, 1);
    const B = mat(24, r, 2, 0.2);
    const W = mat(24, 40, 3);
    const s = 1.5;
    const q = loraFactorQuantBound({ A, B, scale: s }, W);
    expect(q.frobenius).toBeGreaterThan(0);
    expect(q.frobenius).toBeLessThanOrEqual(q.apriori);
    // Independently: quantize the rows, form both products, compare.
    const aCodes = new Int8Array(r * 40);
    const aS = new Float32Array(r);
    quantizeFactorRows(A.data, r, 40, aCodes, 0, aS, 0);
    const bRows = Float32Array.from({ length: r * 24 }, (_, i) => s * Number(B.data[(i % 24) * r + Math.floor(i / 24)]));
    const bCodes = new Int8Array(r * 24);
    const bS = new Float32Array(r);
    quantizeFactorRows(bRows, r, 24, bCodes, 0, bS, 0);
    let e2 = 0;
    for (let o = 0; o < 24; o++) {
      for (let i = 0; i < 40; i++) {
        let d = 0;
        let dh = 0;
        for (let k = 0; k < r; k++) {
          d += bRows[k * 24 + o]! * Number(A.data[k * 40 + i]);
          dh += bCodes[k * 24 + o]! * bS[k]! * aCodes[k * 40 + i]! * aS[k]!;
        }
        e2 += (dh - d) ** 2;
      }
    }
    expect(Math.sqrt(e2)).toBeLessThanOrEqual(q.frobenius);
    expect(Math.sqrt(e2)).toBeGreaterThan(q.frobenius * 0.99);
    expect(q.relative).toBeCloseTo(q.frobenius / q.reference, 12);
  });

  it('is zero for zero factors and refuses shapes that disagree with PLAN_BAD_QUANT_CONFIG', () => {
    const zero = loraFactorQuantBound({ A: { dtype: 'f32', shape: [2, 3], data: new Float32Array(6) }, B: { dtype: 'f32', shape: [4, 2], data: new Float32Array(8) }, scale: 1 });
    expect(zero.frobenius).toBe(0);
    expect(zero.relative).toBe(0);
    expect(() => loraFactorQuantBound({ A: mat(2, 3, 1), B: mat(4, 3, 2), scale: 1 })).toThrow(expect.objectContaining({ code: PlanCode.BAD_QUANT_CONFIG }));
    expect(() => loraFactorQuantBound({ A: mat(2, 3, 1), B: mat(4, 2, 2), scale: 1 }, mat(5, 3, 3))).toThrow(expect.objectContaining({ code: PlanCode.BAD_QUANT_CONFIG }));
  });
});
