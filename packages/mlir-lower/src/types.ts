import { type DType, type Dim, type TensorType, isFloatDType } from '@stageml/ir';

/**
 * The MLIR element type of a dtype. `u8` is stored as signless `i8` (arith takes only signless
 * integers); the ops that care about signedness (compare, max/min, extend, int-to-float) read the
 * dtype and pick the unsigned variant. `bool` is `i1`.
 */
export function elementType(dtype: DType): string {
  switch (dtype) {
    case 'f64':
    case 'f32':
    case 'f16':
    case 'bf16':
    case 'i64':
    case 'i32':
    case 'i8':
      return dtype;
    case 'u8':
      return 'i8';
    case 'bool':
      return 'i1';
  }
}

/** Bit width of a dtype's MLIR element type. */
export function bitWidth(dtype: DType): number {
  switch (dtype) {
    case 'f64':
    case 'i64':
      return 64;
    case 'f32':
    case 'i32':
      return 32;
    case 'f16':
    case 'bf16':
      return 16;
    case 'i8':
    case 'u8':
      return 8;
    case 'bool':
      return 1;
  }
}

/** Whether a dtype is read as unsigned (`u8`, `bool`). */
export function isUnsigned(dtype: DType): boolean {
  return dtype === 'u8' || dtype === 'bool';
}

/** `tensor<?x4xf32>`: a dim prints as `?` unless it is a known integer. */
export function tensorTypeOf(t: TensorType): string {
  return shapedType('tensor', t.shape, elementType(t.dtype));
}

/** `tensor<…>` or `memref<…>` of a shape (symbolic dims print as `?`). */
export function shapedType(kind: 'tensor' | 'memref', shape: readonly Dim[], elem: string): string {
  const dims = shape.map((d) => (typeof d === 'number' ? String(d) : '?'));
  return `${kind}<${[...dims, elem].join('x')}>`;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const f64 = new Float64Array(1);
const u64 = new BigUint64Array(f64.buffer);

/** Bit pattern of a non-finite value in a float dtype, as an MLIR hex literal. */
function nonFiniteBits(dtype: DType, v: number): string {
  const nan = Number.isNaN(v);
  const neg = v < 0;
  switch (dtype) {
    case 'f64':
      return nan ? '0x7FF8000000000000' : neg ? '0xFFF0000000000000' : '0x7FF0000000000000';
    case 'f16':
      return nan ? '0x7E00' : neg ? '0xFC00' : '0x7C00';
    case 'bf16':
      return nan ? '0x7FC0' : neg ? '0xFF80' : '0x7F80';
    case 'f32':
    case 'i64':
    case 'i32':
    case 'i8':
    case 'u8':
    case 'bool':
      return nan ? '0x7FC00000' : neg ? '0xFF800000' : '0x7F800000';
  }
}

/** The shortest decimal that reads back as `v` in the dtype's precision, with the `.` MLIR needs. */
function decimal(v: number, single: boolean): string {
  if (Object.is(v, -0)) return '-0.0';
  let s = String(v);
  if (single) {
    for (let p = 1; p <= 9; p++) {
      const c = v.toPrecision(p);
      if (Math.fround(Number(c)) === v) {
        s = String(Number(c));
        break;
      }
    }
  }
  // MLIR float literals need a fraction: `1e-07` → `1.0e-07`, `3` → `3.0`.
  const [mant, exp] = s.split('e') as [string, string | undefined];
  const m = mant.includes('.') ? mant : `${mant}.0`;
  return exp === undefined ? m : `${m}e${exp}`;
}

/**
 * An MLIR scalar literal of `v` in `dtype`: floats as the shortest decimal that reads back exactly
 * (NaN and ±∞ as hex bit patterns, which is the only way MLIR spells them: `0x7FC00000` for f32
 * NaN), integers in decimal (`u8` as its signed `i8` bit pattern), bools as `true`/`false`.
 */
export function scalarLiteral(dtype: DType, v: number): string {
  if (dtype === 'bool') return v !== 0 ? 'true' : 'false';
  if (isFloatDType(dtype)) {
    if (!Number.isFinite(v)) return nonFiniteBits(dtype, v);
    return decimal(v, dtype !== 'f64');
  }
  if (dtype === 'u8') return String(((v & 0xff) << 24) >> 24);
  if (!Number.isFinite(v)) return '0';
  if (dtype === 'i64') {
    // NOTE: i64 lives in f64 on the host; the extremes print as their exact two's-complement bounds.
    if (v <= -(2 ** 63)) return '-9223372036854775808';
    if (v >= 2 ** 63) return '9223372036854775807';
  }
  return BigInt(Math.trunc(v)).toString();
}

/** The f32 bit pattern of a number (after rounding to f32). */
export function f32Bits(v: number): number {
  f32[0] = v;
  return u32[0]!;
}

/** The f64 bit pattern of a number. */
export function f64Bits(v: number): bigint {
  f64[0] = v;
  return u64[0]!;
}

/** The f32 value of a bit pattern. */
export function f32FromBits(bits: number): number {
  u32[0] = bits >>> 0;
  return f32[0]!;
}

/** The f64 value of a bit pattern. */
export function f64FromBits(bits: bigint): number {
  u64[0] = BigInt.asUintN(64, bits);
  return f64[0]!;
}
