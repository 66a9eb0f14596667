import { type SafetensorsDType, safetensorsDTypeBytes } from './dtype.js';

/**
 * An independent, deliberately naive decoder the fuzzer compares the fast path against: one
 * element at a time through `DataView` and the textbook formulas (no tables, no typed-array views,
 * no bit tricks shared with `decode.ts`). Internal to the package (not exported from index.ts).
 */

/** The value of element `i` as a JS number, or a bigint for 64-bit integers. */
export function referenceElement(dtype: SafetensorsDType, view: DataView, i: number): number | bigint {
  const at = i * safetensorsDTypeBytes(dtype);
  switch (dtype) {
    case 'F64':
      return view.getFloat64(at, true);
    case 'F32':
      return view.getFloat32(at, true);
    case 'F16':
      return ieee(view.getUint16(at, true), 5, 10);
    case 'BF16':
      return ieee(view.getUint16(at, true), 8, 7);
    case 'F8_E5M2':
      return ieee(view.getUint8(at), 5, 2);
    case 'F8_E4M3':
      return e4m3fn(view.getUint8(at));
    case 'I64':
      return view.getBigInt64(at, true);
    case 'U64':
      return view.getBigUint64(at, true);
    case 'I32':
      return view.getInt32(at, true);
    case 'U32':
      return view.getUint32(at, true);
    case 'I16':
      return view.getInt16(at, true);
    case 'U16':
      return view.getUint16(at, true);
    case 'I8':
      return view.getInt8(at);
    case 'U8':
      return view.getUint8(at);
    case 'BOOL':
      return view.getUint8(at) === 0 ? 0 : 1;
  }
}

/** An IEEE-754 binary format with `e` exponent and `m` mantissa bits, from its bit pattern. */
function ieee(bits: number, e: number, m: number): number {
  const sign = bits >>> (e + m) ? -1 : 1;
  const exp = (bits >>> m) & ((1 << e) - 1);
  const frac = bits & ((1 << m) - 1);
  const bias = (1 << (e - 1)) - 1;
  if (exp === (1 << e) - 1) return frac === 0 ? sign * Infinity : Number.NaN;
  if (exp === 0) return sign * frac * 2 ** (1 - bias - m);
  return sign * (1 + frac / 2 ** m) * 2 ** (exp - bias);
}

/** OCP FP8 E4M3FN: bias 7, only S.1111.111 is NaN, no infinities. */
function e4m3fn(bits: number): number {
  const sign = bits & 0x80 ? -1 : 1;
  const exp = (bits >> 3) & 15;
  const frac = bits & 7;
  if (exp === 15 && frac === 7) return Number.NaN;
  return exp === 0 ? sign * frac * 2 ** -9 : sign * (1 + frac / 8) * 2 ** (exp - 7);
}

const LIMIT = 2n ** 53n;

/** The host value `readTensor` must produce, or `'range'` when it must refuse (|x| > 2^53). */
export function referenceHost(value: number | bigint): number | 'range' {
  if (typeof value === 'number') return value;
  return value > LIMIT || value < -LIMIT ? 'range' : Number(value);
}

/** Nearest f32 to an integer given as a bigint, ties to even, computed with exact bigint arithmetic. */
export function referenceF32OfBigInt(x: bigint): number {
  if (x < 0n) return -referenceF32OfBigInt(-x);
  if (x === 0n) return 0;
  const bits = x.toString(2).length;
  if (bits <= 24) return Number(x);
  const shift = BigInt(bits - 24);
  let q = x >> shift;
  const rest = x - (q << shift);
  const half = 1n << (shift - 1n);
  if (rest > half || (rest === half && (q & 1n) === 1n)) q += 1n;
  const value = Number(q) * 2 ** Number(shift);
  return value > 3.4028234663852886e38 ? Infinity : value;
}

/** The f32 value `readFloat32` must produce for a reference element. */
export function referenceF32(value: number | bigint): number {
  return typeof value === 'bigint' ? referenceF32OfBigInt(value) : Math.fround(value);
}

/** Whether two numbers agree bit-for-bit as values (NaN equals NaN, 0 and -0 differ). */
export function sameNumber(a: number, b: number): boolean {
  return Object.is(a, b);
}
