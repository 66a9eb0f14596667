import { fc, test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';

import { exactIn, roundFloat32InPlace, rounderFor } from './dtype.js';

/**
 * The arithmetic rounding `rounderFor` used before the bit-level one (per element: log2, a power
 * of two, a division): the reference both fast paths must agree with, element for element.
 */
function reference(x: number, mantissa: number, minExp: number, maxFinite: number): number {
  if (Number.isNaN(x)) return x;
  if (!Number.isFinite(x) || x === 0) return x;
  const a = Math.abs(x);
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  else if (2 ** (e + 1) <= a) e++;
  const ulp = 2 ** (Math.max(e, minExp) - mantissa);
  const q = a / ulp;
  let r = Math.round(q);
  if (r - q === 0.5 && r % 2 === 1) r -= 1;
  const y = r * ulp;
  if (y > maxFinite) return x > 0 ? Number.POSITIVE_INFINITY : Number.NEGATIVE_INFINITY;
  return x > 0 ? y : -y;
}

const REF = {
  bf16: (x: number) => reference(x, 7, -126, 3.3895313892515355e38),
  f16: (x: number) => reference(x, 10, -14, 65504),
} as const;

const same = (a: number, b: number): boolean => Object.is(a, b) || (Number.isNaN(a) && Number.isNaN(b));

/** Values at every edge either narrow type has: ties, subnormals, the overflow thresholds, specials. */
function edges(): number[] {
  const xs = [0, -0, Number.NaN, Infinity, -Infinity, 1, -1, 65504, 65519.99, 65520, 65535, 65536, 3.3895313892515355e38, 3.4e38, -3.4e38, 3.4028234663852886e38];
  for (const m of [7, 10]) {
    for (const e of [-149, -140, -133, -130, -127, -126, -125, -30, -25, -24, -15, -14, -13, 0, 1, 15, 16, 100, 127]) {
      const b = 2 ** e;
      xs.push(b, -b, b * (1 + 2 ** -(m + 1)), b * (1 + 3 * 2 ** -(m + 1)), b * (1 + 2 ** -(m + 1) + 2 ** -40), b * (1 + 2 ** -(m + 1) - 2 ** -40), b * (2 - 2 ** -(m + 1)), b * (2 - 2 ** -(m + 2)));
    }
  }
  return xs;
}

describe('narrow rounding: bit operations against the arithmetic reference', () => {
  for (const dt of ['bf16', 'f16'] as const) {
    test(`${dt}: rounderFor on edge values (f64 inputs)`, () => {
      const round = rounderFor(dt);
      for (const x of edges()) expect(same(round(x), REF[dt](x)), `${dt} ${String(x)}: ${String(round(x))} vs ${String(REF[dt](x))}`).toBe(true);
    });

    test.prop([fc.double({ noNaN: false })], { numRuns: 20000 })(`${dt}: rounderFor on random doubles`, (x) => {
      expect(same(rounderFor(dt)(x), REF[dt](x))).toBe(true);
    });

    test.prop([fc.double({ min: -(2 ** -10), max: 2 ** -10 })], { numRuns: 5000 })(`${dt}: rounderFor near zero (subnormals)`, (x) => {
      expect(same(rounderFor(dt)(x), REF[dt](x))).toBe(true);
    });

    test.prop([fc.array(fc.integer({ min: 0, max: 0xffffffff }), { minLength: 1, maxLength: 300 })], { numRuns: 300 })(`${dt}: roundFloat32InPlace on random f32 bit patterns`, (bits) => {
      const data = new Float32Array(new Uint32Array(bits).buffer);
      const want = Array.from(data, (x) => Math.fround(REF[dt](x)));
      roundFloat32InPlace(data, dt);
      data.forEach((y, i) => { expect(same(y, want[i]!), `${dt} bits 0x${bits[i]!.toString(16)}: ${String(y)} vs ${String(want[i])}`).toBe(true); });
    });

    test(`${dt}: roundFloat32InPlace on edge values, only the range asked for`, () => {
      const xs = edges().map(Math.fround);
      const data = Float32Array.from(xs);
      roundFloat32InPlace(data, dt, 1, xs.length - 1);
      expect(same(data[0]!, xs[0]!) && same(data[xs.length - 1]!, xs[xs.length - 1]!)).toBe(true);
      for (let i = 1; i < xs.length - 1; i++) expect(same(data[i]!, Math.fround(REF[dt](xs[i]!))), `${dt} ${String(xs[i])}`).toBe(true);
    });

    test(`${dt}: rounding is the identity on its own values`, () => {
      const data = Float32Array.from(edges());
      roundFloat32InPlace(data, dt);
      const again = data.slice();
      roundFloat32InPlace(again, dt);
      again.forEach((y, i) => { expect(same(y, data[i]!)).toBe(true); });
    });
  }

  test('f32 and f64 leave the data as it is', () => {
    const data = Float32Array.from([1.1, -2.7e-40, 3e38]);
    const before = data.slice();
    roundFloat32InPlace(data, 'f32');
    roundFloat32InPlace(data, 'f64');
    expect(data).toEqual(before);
  });
});

describe('exactIn', () => {
  test('narrow types are exact in f32 and f64, never in each other', () => {
    expect(exactIn('bf16', 'bf16')).toBe(true);
    expect(exactIn('bf16', 'f32')).toBe(true);
    expect(exactIn('f16', 'f32')).toBe(true);
    expect(exactIn('f32', 'f64')).toBe(true);
    expect(exactIn('f16', 'bf16')).toBe(false);
    expect(exactIn('bf16', 'f16')).toBe(false);
    expect(exactIn('f32', 'bf16')).toBe(false);
    expect(exactIn('f64', 'f32')).toBe(false);
  });
});
