import { type DType, type HostTensor, f16Bits } from '@stageml/ir';
import { f32Bits, f64Bits, scalarLiteral, tensorTypeOf } from './types.js';

function sameBits(dtype: DType, a: number, b: number): boolean {
  return Object.is(a, b) || (Number.isNaN(a) && Number.isNaN(b)) || (dtype !== 'f64' && dtype !== 'f32' && dtype !== 'f16' && dtype !== 'bf16' && a === b);
}

/** Whether every element of a tensor has the same bits (it prints as a one-value `dense<v>`). */
export function isSplat(t: HostTensor): boolean {
  const first = t.data[0];
  if (first === undefined) return true;
  for (let i = 1; i < t.data.length; i++) if (!sameBits(t.dtype, t.data[i]!, first)) return false;
  return true;
}

/**
 * The body of a `dense<…>` attribute for a host tensor: a splat when every element is the same,
 * else nested lists in row-major order. Non-finite floats print as hex bit patterns, never as 0.
 */
export function denseBody(t: HostTensor): string {
  const n = t.data.length;
  if (n === 0) return '';
  if (isSplat(t)) return scalarLiteral(t.dtype, t.data[0]!);
  let pos = 0;
  const nest = (axis: number): string => {
    if (axis === t.shape.length) return scalarLiteral(t.dtype, t.data[pos++]!);
    const parts: string[] = [];
    for (let i = 0; i < t.shape[axis]!; i++) parts.push(nest(axis + 1));
    return `[${parts.join(', ')}]`;
  };
  return nest(0);
}

/** `dense<…> : tensor<…>` of a host tensor. */
export function denseAttr(t: HostTensor): string {
  return `dense<${denseBody(t)}> : ${tensorTypeOf({ dtype: t.dtype, shape: t.shape })}`;
}

/** Bytes per element and the blob alignment MLIR expects for a dtype (bool has no blob form). */
export function blobElementBytes(dtype: DType): number {
  switch (dtype) {
    case 'f64':
    case 'i64':
      return 8;
    case 'f32':
    case 'i32':
      return 4;
    case 'f16':
    case 'bf16':
      return 2;
    case 'i8':
    case 'u8':
    case 'bool':
      return 1;
  }
}

/**
 * The hex blob of a `dense_resource` entry: `0x`, a little-endian u32 alignment, then the elements'
 * little-endian bytes (f16/bf16 as their 16-bit patterns, i64 as two's complement). MLIR reads it
 * without any float parsing, so NaN, ±∞ and −0 survive bit-exactly.
 */
export function resourceBlob(t: HostTensor): string {
  const size = blobElementBytes(t.dtype);
  const bytes = new Uint8Array(4 + t.data.length * size);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, size, true);
  t.data.forEach((v, i) => {
    const at = 4 + i * size;
    switch (t.dtype) {
      case 'f64':
        view.setBigUint64(at, f64Bits(v), true);
        break;
      case 'f32':
        view.setUint32(at, f32Bits(v), true);
        break;
      case 'f16':
        view.setUint16(at, f16Bits(v), true);
        break;
      case 'bf16':
        view.setUint16(at, f32Bits(v) >>> 16, true);
        break;
      case 'i64':
        view.setBigInt64(at, BigInt(Math.trunc(v)), true);
        break;
      case 'i32':
        view.setInt32(at, v, true);
        break;
      case 'i8':
      case 'u8':
      case 'bool':
        view.setUint8(at, v & 0xff);
        break;
    }
  });
  return `0x${Buffer.from(bytes).toString('hex').toUpperCase()}`;
}

/** The `{-# dialect_resources: … #-}` section holding `blobs` (empty string when there are none). */
export function resourceSection(blobs: readonly { readonly key: string; readonly blob: string }[]): string {
  if (blobs.length === 0) return '';
  const entries = blobs.map((b) => `      ${b.key}: "${b.blob}"`).join(',\n');
  return `{-#\n  dialect_resources: {\n    builtin: {\n${entries}\n    }\n  }\n#-}\n`;
}
