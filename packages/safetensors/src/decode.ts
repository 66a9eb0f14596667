import type { HostTensor, TensorData } from '@stageml/ir';

import { type SafetensorsDType, hostDTypeOf, safetensorsDTypeBytes } from './dtype.js';
import { SafetensorsCode, SafetensorsError } from './errors.js';
import {
  HOST_LITTLE_ENDIAN,
  f16Table32,
  f8e4m3Table,
  f8e5m2Table32,
  i64IsExact,
  i64ToF32,
  swapBytes,
  u64IsExact,
  u64ToF32,
} from './float.js';

/** Where decoded bytes came from, for error messages. */
export interface DecodeContext {
  /** File path or buffer label. */
  readonly file: string;
  /** Tensor name. */
  readonly tensor: string;
}

/**
 * Returns `bytes` as an aligned, host-endian buffer of `width`-byte words: the same bytes when
 * they already are, otherwise a copy (unaligned offsets are common: data offsets in a safetensors
 * file need not be multiples of the element size).
 */
function hostWords(bytes: Uint8Array, width: number): Uint8Array {
  if (HOST_LITTLE_ENDIAN && bytes.byteOffset % width === 0) return bytes;
  const copy = bytes.slice();
  if (!HOST_LITTLE_ENDIAN) swapBytes(copy, width);
  return copy;
}

function words16(bytes: Uint8Array): Uint16Array {
  const w = hostWords(bytes, 2);
  return new Uint16Array(w.buffer, w.byteOffset, w.length >>> 1);
}

function words32(bytes: Uint8Array): Uint32Array {
  const w = hostWords(bytes, 4);
  return new Uint32Array(w.buffer, w.byteOffset, w.length >>> 2);
}

type SameWidthArray = Float64Array | Float32Array | Int32Array | Int8Array | Uint8Array;

interface SameWidth<T extends SameWidthArray> {
  new (length: number): T;
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): T;
  readonly BYTES_PER_ELEMENT: number;
}

/**
 * `bytes` as a typed array of the same element width: a view over them when `adopt` allows it
 * and they are aligned (zero-copy), otherwise one memcpy into a fresh array.
 */
function sameWidth<T extends SameWidthArray>(Ctor: SameWidth<T>, bytes: Uint8Array, adopt: boolean): T {
  const width = Ctor.BYTES_PER_ELEMENT;
  if (adopt && HOST_LITTLE_ENDIAN && bytes.byteOffset % width === 0) return new Ctor(bytes.buffer, bytes.byteOffset, bytes.length / width);
  const out = new Ctor(bytes.length / width);
  const raw = new Uint8Array(out.buffer);
  raw.set(bytes);
  if (!HOST_LITTLE_ENDIAN) swapBytes(raw, width);
  return out;
}

/** Context for dtypes whose decoding cannot fail. */
const NO_CONTEXT: DecodeContext = { file: '', tensor: '' };

function rangeError(ctx: DecodeContext, dtype: SafetensorsDType, index: number, hi: number, lo: number): SafetensorsError {
  const big = dtype === 'I64' ? (BigInt(hi) << 32n) | BigInt(lo) : (BigInt(hi >>> 0) << 32n) | BigInt(lo);
  return new SafetensorsError(
    SafetensorsCode.INT_RANGE,
    `tensor '${ctx.tensor}': ${dtype} element ${String(index)} is ${big.toString()}, beyond ±2^53 (not exact as a host i64)`,
    { file: ctx.file, tensor: ctx.tensor, hint: 'use readRaw() for the exact 64-bit values' },
  );
}

function decode64Int(dtype: 'I64' | 'U64', bytes: Uint8Array, n: number, ctx: DecodeContext): Float64Array {
  const w = words32(bytes);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const lo = w[2 * i]!;
    if (dtype === 'I64') {
      const hi = w[2 * i + 1]! | 0;
      if (!i64IsExact(hi, lo)) throw rangeError(ctx, dtype, i, hi, lo);
      out[i] = hi * 4294967296 + lo;
    } else {
      const hi = w[2 * i + 1]!;
      if (!u64IsExact(hi, lo)) throw rangeError(ctx, dtype, i, hi, lo);
      out[i] = hi * 4294967296 + lo;
    }
  }
  return out;
}

/** Maps `n` 16-bit words through a bits table into f32 bit patterns. */
function mapBits16(bytes: Uint8Array, n: number, table: Uint32Array | null): Float32Array {
  const w = words16(bytes);
  const out = new Float32Array(n);
  const o = new Uint32Array(out.buffer);
  if (table === null) for (let i = 0; i < n; i++) o[i] = w[i]! << 16;
  else for (let i = 0; i < n; i++) o[i] = table[w[i]!]!;
  return out;
}

function decodeE4M3(bytes: Uint8Array, n: number): Float32Array {
  const t = f8e4m3Table();
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = t[bytes[i]!]!;
  return out;
}

function decodeE5M2(bytes: Uint8Array, n: number): Float32Array {
  const t = f8e5m2Table32();
  const out = new Float32Array(n);
  const o = new Uint32Array(out.buffer);
  for (let i = 0; i < n; i++) o[i] = t[bytes[i]!]!;
  return out;
}

/**
 * Decodes the little-endian bytes of one tensor to its host representation (see `hostDTypeOf`).
 * `bytes.length` must equal the element count times the dtype size (the header check guarantees
 * it). Throws `ST_INT_RANGE` for an I64/U64 element beyond ±2^53.
 *
 * With `adopt`, the caller hands `bytes` over (it was freshly read and nobody else holds it): for
 * dtypes stored as-is (F64, F32, I32, I8, U8) the result may then view those bytes without a copy.
 */
export function decodeTensor(
  dtype: SafetensorsDType,
  shape: readonly number[],
  bytes: Uint8Array,
  ctx: DecodeContext,
  adopt = false,
): HostTensor {
  const n = bytes.length / safetensorsDTypeBytes(dtype);
  return { dtype: hostDTypeOf(dtype), shape: [...shape], data: decodeData(dtype, bytes, n, ctx, adopt) };
}

function decodeData(dtype: SafetensorsDType, bytes: Uint8Array, n: number, ctx: DecodeContext, adopt = false): TensorData {
  switch (dtype) {
    case 'F64':
      return sameWidth(Float64Array, bytes, adopt);
    case 'F32':
      return sameWidth(Float32Array, bytes, adopt);
    case 'I32':
      return sameWidth(Int32Array, bytes, adopt);
    case 'I8':
      return sameWidth(Int8Array, bytes, adopt);
    case 'U8':
      return sameWidth(Uint8Array, bytes, adopt);
    case 'I64':
    case 'U64':
      return decode64Int(dtype, bytes, n, ctx);
    case 'U32': {
      const w = words32(bytes);
      const out = new Float64Array(n);
      for (let i = 0; i < n; i++) out[i] = w[i]!;
      return out;
    }
    case 'I16': {
      const w = words16(bytes);
      const out = new Int32Array(n);
      for (let i = 0; i < n; i++) out[i] = (w[i]! << 16) >> 16;
      return out;
    }
    case 'U16': {
      const w = words16(bytes);
      const out = new Int32Array(n);
      out.set(w);
      return out;
    }
    case 'F16':
      return mapBits16(bytes, n, f16Table32());
    case 'BF16':
      return mapBits16(bytes, n, null);
    case 'F8_E4M3':
      return decodeE4M3(bytes, n);
    case 'F8_E5M2':
      return decodeE5M2(bytes, n);
    case 'BOOL': {
      // NOTE: any non-zero byte reads as true (1), as NumPy and PyTorch treat a bool byte.
      const out = new Uint8Array(n);
      for (let i = 0; i < n; i++) out[i] = bytes[i] === 0 ? 0 : 1;
      return out;
    }
  }
}

/**
 * Decodes one tensor's little-endian bytes to f32, rounding to nearest even where the dtype is
 * wider (F64, I32, U32, I64, U64: one correct rounding, never two) and exactly otherwise.
 * `adopt` as for {@link decodeTensor}.
 */
export function decodeFloat32(dtype: SafetensorsDType, bytes: Uint8Array, adopt = false): Float32Array {
  const n = bytes.length / safetensorsDTypeBytes(dtype);
  switch (dtype) {
    case 'F32':
      return sameWidth(Float32Array, bytes, adopt);
    case 'F16':
      return mapBits16(bytes, n, f16Table32());
    case 'BF16':
      return mapBits16(bytes, n, null);
    case 'F8_E5M2':
    case 'F8_E4M3':
      return dtype === 'F8_E4M3' ? decodeE4M3(bytes, n) : decodeE5M2(bytes, n);
    case 'F64':
    case 'I32':
    case 'U32':
    case 'I16':
    case 'U16':
    case 'I8':
    case 'U8':
    case 'BOOL':
      // Each source value is exact as a JS number, so the store's fround is the only rounding.
      return Float32Array.from(decodeData(dtype, bytes, n, NO_CONTEXT));
    case 'I64':
    case 'U64': {
      const w = words32(bytes);
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) {
        const lo = w[2 * i]!;
        out[i] = dtype === 'I64' ? i64ToF32(w[2 * i + 1]! | 0, lo) : u64ToF32(w[2 * i + 1]!, lo);
      }
      return out;
    }
  }
}
