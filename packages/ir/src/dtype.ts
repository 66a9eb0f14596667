import { IrCode, IrError } from './errors.js';

/** Every element type the IR knows, in a fixed order (used by printers and property tests). */
export const DTYPES = ['f64', 'f32', 'f16', 'bf16', 'i64', 'i32', 'i8', 'u8', 'bool'] as const;

/** An element type. */
export type DType = (typeof DTYPES)[number];

/** Floating-point element types. */
export type FloatDType = 'f64' | 'f32' | 'f16' | 'bf16';

/** Host storage the reference interpreter uses for each dtype (see `storageOf`). */
export type TensorData = Float64Array | Float32Array | Int32Array | Int8Array | Uint8Array;

const BYTES: Record<DType, number> = { f64: 8, f32: 4, f16: 2, bf16: 2, i64: 8, i32: 4, i8: 1, u8: 1, bool: 1 };

/** Whether `s` names a dtype. */
export function isDType(s: string): s is DType {
  return (DTYPES as readonly string[]).includes(s);
}

/** Parses a dtype name, throwing `IR_UNKNOWN_DTYPE` for anything else. */
export function parseDType(s: string): DType {
  if (isDType(s)) return s;
  throw new IrError(IrCode.UNKNOWN_DTYPE, `unknown dtype '${s}' (expected one of ${DTYPES.join(', ')})`);
}

/** Bytes one element of `dtype` occupies in memory and on disk. */
export function dtypeBytes(dtype: DType): number {
  return BYTES[dtype];
}

/** Whether `dtype` is a floating-point type. */
export function isFloatDType(dtype: DType): dtype is FloatDType {
  return dtype === 'f64' || dtype === 'f32' || dtype === 'f16' || dtype === 'bf16';
}

/** Whether `dtype` is an integer type (bool excluded). */
export function isIntDType(dtype: DType): boolean {
  return dtype === 'i64' || dtype === 'i32' || dtype === 'i8' || dtype === 'u8';
}

/**
 * Allocates host storage for `n` elements of `dtype`.
 *
 * NOTE: f16 and bf16 live in a Float32Array holding values already rounded to the narrow type, and
 * i64 lives in a Float64Array (exact for |x| ≤ 2^53); the interpreter is an oracle, not a memory
 * saver, and this keeps every kernel on plain numbers.
 */
export function allocData(dtype: DType, n: number): TensorData {
  switch (dtype) {
    case 'f64':
    case 'i64':
      return new Float64Array(n);
    case 'f32':
    case 'f16':
    case 'bf16':
      return new Float32Array(n);
    case 'i32':
      return new Int32Array(n);
    case 'i8':
      return new Int8Array(n);
    case 'u8':
    case 'bool':
      return new Uint8Array(n);
  }
}

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** Rounds an f32-representable number to the nearest bfloat16 (round to nearest even). */
export function roundBf16(x: number): number {
  if (Number.isNaN(x)) return x;
  f32Scratch[0] = x;
  const bits = u32Scratch[0]!;
  const rounded = (bits + 0x7fff + ((bits >>> 16) & 1)) & 0xffff0000;
  u32Scratch[0] = rounded >>> 0;
  return f32Scratch[0];
}

/** Converts a number to IEEE half-precision bits (round to nearest even). */
export function f16Bits(x: number): number {
  f32Scratch[0] = x;
  const bits = u32Scratch[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    let m = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    if (rest > half || (rest === half && (m & 1) === 1)) m += 1;
    return sign | m;
  }
  let m = mant >>> 13;
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (m & 1) === 1)) {
    m += 1;
    if (m === 0x400) {
      m = 0;
      e += 1;
      if (e >= 0x1f) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | m;
}

/** Converts IEEE half-precision bits to a number. */
export function f16FromBits(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Infinity : Number.NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

const f64Scratch = new Float64Array(1);
/** The f64 scratch's two words, little-endian: [low, high]. */
const f64Words = new Uint32Array(f64Scratch.buffer);

/**
 * Rounds a number to the nearest value with `mantissa` fraction bits (≤ 19) and minimum normal
 * exponent `minExp` (round to nearest, ties to even), directly from the f64 value: one rounding,
 * never f64 → f32 → narrow. Overflow past `maxFinite` + half an ulp gives ±∞.
 *
 * In the narrow type's normal range this rounds the f64 bits themselves (the cut falls in the high
 * word: keep `mantissa` fraction bits, round on the dropped high bits with the low word as the
 * sticky part; a carry moves into the exponent as it should). Results that would be subnormal in
 * the narrow type take `roundNarrowSlow`.
 */
function roundNarrow(x: number, mantissa: number, minExp: number, maxFinite: number): number {
  if (!Number.isFinite(x) || x === 0) return x;
  f64Scratch[0] = x;
  const hi = f64Words[1]!;
  const e = ((hi >>> 20) & 0x7ff) - 1023;
  if (e < minExp) return roundNarrowSlow(x, mantissa, minExp, maxFinite);
  const cut = 20 - mantissa;
  const unit = 1 << cut;
  const half = unit >>> 1;
  const rest = hi & (unit - 1);
  let kept = (hi - rest) >>> 0;
  if (rest > half || (rest === half && (f64Words[0] !== 0 || (kept & unit) !== 0))) kept = (kept + unit) >>> 0;
  f64Words[1] = kept;
  f64Words[0] = 0;
  const y = f64Scratch[0];
  if (y > maxFinite || y < -maxFinite) return x > 0 ? Number.POSITIVE_INFINITY : Number.NEGATIVE_INFINITY;
  return y;
}

/** `roundNarrow` by arithmetic (any magnitude; the path for results subnormal in the narrow type). */
function roundNarrowSlow(x: number, mantissa: number, minExp: number, maxFinite: number): number {
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

const BF16_MAX = 3.3895313892515355e38;

/**
 * Rounds `data[from, to)` — f32 values, e.g. a tensor in the IR's host storage — to `dtype` in
 * place (round to nearest even, overflow to ±∞, NaN kept), by bit operations on the f32 words: the
 * same values as `rounderFor(dtype)` applied to each element, at a fraction of its cost.
 * f32 and f64 leave the data as it is.
 */
export function roundFloat32InPlace(data: Float32Array, dtype: FloatDType, from = 0, to = data.length): void {
  if (dtype === 'f32' || dtype === 'f64') return;
  const u = new Uint32Array(data.buffer, data.byteOffset, data.length);
  if (dtype === 'bf16') {
    for (let i = from; i < to; i++) {
      const b = u[i]!;
      // Infinities and NaNs keep their bits (masking a NaN's low payload could make it ±∞).
      if ((b & 0x7f800000) === 0x7f800000) continue;
      u[i] = (b + 0x7fff + ((b >>> 16) & 1)) & 0xffff0000;
    }
    return;
  }
  for (let i = from; i < to; i++) {
    const b = u[i]!;
    const a = b & 0x7fffffff;
    if (a >= 0x7f800000) continue;
    const sign = b & 0x80000000;
    if (a >= 0x477ff000) {
      // ≥ 65520 (65504 + half an ulp; the tie goes to the even 65536): ±∞.
      u[i] = (sign | 0x7f800000) >>> 0;
    } else if (a >= 0x38800000) {
      // f16 normal (≥ 2^-14): keep 10 fraction bits of the f32's 23.
      u[i] = (sign | ((a + 0xfff + ((a >>> 13) & 1)) & 0xffffe000)) >>> 0;
    } else {
      // f16 subnormal: multiples of 2^-24, ties to even (x · 2^24 is exact in f64).
      const q = Math.abs(data[i]!) * 16777216;
      let r = Math.round(q);
      if (r - q === 0.5 && r % 2 === 1) r -= 1;
      const y = r / 16777216;
      data[i] = sign !== 0 ? -y : y;
    }
  }
}

/**
 * Whether every value of `stored` is exactly representable in `dtype` (so rounding a tensor stored
 * as `stored` to `dtype` is the identity and can be skipped): the same type, a float type into a
 * wider one of the same exponent range or a strict superset (bf16/f16 → f32/f64, f32 → f64).
 */
export function exactIn(stored: FloatDType, dtype: FloatDType): boolean {
  if (stored === dtype) return true;
  if (dtype === 'f64') return true;
  if (dtype === 'f32') return stored === 'bf16' || stored === 'f16';
  return false;
}

/** Rounds a number to the nearest half-precision value (ties to even, one rounding from f64). */
export function roundF16(x: number): number {
  return roundNarrow(x, 10, -14, 65504);
}

/**
 * Returns the function that rounds a computed (f64) result to `dtype`: float types round to
 * nearest, integer types truncate toward zero and wrap, bool maps non-zero to 1.
 */
export function rounderFor(dtype: DType): (x: number) => number {
  switch (dtype) {
    case 'f64':
      return (x) => x;
    case 'f32':
      return Math.fround;
    case 'f16':
      return roundF16;
    case 'bf16':
      return (x) => (Number.isNaN(x) ? x : roundNarrow(x, 7, -126, BF16_MAX));
    case 'i64':
      return (x) => (Number.isFinite(x) ? Math.trunc(x) : 0);
    case 'i32':
      return (x) => (Number.isFinite(x) ? Math.trunc(x) | 0 : 0);
    case 'i8':
      return (x) => (Number.isFinite(x) ? ((Math.trunc(x) << 24) >> 24) : 0);
    case 'u8':
      return (x) => (Number.isFinite(x) ? Math.trunc(x) & 0xff : 0);
    case 'bool':
      return (x) => (x !== 0 ? 1 : 0);
  }
}
