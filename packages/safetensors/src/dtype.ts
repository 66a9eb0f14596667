import type { DType } from '@stageml/ir';

/**
 * Every safetensors dtype this package reads and writes, in the order the upstream writer lays
 * tensors out (descending `Dtype` enum order of huggingface/safetensors `tensor.rs`, which puts
 * wider elements first so that every tensor starts at a multiple of its element size).
 */
export const SAFETENSORS_DTYPES = [
  'U64',
  'I64',
  'F64',
  'F32',
  'U32',
  'I32',
  'BF16',
  'F16',
  'U16',
  'I16',
  'F8_E4M3',
  'F8_E5M2',
  'I8',
  'U8',
  'BOOL',
] as const;

/** A dtype name as it appears in a safetensors header. */
export type SafetensorsDType = (typeof SAFETENSORS_DTYPES)[number];

const BYTES: Record<SafetensorsDType, number> = {
  U64: 8,
  I64: 8,
  F64: 8,
  F32: 4,
  U32: 4,
  I32: 4,
  BF16: 2,
  F16: 2,
  U16: 2,
  I16: 2,
  F8_E4M3: 1,
  F8_E5M2: 1,
  I8: 1,
  U8: 1,
  BOOL: 1,
};

/**
 * The IR dtype `readTensor` returns for each safetensors dtype: narrower integers widen (I16 and
 * U16 to i32, U32 to i64), FP8 decodes to f32, U64 maps to i64 (exact up to 2^53).
 */
const IR_DTYPE: Record<SafetensorsDType, DType> = {
  U64: 'i64',
  I64: 'i64',
  F64: 'f64',
  F32: 'f32',
  U32: 'i64',
  I32: 'i32',
  BF16: 'bf16',
  F16: 'f16',
  U16: 'i32',
  I16: 'i32',
  F8_E4M3: 'f32',
  F8_E5M2: 'f32',
  I8: 'i8',
  U8: 'u8',
  BOOL: 'bool',
};

/** The safetensors dtype the writer uses for each IR dtype. */
const FROM_IR: Record<DType, SafetensorsDType> = {
  f64: 'F64',
  f32: 'F32',
  f16: 'F16',
  bf16: 'BF16',
  i64: 'I64',
  i32: 'I32',
  i8: 'I8',
  u8: 'U8',
  bool: 'BOOL',
};

const RANK = new Map<string, number>(SAFETENSORS_DTYPES.map((d, i) => [d, i]));

/** Whether `s` names a safetensors dtype this package supports. */
export function isSafetensorsDType(s: unknown): s is SafetensorsDType {
  return typeof s === 'string' && RANK.has(s);
}

/** Bytes one element of `dtype` occupies on disk. */
export function safetensorsDTypeBytes(dtype: SafetensorsDType): number {
  return BYTES[dtype];
}

/** The IR dtype of the host tensor `readTensor` returns for a tensor stored as `dtype`. */
export function hostDTypeOf(dtype: SafetensorsDType): DType {
  return IR_DTYPE[dtype];
}

/** The safetensors dtype a host tensor of IR dtype `dtype` is written as. */
export function safetensorsDTypeOf(dtype: DType): SafetensorsDType {
  return FROM_IR[dtype];
}

/** Whether `s` is an IR dtype name the writer accepts for host tensors. */
export function isHostDType(s: unknown): s is DType {
  return typeof s === 'string' && Object.hasOwn(FROM_IR, s);
}

/** Position of `dtype` in the upstream layout order (smaller is laid out first). */
export function layoutRank(dtype: SafetensorsDType): number {
  return RANK.get(dtype) ?? 0;
}
