import { hostTensor } from '@stageml/ir';
import { describe, expect, test } from 'vitest';

import { allcloseReport, defaultTolerance } from './allclose.js';

const f32 = (shape: number[], values: number[]) => hostTensor('f32', shape, values);

describe('allcloseReport', () => {
  test('passes within |a − e| ≤ atol + rtol·|e| and reports the largest errors', () => {
    const r = allcloseReport(f32([3], [1, 2.0001, 100.01]), f32([3], [1, 2, 100]), { rtol: 1e-4, atol: 1e-4 });
    expect(r.pass).toBe(true);
    expect(r.maxAbs).toBeCloseTo(0.01, 5);
    expect(r.maxRel).toBeCloseTo(1e-4, 6);
    expect(r.worst).toBeUndefined();
  });

  test('names the multi-index of the worst element and counts every mismatch', () => {
    const r = allcloseReport(f32([2, 3], [0, 0, 0, 0, 1, 5]), f32([2, 3], [0, 0, 0, 0, 0, 0]), { rtol: 0, atol: 0.5 });
    expect(r.pass).toBe(false);
    expect(r.mismatches).toBe(2);
    expect(r.worst).toEqual([1, 2]);
    expect(r.worstValues).toEqual([5, 0]);
    expect(r.maxAbs).toBe(5);
  });

  test('treats NaN as equal to NaN and to nothing else', () => {
    expect(allcloseReport(f32([2], [Number.NaN, 1]), f32([2], [Number.NaN, 1])).pass).toBe(true);
    expect(allcloseReport(f32([1], [Number.NaN]), f32([1], [1])).pass).toBe(false);
    expect(allcloseReport(f32([1], [1]), f32([1], [Number.NaN])).pass).toBe(false);
  });

  test('requires infinities to match exactly, sign included', () => {
    expect(allcloseReport(f32([1], [Infinity]), f32([1], [Infinity])).pass).toBe(true);
    expect(allcloseReport(f32([1], [-Infinity]), f32([1], [Infinity]), { atol: 1e300 }).pass).toBe(false);
    expect(allcloseReport(f32([1], [3e38]), f32([1], [Infinity]), { rtol: 1 }).pass).toBe(false);
  });

  test('fails on dtype or shape disagreement before comparing values', () => {
    expect(allcloseReport(hostTensor('f64', [1], [1]), f32([1], [1])).structural).toMatch(/dtype/);
    expect(allcloseReport(f32([1, 2], [1, 1]), f32([2], [1, 1])).structural).toMatch(/shape/);
  });

  test('defaults to tolerances of the expected dtype, exact for integers', () => {
    expect(defaultTolerance('i32')).toEqual({ rtol: 0, atol: 0 });
    expect(defaultTolerance('bf16').rtol).toBeGreaterThan(defaultTolerance('f16').rtol);
    expect(allcloseReport(hostTensor('f16', [1], [1.001]), hostTensor('f16', [1], [1])).pass).toBe(true);
    expect(allcloseReport(hostTensor('i32', [1], [2]), hostTensor('i32', [1], [1])).pass).toBe(false);
  });
});

describe('toBeAllclose', () => {
  test('passes for tensors within tolerance', () => {
    expect(f32([2], [1, 2])).toBeAllclose(f32([2], [1, 2.000001]));
    expect(f32([2], [1, 2])).not.toBeAllclose(f32([2], [1, 3]));
  });

  test('fails with the worst index and the max abs and rel errors in the message', () => {
    expect(() => {
      expect(f32([2, 2], [1, 2, 3, 4])).toBeAllclose(f32([2, 2], [1, 2, 3, 8]), { rtol: 0.1, atol: 0 });
    }).toThrow(/1 element\(s\) differ; worst at \[1, 1\]: actual 4 vs expected 8; max abs error 4, max rel error 0\.5/);
  });

  test('fails for something that is not a host tensor', () => {
    expect(() => {
      expect([1, 2]).toBeAllclose(f32([2], [1, 2]));
    }).toThrow(/expected a HostTensor/);
  });
});
