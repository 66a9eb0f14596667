import type { DType, HostTensor, TensorData } from '@stageml/ir';

import {
  type SafetensorsDType,
  isHostDType,
  isSafetensorsDType,
  layoutRank,
  safetensorsDTypeBytes,
  safetensorsDTypeOf,
} from './dtype.js';
import { SafetensorsCode, SafetensorsError } from './errors.js';
import { HOST_LITTLE_ENDIAN, MAX_EXACT_INT, f32BitsToBf16, f32BitsToF16, swapBytes } from './float.js';
import { MAX_HEADER_BYTES, METADATA_KEY, elementCount, isPlainObject } from './header.js';

/** A tensor given as raw little-endian bytes under a safetensors dtype (written verbatim). */
export interface RawTensor {
  /** Element type as it will appear in the header. */
  readonly dtype: SafetensorsDType;
  /** Dims, outermost first. */
  readonly shape: readonly number[];
  /** Exactly element count × dtype size bytes, little-endian. */
  readonly data: Uint8Array;
}

/** What the writer accepts per tensor: raw bytes (upper-case dtype) or a host tensor (IR dtype). */
export type TensorInput = RawTensor | HostTensor;

/** Tensors to write, keyed by name. A `Map` also admits names an object literal cannot hold. */
export type TensorInputs = Readonly<Record<string, TensorInput>> | ReadonlyMap<string, TensorInput>;

/** One tensor of a planned file: header facts now, bytes on demand. */
export interface PlannedTensor {
  /** Tensor name. */
  readonly name: string;
  /** Dtype written to the header. */
  readonly dtype: SafetensorsDType;
  /** Shape written to the header. */
  readonly shape: readonly number[];
  /** `[begin, end)` in the data section. */
  readonly dataOffsets: readonly [number, number];
  /** Produces the tensor's little-endian bytes (encoding a host tensor on each call). */
  bytes(): Uint8Array;
}

/** A planned file: the length-prefixed, padded header and the tensors in layout order. */
export interface SafetensorsPlan {
  /** 8-byte length prefix followed by the padded JSON header. */
  readonly head: Uint8Array;
  /** Tensors in data-section order. */
  readonly tensors: readonly PlannedTensor[];
  /** Total file size in bytes. */
  readonly byteLength: number;
}

function badTensor(name: string, message: string): SafetensorsError {
  return new SafetensorsError(SafetensorsCode.BAD_TENSOR, `tensor '${name}': ${message}`, { tensor: name });
}

function checkShape(name: string, shape: unknown): { shape: number[]; count: number } {
  const ok = Array.isArray(shape) && shape.every((d) => typeof d === 'number' && Number.isSafeInteger(d) && d >= 0);
  const dims = ok ? (shape as number[]).map((d) => d + 0) : [];
  const count = ok ? elementCount(dims) : undefined;
  if (count === undefined) {
    throw new SafetensorsError(SafetensorsCode.BAD_SHAPE, `tensor '${name}': shape ${JSON.stringify(shape)} is not a list of non-negative integers with at most 2^53 elements`, {
      tensor: name,
    });
  }
  return { shape: dims, count };
}

function isTypedData(v: unknown): v is TensorData {
  return (
    v instanceof Float64Array || v instanceof Float32Array || v instanceof Int32Array || v instanceof Int8Array || v instanceof Uint8Array
  );
}

function intRange(name: string, dtype: DType, index: number, value: number): SafetensorsError {
  return new SafetensorsError(SafetensorsCode.INT_RANGE, `tensor '${name}': ${dtype} element ${String(index)} is ${String(value)}, not an integer in range`, {
    tensor: name,
  });
}

/** Bytes of a typed array (a fresh copy, so callers may mutate their data afterwards). */
function bytesOf(data: TensorData): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice();
}

function f32Bits(data: TensorData): Uint32Array {
  const f = data instanceof Float32Array ? data : Float32Array.from(data);
  return new Uint32Array(f.buffer, f.byteOffset, f.length);
}

function encodeIntegers(name: string, t: HostTensor, lo: number, hi: number, out: Int32Array | Int8Array | Uint8Array): Uint8Array {
  const d = t.data;
  for (let i = 0; i < d.length; i++) {
    const v = d[i]!;
    if (!Number.isInteger(v) || v < lo || v > hi) throw intRange(name, t.dtype, i, v);
    out[i] = v;
  }
  return new Uint8Array(out.buffer);
}

/**
 * Encodes a host tensor's elements to little-endian bytes of its safetensors dtype: f16 and bf16
 * round the stored f32 values to nearest even (exact for values already rounded, as IR storage
 * holds them), i64 writes two's-complement int64 and requires integers with |x| ≤ 2^53 (an i32, i8
 * or u8 given in a wider array must hold integers in range), bool writes 1 for any non-zero.
 */
export function encodeHostData(name: string, t: HostTensor): Uint8Array {
  const d = t.data;
  const n = d.length;
  switch (t.dtype) {
    case 'f64':
      return le(d instanceof Float64Array ? bytesOf(d) : new Uint8Array(Float64Array.from(d).buffer), 8);
    case 'f32':
      return le(d instanceof Float32Array ? bytesOf(d) : new Uint8Array(Float32Array.from(d).buffer), 4);
    case 'f16':
    case 'bf16': {
      const bits = f32Bits(d);
      const h = new Uint16Array(n);
      const conv = t.dtype === 'f16' ? f32BitsToF16 : f32BitsToBf16;
      for (let i = 0; i < n; i++) h[i] = conv(bits[i]!);
      return le(new Uint8Array(h.buffer), 2);
    }
    case 'i64': {
      // Low word first, each word little-endian: the int64's two's-complement bytes.
      const w = new Uint32Array(2 * n);
      for (let i = 0; i < n; i++) {
        const v = d[i]!;
        if (!Number.isInteger(v) || Math.abs(v) > MAX_EXACT_INT) throw intRange(name, t.dtype, i, v);
        const hi = Math.floor(v / 4294967296);
        w[2 * i] = v - hi * 4294967296;
        w[2 * i + 1] = hi;
      }
      return le(new Uint8Array(w.buffer), 4);
    }
    case 'i32':
      return le(d instanceof Int32Array ? bytesOf(d) : encodeIntegers(name, t, -0x80000000, 0x7fffffff, new Int32Array(n)), 4);
    case 'i8':
      return d instanceof Int8Array ? bytesOf(d) : encodeIntegers(name, t, -128, 127, new Int8Array(n));
    case 'u8':
      return d instanceof Uint8Array ? bytesOf(d) : encodeIntegers(name, t, 0, 255, new Uint8Array(n));
    case 'bool': {
      const out = new Uint8Array(n);
      for (let i = 0; i < n; i++) out[i] = d[i] === 0 ? 0 : 1;
      return out;
    }
  }
}

/** Converts host-order words to little-endian in place (a no-op on little-endian hosts). */
function le(bytes: Uint8Array, width: number): Uint8Array {
  if (!HOST_LITTLE_ENDIAN) swapBytes(bytes, width);
  return bytes;
}

interface Checked {
  readonly name: string;
  readonly dtype: SafetensorsDType;
  readonly shape: number[];
  readonly byteLength: number;
  readonly bytes: () => Uint8Array;
}

function checkTensor(name: string, t: unknown): Checked {
  if (name === METADATA_KEY) throw badTensor(name, `'${METADATA_KEY}' is reserved for metadata`);
  if (!isPlainObject(t)) throw badTensor(name, 'expected { dtype, shape, data }');
  const { dtype, data } = t;
  if (isSafetensorsDType(dtype)) {
    const { shape, count } = checkShape(name, t['shape']);
    if (!(data instanceof Uint8Array)) throw badTensor(name, `raw ${dtype} data must be a Uint8Array`);
    const byteLength = count * safetensorsDTypeBytes(dtype);
    if (data.length !== byteLength) {
      throw new SafetensorsError(SafetensorsCode.SIZE_MISMATCH, `tensor '${name}': ${dtype}[${shape.join(', ')}] needs ${String(byteLength)} bytes, data holds ${String(data.length)}`, {
        tensor: name,
      });
    }
    return { name, dtype, shape, byteLength, bytes: () => data };
  }
  if (isHostDType(dtype)) {
    const { shape, count } = checkShape(name, t['shape']);
    if (!isTypedData(data)) throw badTensor(name, `host ${dtype} data must be a typed array (see allocData)`);
    if (data.length !== count) {
      throw new SafetensorsError(SafetensorsCode.SIZE_MISMATCH, `tensor '${name}': ${dtype}[${shape.join(', ')}] needs ${String(count)} elements, data holds ${String(data.length)}`, {
        tensor: name,
      });
    }
    const host: HostTensor = { dtype, shape, data };
    const st = safetensorsDTypeOf(dtype);
    return { name, dtype: st, shape, byteLength: count * safetensorsDTypeBytes(st), bytes: () => encodeHostData(name, host) };
  }
  throw new SafetensorsError(SafetensorsCode.BAD_DTYPE, `tensor '${name}': dtype ${JSON.stringify(dtype)} is neither a safetensors nor an IR dtype`, {
    tensor: name,
  });
}

/** Compares strings by code point (UTF-8 byte order, as the upstream Rust writer sorts names). */
function compareCodePoints(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.codePointAt(i)!;
    const y = b.codePointAt(i)!;
    if (x !== y) return x - y;
    if (x > 0xffff) i++;
  }
  return a.length - b.length;
}

function checkMetadata(metadata: unknown): Record<string, string> {
  if (!isPlainObject(metadata) || Object.values(metadata).some((v) => typeof v !== 'string')) {
    throw new SafetensorsError(SafetensorsCode.BAD_METADATA, 'metadata must be an object whose values are all strings');
  }
  return Object.fromEntries(Object.entries(metadata)) as Record<string, string>;
}

/**
 * Validates tensors and lays out a file the way huggingface/safetensors does: tensors sorted by
 * dtype width (widest first, so each starts aligned to its element size) then by name, a compact
 * JSON header with `__metadata__` first, padded with spaces to a multiple of 8 bytes. For the
 * common single-dtype checkpoint this is plain name order, and the output is byte-identical to
 * upstream's.
 */
export function planSafetensors(tensors: TensorInputs, metadata?: Readonly<Record<string, string>>): SafetensorsPlan {
  const entries = tensors instanceof Map ? [...(tensors as ReadonlyMap<string, TensorInput>)] : isPlainObject(tensors) ? Object.entries(tensors) : undefined;
  if (entries === undefined) throw new SafetensorsError(SafetensorsCode.BAD_TENSOR, 'tensors must be an object or a Map of name → tensor');
  const checked = entries.map(([name, t]) => checkTensor(name, t));
  checked.sort((a, b) => layoutRank(a.dtype) - layoutRank(b.dtype) || compareCodePoints(a.name, b.name));
  const parts: string[] = [];
  if (metadata !== undefined) parts.push(`${JSON.stringify(METADATA_KEY)}:${JSON.stringify(checkMetadata(metadata))}`);
  let offset = 0;
  const planned: PlannedTensor[] = checked.map((c) => {
    const dataOffsets = [offset, offset + c.byteLength] as const;
    offset += c.byteLength;
    parts.push(`${JSON.stringify(c.name)}:{"dtype":"${c.dtype}","shape":[${c.shape.join(',')}],"data_offsets":[${String(dataOffsets[0])},${String(dataOffsets[1])}]}`);
    return { name: c.name, dtype: c.dtype, shape: c.shape, dataOffsets, bytes: c.bytes };
  });
  const json = new TextEncoder().encode(`{${parts.join(',')}}`);
  const n = json.length + ((8 - (json.length % 8)) % 8);
  if (n > MAX_HEADER_BYTES) {
    throw new SafetensorsError(SafetensorsCode.HEADER_TOO_LARGE, `header would take ${String(n)} bytes, over the ${String(MAX_HEADER_BYTES)}-byte limit readers enforce`);
  }
  const head = new Uint8Array(8 + n).fill(0x20, 8 + json.length);
  head.set(json, 8);
  new DataView(head.buffer).setUint32(0, n, true);
  return { head, tensors: planned, byteLength: 8 + n + offset };
}
