import { f16Bits, f16FromBits, roundBf16 } from '@stageml/ir';
import { describe, expect, it } from 'vitest';

import { decodeFloat32, decodeTensor } from './decode.js';
import { f16ToF32Bits, f32BitsToBf16, f32BitsToF16, f8e4m3ToNumber, i64ToF32, u64ToF32 } from './float.js';

const ctx = { file: 'test', tensor: 't' };
const bitsOf = (x: number): number => new Uint32Array(new Float32Array([x]).buffer)[0]!;
const f32Of = (bits: number): number => new Float32Array(new Uint32Array([bits]).buffer)[0]!;
const le16 = (...w: number[]): Uint8Array => new Uint8Array(new Uint16Array(w).buffer);

describe('F16 decoding', () => {
  it('decodes hand-computed values exactly', () => {
    const cases: [number, number][] = [
      [0x3c00, 1],
      [0xc000, -2],
      [0x7bff, 65504],
      [0x0001, 2 ** -24],
      [0x03ff, 1023 * 2 ** -24],
      [0x0400, 2 ** -14],
      [0x3555, 0.333251953125],
      [0x4248, 3.140625],
      [0x3bff, 0.99951171875],
      [0x7c00, Infinity],
      [0xfc00, -Infinity],
      [0x8000, -0],
    ];
    const t = decodeTensor('F16', [cases.length], le16(...cases.map(([h]) => h)), ctx);
    expect(t.dtype).toBe('f16');
    expect(Array.from(t.data)).toEqual(cases.map(([, v]) => v));
    expect(Number.isNaN(decodeFloat32('F16', le16(0x7e00))[0])).toBe(true);
  });

  it('agrees with the IR codec on all 65536 bit patterns', () => {
    for (let h = 0; h < 65536; h++) {
      const want = f16FromBits(h);
      const got = f32Of(f16ToF32Bits(h));
      if (!Object.is(got, want) && !(Number.isNaN(got) && Number.isNaN(want))) expect.fail(`f16 0x${h.toString(16)}: ${String(got)} ≠ ${String(want)}`);
      if (!Number.isNaN(want) && f32BitsToF16(bitsOf(want)) !== h) expect.fail(`f16 0x${h.toString(16)} does not re-encode`);
    }
  });

  it('rounds f32 to nearest even, overflowing to infinity', () => {
    expect(f32BitsToF16(bitsOf(1 + 2 ** -11))).toBe(0x3c00);
    expect(f32BitsToF16(bitsOf(1 + 3 * 2 ** -11))).toBe(0x3c02);
    expect(f32BitsToF16(bitsOf(65519))).toBe(0x7bff);
    expect(f32BitsToF16(bitsOf(65520))).toBe(0x7c00);
    expect(f32BitsToF16(bitsOf(2 ** -25))).toBe(0x0000);
    expect(f32BitsToF16(bitsOf(3 * 2 ** -26))).toBe(0x0001);
    expect(f32BitsToF16(bitsOf(1.5 * 2 ** -24))).toBe(0x0002);
    expect(f32BitsToF16(0x7fc00000)).toBe(0x7e00);
    expect(f32BitsToF16(0x7f800001)).toBe(0x7e00);
    for (let i = 0; i < 20000; i++) {
      const x = f32Of((Math.random() * 2 ** 32) >>> 0);
      if (!Number.isNaN(x)) expect(f32BitsToF16(bitsOf(x))).toBe(f16Bits(x));
    }
  });
});

describe('BF16 decoding', () => {
  it('decodes hand-computed values exactly', () => {
    const cases: [number, number][] = [
      [0x3f80, 1],
      [0x4049, 3.140625],
      [0xc2f7, -123.5],
      [0x3eab, 0.333984375],
      [0x7f7f, 3.3895313892515355e38],
      [0x0080, 2 ** -126],
      [0x0001, 2 ** -133],
      [0x7f80, Infinity],
      [0xff80, -Infinity],
    ];
    const t = decodeTensor('BF16', [cases.length], le16(...cases.map(([h]) => h)), ctx);
    expect(t.dtype).toBe('bf16');
    expect(Array.from(t.data)).toEqual(cases.map(([, v]) => v));
    expect(Number.isNaN(decodeFloat32('BF16', le16(0xffc0))[0])).toBe(true);
  });

  it('rounds f32 to nearest even like the IR', () => {
    expect(f32BitsToBf16(0x3f808000)).toBe(0x3f80);
    expect(f32BitsToBf16(0x3f818000)).toBe(0x3f82);
    expect(f32BitsToBf16(0x7f7fffff)).toBe(0x7f80);
    expect(f32BitsToBf16(0x7f800001)).toBe(0x7fc0);
    for (let i = 0; i < 20000; i++) {
      const x = f32Of((Math.random() * 2 ** 32) >>> 0);
      if (!Number.isNaN(x)) expect(f32Of(f32BitsToBf16(bitsOf(x)) << 16)).toBe(roundBf16(x));
    }
  });
});

describe('FP8 decoding', () => {
  it('decodes E4M3FN: bias 7, max 448, no infinities, S.1111.111 is NaN', () => {
    const cases: [number, number][] = [
      [0x00, 0],
      [0x80, -0],
      [0x38, 1],
      [0x3f, 1.875],
      [0xc4, -3],
      [0x7e, 448],
      [0xfe, -448],
      [0x78, 256],
      [0x01, 2 ** -9],
      [0x07, 7 * 2 ** -9],
      [0x08, 2 ** -6],
    ];
    const t = decodeTensor('F8_E4M3', [cases.length], new Uint8Array(cases.map(([b]) => b)), ctx);
    expect(t.dtype).toBe('f32');
    expect(Array.from(t.data)).toEqual(cases.map(([, v]) => v));
    expect(Array.from(decodeFloat32('F8_E4M3', new Uint8Array([0x7f, 0xff])), Number.isNaN)).toEqual([true, true]);
    const finite = Array.from({ length: 256 }, (_, b) => f8e4m3ToNumber(b)).filter((v) => !Number.isNaN(v));
    expect(finite).toHaveLength(254);
    expect(Math.max(...finite)).toBe(448);
  });

  it('decodes E5M2: IEEE-like with bias 15, infinities and NaN', () => {
    const cases: [number, number][] = [
      [0x3c, 1],
      [0xc2, -3],
      [0x7b, 57344],
      [0x7c, Infinity],
      [0xfc, -Infinity],
      [0x01, 2 ** -16],
      [0x04, 2 ** -14],
      [0x80, -0],
    ];
    const t = decodeTensor('F8_E5M2', [cases.length], new Uint8Array(cases.map(([b]) => b)), ctx);
    expect(Array.from(t.data)).toEqual(cases.map(([, v]) => v));
    expect(Array.from(decodeFloat32('F8_E5M2', new Uint8Array([0x7d, 0x7e, 0xff])), Number.isNaN)).toEqual([true, true, true]);
  });
});

describe('64-bit integers', () => {
  const i64 = (...xs: bigint[]): Uint8Array => new Uint8Array(new BigInt64Array(xs).buffer);

  it('reads I64 up to ±2^53 exactly and refuses beyond with ST_INT_RANGE', () => {
    const t = decodeTensor('I64', [4], i64(0n, -1n, 2n ** 53n, -(2n ** 53n)), ctx);
    expect(t.dtype).toBe('i64');
    expect(Array.from(t.data)).toEqual([0, -1, 2 ** 53, -(2 ** 53)]);
    expect(() => decodeTensor('I64', [1], i64(2n ** 53n + 1n), ctx)).toThrow(expect.objectContaining({ code: 'ST_INT_RANGE', tensor: 't' }));
    expect(() => decodeTensor('I64', [1], i64(-(2n ** 53n) - 1n), ctx)).toThrow(expect.objectContaining({ code: 'ST_INT_RANGE' }));
    expect(() => decodeTensor('U64', [1], new Uint8Array(new BigUint64Array([2n ** 64n - 1n]).buffer), ctx)).toThrow(
      expect.objectContaining({ code: 'ST_INT_RANGE' }),
    );
  });

  it('converts to f32 with one rounding (no int64 → f64 → f32 double rounding)', () => {
    // 2^60 + 2^36 + 1 lies just above the midpoint of two f32s; via f64 it lands on the midpoint.
    const x = 2n ** 60n + 2n ** 36n + 1n;
    expect(Math.fround(Number(x))).toBe(2 ** 60);
    expect(i64ToF32(0x10000010, 1)).toBe(2 ** 60 + 2 ** 37);
    expect(Array.from(decodeFloat32('I64', i64(x, -x, 2n ** 63n - 1n, -(2n ** 63n))))).toEqual([2 ** 60 + 2 ** 37, -(2 ** 60 + 2 ** 37), 2 ** 63, -(2 ** 63)]);
    expect(u64ToF32(0xffffffff, 0xffffffff)).toBe(2 ** 64);
    expect(u64ToF32(0, 16777217)).toBe(16777216);
  });
});

describe('integer widening', () => {
  it('widens I16 and U16 to i32 and U32 to i64', () => {
    const i16 = decodeTensor('I16', [3], le16(0xffff, 0x8000, 0x7fff), ctx);
    expect(i16.dtype).toBe('i32');
    expect(Array.from(i16.data)).toEqual([-1, -32768, 32767]);
    expect(Array.from(decodeTensor('U16', [1], le16(0xffff), ctx).data)).toEqual([65535]);
    const u32 = decodeTensor('U32', [1], new Uint8Array([0xff, 0xff, 0xff, 0xff]), ctx);
    expect(u32.dtype).toBe('i64');
    expect(Array.from(u32.data)).toEqual([4294967295]);
  });

  it('reads BOOL as 0/1, any non-zero byte being true', () => {
    expect(Array.from(decodeTensor('BOOL', [3], new Uint8Array([0, 1, 7]), ctx).data)).toEqual([0, 1, 1]);
  });
});
