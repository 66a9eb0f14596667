/**
 * Bit-level codecs for the narrow float formats and 64-bit integers. Everything here works on raw
 * bit patterns held in `Uint32Array`s so NaN payloads survive (a NaN read back as a JS number may
 * be canonicalised by the engine; an integer copy never is).
 */

/** Whether this host stores typed-array elements little-endian (every platform Node ships on). */
export const HOST_LITTLE_ENDIAN: boolean = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

let f16Table: Uint32Array | undefined;

/**
 * The f32 bit pattern of IEEE binary16 `h`, exact: every f16 value (subnormals, ±∞, NaN with its
 * payload shifted up) is an f32 value.
 */
export function f16ToF32Bits(h: number): number {
  const sign = (h & 0x8000) << 16;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0x1f) return (sign | 0x7f800000 | (mant << 13)) >>> 0;
  if (exp !== 0) return (sign | ((exp - 15 + 127) << 23) | (mant << 13)) >>> 0;
  if (mant === 0) return sign >>> 0;
  // Subnormal: mant · 2^-24; normalise so the leading 1 becomes the implicit bit.
  let e = -14;
  let m = mant;
  while ((m & 0x400) === 0) {
    m <<= 1;
    e -= 1;
  }
  return (sign | ((e + 127) << 23) | ((m & 0x3ff) << 13)) >>> 0;
}

/** A 65536-entry table from f16 bits to f32 bits (built on first use, 256 KiB). */
export function f16Table32(): Uint32Array {
  if (f16Table === undefined) {
    const t = new Uint32Array(65536);
    for (let h = 0; h < 65536; h++) t[h] = f16ToF32Bits(h);
    f16Table = t;
  }
  return f16Table;
}

/**
 * Rounds an f32 bit pattern to binary16 bits, round to nearest even; overflow goes to ±∞ and NaN
 * keeps the top of its payload (quieted if that would read as ∞).
 */
export function f32BitsToF16(bits: number): number {
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  const mant = bits & 0x7fffff;
  if (exp === 0xff) {
    if (mant === 0) return sign | 0x7c00;
    const payload = mant >>> 13;
    return sign | 0x7c00 | (payload === 0 ? 0x200 : payload);
  }
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal or zero result: the value is (1.mant) · 2^(e-1-10) in units of 2^-24.
    if (e < -10) return sign;
    const full = mant | 0x800000;
    const shift = 14 - e;
    const q = full >>> shift;
    const rest = full & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    return sign | (rest > half || (rest === half && (q & 1) === 1) ? q + 1 : q);
  }
  const q = mant >>> 13;
  const rest = mant & 0x1fff;
  // NOTE: a carry out of the mantissa correctly bumps the exponent (and reaches ∞ at the top).
  const h = (e << 10) | q;
  return sign | (rest > 0x1000 || (rest === 0x1000 && (q & 1) === 1) ? h + 1 : h);
}

/** Rounds an f32 bit pattern to bfloat16 bits, round to nearest even; NaN keeps its payload's top. */
export function f32BitsToBf16(bits: number): number {
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x7fffff) !== 0) {
    const h = bits >>> 16;
    return (h & 0x7f) === 0 ? h | 0x40 : h;
  }
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

let e4m3Table: Float32Array | undefined;
let e5m2Table: Uint32Array | undefined;

/**
 * Decodes FP8 E4M3 ("fn" variant, OCP FP8 spec): bias 7, no infinities, S.1111.111 is NaN, the
 * largest finite magnitude is 448, subnormals are m/8 · 2^-6.
 */
export function f8e4m3ToNumber(b: number): number {
  const sign = b & 0x80 ? -1 : 1;
  const exp = (b >>> 3) & 0xf;
  const mant = b & 0x7;
  if (exp === 0xf && mant === 0x7) return Number.NaN;
  if (exp === 0) return sign * (mant / 8) * 2 ** -6;
  return sign * (1 + mant / 8) * 2 ** (exp - 7);
}

/** A 256-entry table of FP8 E4M3 values (built on first use). */
export function f8e4m3Table(): Float32Array {
  if (e4m3Table === undefined) {
    const t = new Float32Array(256);
    for (let b = 0; b < 256; b++) t[b] = f8e4m3ToNumber(b);
    e4m3Table = t;
  }
  return e4m3Table;
}

/**
 * A 256-entry table from FP8 E5M2 bits to f32 bits. E5M2 is IEEE-like (bias 15, ±∞, NaN) and is
 * exactly the top byte of binary16, so `b` decodes as the f16 `b << 8`.
 */
export function f8e5m2Table32(): Uint32Array {
  if (e5m2Table === undefined) {
    const t = new Uint32Array(256);
    for (let b = 0; b < 256; b++) t[b] = f16ToF32Bits(b << 8);
    e5m2Table = t;
  }
  return e5m2Table;
}

/** Largest |x| an i64/u64 element may have to be exact as a JS number. */
export const MAX_EXACT_INT = 2 ** 53;

/** Whether the two's-complement int64 (hi signed, lo unsigned) has |x| ≤ 2^53. */
export function i64IsExact(hi: number, lo: number): boolean {
  return (hi >= -0x200000 && hi < 0x200000) || (hi === 0x200000 && lo === 0);
}

/** Whether the uint64 (hi, lo unsigned) is ≤ 2^53. */
export function u64IsExact(hi: number, lo: number): boolean {
  return hi < 0x200000 || (hi === 0x200000 && lo === 0);
}

/**
 * Rounds the uint64 `hi · 2^32 + lo` to the nearest f32 (ties to even) with a single rounding.
 *
 * NOTE: above 2^53 the f64 sum would round once and `Math.fround` again (double rounding). Bits
 * below bit 29 can only act as a sticky bit for f32 there, so they are folded into bit 28; what
 * remains spans at most 36 bits and is exact in f64, leaving `fround` as the only rounding.
 */
export function u64ToF32(hi: number, lo: number): number {
  if (hi < 0x200000) return Math.fround(hi * 4294967296 + lo);
  const folded = (lo & 0xe0000000) + ((lo & 0x1fffffff) !== 0 ? 0x10000000 : 0);
  return Math.fround(hi * 4294967296 + (folded >>> 0));
}

/** Rounds the int64 `hi · 2^32 + lo` (hi signed, lo unsigned) to the nearest f32, ties to even. */
export function i64ToF32(hi: number, lo: number): number {
  if (hi >= 0) return u64ToF32(hi, lo);
  const nlo = (~lo + 1) >>> 0;
  const nhi = (~hi + (nlo === 0 ? 1 : 0)) >>> 0;
  return -u64ToF32(nhi, nlo);
}

/** Reverses the byte order of every `width`-byte word of `bytes` in place. */
export function swapBytes(bytes: Uint8Array, width: number): void {
  if (width === 1) return;
  for (let i = 0; i + width <= bytes.length; i += width) {
    for (let a = i, b = i + width - 1; a < b; a++, b--) {
      const t = bytes[a]!;
      bytes[a] = bytes[b]!;
      bytes[b] = t;
    }
  }
}
