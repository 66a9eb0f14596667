/**
 * @packageDocumentation
 * Reads and writes the safetensors format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON header, then the data section.
 *
 * Invariants:
 * - Every header is validated in full before any tensor is read: known dtypes, integer shapes,
 *   `data_offsets` whose spans match shape × dtype size and tile the data section with no gap or
 *   overlap, a string-only `__metadata__`, no duplicate JSON keys. Bad input throws a
 *   `SafetensorsError` with a stable `ST_*` code, never a bare `TypeError`/`RangeError`.
 * - `SafetensorsFile` is lazy: opening reads only the header, each read fetches only that
 *   tensor's byte range.
 * - Decoding is exact and little-endian regardless of alignment; the writer's output reads back
 *   bit for bit and matches the upstream writer's layout byte for byte.
 */
export { SafetensorsCode, SafetensorsError, isSafetensorsError } from './errors.js';
export type { SafetensorsErrorCode, SafetensorsErrorOptions } from './errors.js';
export {
  SAFETENSORS_DTYPES,
  hostDTypeOf,
  isSafetensorsDType,
  safetensorsDTypeBytes,
  safetensorsDTypeOf,
} from './dtype.js';
export type { SafetensorsDType } from './dtype.js';
export { MAX_HEADER_BYTES, MAX_HEADER_DEPTH, METADATA_KEY, parseHeader, readHeaderLength } from './header.js';
export type { SafetensorsHeader, TensorInfo } from './header.js';
export { f16ToF32Bits, f32BitsToBf16, f32BitsToF16, f8e4m3ToNumber } from './float.js';
export { decodeFloat32, decodeTensor } from './decode.js';
export type { DecodeContext } from './decode.js';
export { SafetensorsBuffer, SafetensorsFile, SafetensorsTable, parseSafetensors } from './file.js';
export { memorySource, openFileSource } from './source.js';
export type { ByteSource } from './source.js';
export { encodeHostData, planSafetensors } from './encode.js';
export type { PlannedTensor, RawTensor, SafetensorsPlan, TensorInput, TensorInputs } from './encode.js';
export { serializeSafetensors, writeSafetensors } from './write.js';
export type { WriteOptions } from './write.js';
export { Checkpoint, loadWeightStore, openCheckpoint } from './checkpoint.js';
export type { CheckpointOptions, WeightReader } from './checkpoint.js';
