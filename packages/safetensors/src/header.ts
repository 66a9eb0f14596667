import { jsonDepth } from '@stageml/ir';
import { type SafetensorsDType, isSafetensorsDType, SAFETENSORS_DTYPES, safetensorsDTypeBytes } from './dtype.js';
import { SafetensorsCode, SafetensorsError, type SafetensorsErrorCode } from './errors.js';
import { findDuplicateKey } from './json-keys.js';

/** Largest header the reader accepts, in bytes (the upstream `MAX_HEADER_SIZE`). */
export const MAX_HEADER_BYTES = 100_000_000;

/**
 * Deepest JSON nesting a header may have. A valid header is 3 levels deep (root, tensor entry,
 * shape); hostile nesting thousands deep would otherwise overflow recursive consumers.
 */
export const MAX_HEADER_DEPTH = 16;

/** The reserved header key holding free-form string metadata. */
export const METADATA_KEY = '__metadata__';

/** What the header says about one tensor. */
export interface TensorInfo {
  /** Element type as written in the file. */
  readonly dtype: SafetensorsDType;
  /** Dims, outermost first (row-major). */
  readonly shape: readonly number[];
  /** Bytes of data: element count × dtype size. */
  readonly byteLength: number;
  /** `[begin, end)` relative to the start of the data section. */
  readonly dataOffsets: readonly [number, number];
}

/** A validated safetensors header. */
export interface SafetensorsHeader {
  /** N, the byte length of the JSON header (padding included). */
  readonly headerLength: number;
  /** Absolute offset of the data section: 8 + N. */
  readonly dataStart: number;
  /** Byte length of the data section. */
  readonly dataLength: number;
  /** Every tensor, in data-section order. */
  readonly tensors: ReadonlyMap<string, TensorInfo>;
  /** The `__metadata__` map, or undefined when the header has none. */
  readonly metadata: Readonly<Record<string, string>> | undefined;
}

function fail(code: SafetensorsErrorCode, message: string, file: string, tensor?: string): never {
  throw new SafetensorsError(code, message, { file, tensor });
}

/**
 * Reads N from the 8-byte little-endian prefix and checks it against the limit and the total
 * size. Throws `ST_TRUNCATED` when fewer than 8 bytes exist or the header runs past the end, and
 * `ST_HEADER_TOO_LARGE` when N > {@link MAX_HEADER_BYTES}.
 */
export function readHeaderLength(prefix: Uint8Array, totalSize: number, file: string): number {
  if (totalSize < 8 || prefix.length < 8) {
    fail(SafetensorsCode.TRUNCATED, `file holds ${String(Math.min(totalSize, prefix.length))} bytes, fewer than the 8-byte header length`, file);
  }
  const view = new DataView(prefix.buffer, prefix.byteOffset, 8);
  const lo = view.getUint32(0, true);
  const hi = view.getUint32(4, true);
  if (hi !== 0 || lo > MAX_HEADER_BYTES) {
    const n = (BigInt(hi) << 32n) | BigInt(lo);
    fail(SafetensorsCode.HEADER_TOO_LARGE, `header length ${n.toString()} exceeds the ${String(MAX_HEADER_BYTES)}-byte limit`, file);
  }
  if (lo > totalSize - 8) {
    fail(
      SafetensorsCode.TRUNCATED,
      `header length ${String(lo)} runs past the end of the file (${String(totalSize)} bytes, at most ${String(totalSize - 8)} after the length field)`,
      file,
    );
  }
  return lo;
}

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Decodes and parses the header JSON; throws `ST_BAD_JSON` or `ST_DUPLICATE_KEY`. */
function parseJson(bytes: Uint8Array, file: string): Record<string, unknown> {
  if (bytes[0] !== 0x7b) {
    fail(SafetensorsCode.BAD_JSON, `header must start with '{' (byte 0x7b), found ${describeByte(bytes[0])}`, file);
  }
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch (cause) {
    throw new SafetensorsError(SafetensorsCode.BAD_JSON, 'header is not valid UTF-8', { file, cause });
  }
  let root: unknown;
  const depth = jsonDepth(text);
  if (depth > MAX_HEADER_DEPTH) fail(SafetensorsCode.BAD_JSON, `header nests ${String(depth)} levels deep; the limit is ${String(MAX_HEADER_DEPTH)}`, file);
  try {
    root = JSON.parse(text);
  } catch (cause) {
    const detail = cause instanceof SyntaxError ? `: ${cause.message}` : '';
    throw new SafetensorsError(SafetensorsCode.BAD_JSON, `header is not well-formed JSON${detail}`, { file, cause });
  }
  if (!isPlainObject(root)) fail(SafetensorsCode.BAD_JSON, 'header JSON is not an object', file);
  const dup = findDuplicateKey(text);
  if (dup !== undefined) {
    const where = dup.path.length === 0 ? 'the header' : `'${dup.path.join('.')}'`;
    fail(SafetensorsCode.DUPLICATE_KEY, `key '${dup.key}' occurs twice in ${where}`, file, dup.path[0]);
  }
  return root;
}

function describeByte(b: number | undefined): string {
  return b === undefined ? 'nothing' : `0x${b.toString(16).padStart(2, '0')}`;
}

/** Whether `v` is a JSON object (not null, not an array). */
export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function parseMetadata(v: unknown, file: string): Readonly<Record<string, string>> {
  if (!isPlainObject(v)) fail(SafetensorsCode.BAD_METADATA, `'${METADATA_KEY}' must be an object of strings`, file);
  for (const [k, value] of Object.entries(v)) {
    if (typeof value !== 'string') {
      fail(SafetensorsCode.BAD_METADATA, `'${METADATA_KEY}.${k}' is ${JSON.stringify(value)}, not a string`, file);
    }
  }
  // Object.fromEntries defines own properties, so a key named "__proto__" stays plain data.
  return Object.freeze(Object.fromEntries(Object.entries(v as Record<string, string>)));
}

/** Checks a non-negative safe integer (and turns -0 into 0). */
function natural(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v + 0 : undefined;
}

/** Element count of a validated shape, or undefined past 2^53. */
export function elementCount(shape: readonly number[]): number | undefined {
  if (shape.includes(0)) return 0;
  let n = 1;
  for (const d of shape) {
    n *= d;
    if (!Number.isSafeInteger(n)) return undefined;
  }
  return n;
}

interface Entry extends TensorInfo {
  readonly name: string;
}

function parseEntry(name: string, v: unknown, dataLength: number, file: string): Entry {
  if (!isPlainObject(v)) {
    fail(SafetensorsCode.BAD_HEADER, `tensor '${name}': entry must be an object, got ${JSON.stringify(v)}`, file, name);
  }
  for (const field of ['dtype', 'shape', 'data_offsets']) {
    if (!Object.hasOwn(v, field)) fail(SafetensorsCode.BAD_HEADER, `tensor '${name}': missing '${field}'`, file, name);
  }
  const dtype = v['dtype'];
  if (!isSafetensorsDType(dtype)) {
    fail(
      SafetensorsCode.BAD_DTYPE,
      `tensor '${name}': dtype ${JSON.stringify(dtype)} is not one of ${SAFETENSORS_DTYPES.join(', ')}`,
      file,
      name,
    );
  }
  const rawShape = v['shape'];
  const shape = Array.isArray(rawShape) ? rawShape.map(natural) : undefined;
  if (shape === undefined || shape.some((d) => d === undefined)) {
    fail(SafetensorsCode.BAD_SHAPE, `tensor '${name}': shape ${JSON.stringify(rawShape)} is not a list of non-negative integers`, file, name);
  }
  const dims = shape as number[];
  const count = elementCount(dims);
  if (count === undefined) {
    fail(SafetensorsCode.BAD_SHAPE, `tensor '${name}': shape [${dims.join(', ')}] has more than 2^53 elements`, file, name);
  }
  const offsets = v['data_offsets'];
  const begin = Array.isArray(offsets) && offsets.length === 2 ? natural(offsets[0]) : undefined;
  const end = Array.isArray(offsets) && offsets.length === 2 ? natural(offsets[1]) : undefined;
  if (begin === undefined || end === undefined || begin > end) {
    fail(SafetensorsCode.OFFSETS, `tensor '${name}': data_offsets ${JSON.stringify(offsets)} is not [begin, end] with 0 ≤ begin ≤ end`, file, name);
  }
  if (end > dataLength) {
    fail(
      SafetensorsCode.TRUNCATED,
      `tensor '${name}': data_offsets [${String(begin)}, ${String(end)}] end past the data section (${String(dataLength)} bytes)`,
      file,
      name,
    );
  }
  const size = safetensorsDTypeBytes(dtype);
  if (end - begin !== count * size) {
    fail(
      SafetensorsCode.SIZE_MISMATCH,
      `tensor '${name}': ${dtype}[${dims.join(', ')}] needs ${String(count)} × ${String(size)} = ${String(count * size)} bytes, data_offsets [${String(begin)}, ${String(end)}] span ${String(end - begin)}`,
      file,
      name,
    );
  }
  return { name, dtype, shape: Object.freeze(dims), byteLength: end - begin, dataOffsets: Object.freeze([begin, end] as const) };
}

/** Checks that the ranges tile `[0, dataLength)` exactly; returns them in data order. */
function checkLayout(entries: Entry[], dataLength: number, file: string): Entry[] {
  const sorted = entries.sort((a, b) => a.dataOffsets[0] - b.dataOffsets[0] || a.dataOffsets[1] - b.dataOffsets[1]);
  let cursor = 0;
  let previous: Entry | undefined;
  for (const e of sorted) {
    const [begin, end] = e.dataOffsets;
    if (begin < cursor && previous !== undefined) {
      fail(
        SafetensorsCode.OVERLAP,
        `tensor '${e.name}' [${String(begin)}, ${String(end)}] overlaps tensor '${previous.name}' [${String(previous.dataOffsets[0])}, ${String(cursor)}]`,
        file,
        e.name,
      );
    }
    if (begin > cursor) {
      const after = previous === undefined ? 'the start of the data section' : `tensor '${previous.name}'`;
      fail(SafetensorsCode.GAP, `bytes [${String(cursor)}, ${String(begin)}) between ${after} and tensor '${e.name}' belong to no tensor`, file, e.name);
    }
    cursor = end;
    previous = e;
  }
  if (cursor !== dataLength) {
    fail(
      SafetensorsCode.GAP,
      `data section holds ${String(dataLength)} bytes but the tensors cover only [0, ${String(cursor)}); trailing bytes belong to no tensor`,
      file,
    );
  }
  return sorted;
}

/**
 * Parses and validates header bytes (the N bytes after the length field) against a data section
 * of `dataLength` bytes. Every entry needs a known dtype, a non-negative integer shape and
 * `data_offsets` whose span equals the element count times the dtype size; together the tensors
 * must tile the data section with no gap or overlap. Unknown fields inside an entry are ignored,
 * as upstream does.
 */
export function parseHeader(bytes: Uint8Array, dataLength: number, file: string): SafetensorsHeader {
  const root = parseJson(bytes, file);
  let metadata: Readonly<Record<string, string>> | undefined;
  const entries: Entry[] = [];
  for (const [name, value] of Object.entries(root)) {
    if (name === METADATA_KEY) metadata = parseMetadata(value, file);
    else entries.push(parseEntry(name, value, dataLength, file));
  }
  const tensors = new Map<string, TensorInfo>();
  for (const { name, ...info } of checkLayout(entries, dataLength, file)) tensors.set(name, Object.freeze(info));
  return { headerLength: bytes.length, dataStart: 8 + bytes.length, dataLength, tensors, metadata };
}
