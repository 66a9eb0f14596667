import { StageError, seededRandom } from '@stageml/ir';

import { SAFETENSORS_DTYPES, type SafetensorsDType, safetensorsDTypeBytes } from './dtype.js';
import type { RawTensor } from './encode.js';
import { SafetensorsError } from './errors.js';
import { SafetensorsFile, parseSafetensors } from './file.js';
import { referenceElement, referenceF32, referenceHost, sameNumber } from './fuzz-reference.js';
import { METADATA_KEY } from './header.js';
import { memorySource } from './source.js';
import { serializeSafetensors } from './write.js';

/**
 * Mutation fuzzing of the reader, shared by `scripts/fuzz.ts` (long runs) and `fuzz.test.ts` (a
 * seeded sample). Internal to the package: not exported from index.ts.
 *
 * Each case builds a small valid file, mutates it, parses it, and demands one of two outcomes: a
 * `SafetensorsError` with a code, or a file whose every tensor reads back equal to the naive
 * reference decoder in `fuzz-reference.ts`. Anything else (another exception type, a mismatch, a
 * case over the time box) is a failure.
 */

/** A uniform [0, 1) stream. */
export type Rng = () => number;

function int(rng: Rng, n: number): number {
  return Math.floor(rng() * n);
}

function pick<T>(rng: Rng, xs: readonly T[]): T {
  return xs[int(rng, xs.length)]!;
}

function randomBytes(rng: Rng, n: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = int(rng, 256);
  return b;
}

/** Random data for a dtype; 64-bit integers are mostly small so the read path gets exercised. */
function randomData(rng: Rng, dtype: SafetensorsDType, count: number): Uint8Array {
  const bytes = randomBytes(rng, count * safetensorsDTypeBytes(dtype));
  if ((dtype === 'I64' || dtype === 'U64') && rng() < 0.8) {
    const view = new DataView(bytes.buffer);
    for (let i = 0; i < count; i++) view.setInt32(8 * i + 4, dtype === 'I64' ? int(rng, 0x400000) - 0x200000 : int(rng, 0x200000), true);
  }
  return bytes;
}

/** A small valid safetensors file with random dtypes, shapes, data and metadata. */
export function randomValidFile(rng: Rng): Uint8Array {
  const tensors: Record<string, RawTensor> = {};
  const count = int(rng, 6);
  for (let i = 0; i < count; i++) {
    const dtype = pick(rng, SAFETENSORS_DTYPES);
    const shape = Array.from({ length: int(rng, 4) }, () => int(rng, 5));
    const n = shape.reduce((a, b) => a * b, 1);
    tensors[`t${String(i)}.${pick(rng, ['weight', 'bias', 'é', '"q"', '\\'])}`] = { dtype, shape, data: randomData(rng, dtype, n) };
  }
  const metadata = rng() < 0.5 ? { format: 'pt', note: pick(rng, ['', 'x', 'ü', '{}']) } : undefined;
  return serializeSafetensors(tensors, metadata);
}

/** Splits a file into its header JSON value and data section (the file must be valid). */
function split(file: Uint8Array): { header: Record<string, unknown>; data: Uint8Array } {
  const n = new DataView(file.buffer, file.byteOffset).getUint32(0, true);
  const header = JSON.parse(new TextDecoder().decode(file.subarray(8, 8 + n))) as Record<string, unknown>;
  return { header, data: file.subarray(8 + n) };
}

/** Reassembles a file from header text and data, with a correct length field. */
function join(headerText: string | Uint8Array, data: Uint8Array, pad = 0): Uint8Array {
  const json = typeof headerText === 'string' ? new TextEncoder().encode(headerText) : headerText;
  const out = new Uint8Array(8 + json.length + pad + data.length);
  new DataView(out.buffer).setUint32(0, json.length + pad, true);
  out.set(json, 8);
  out.fill(0x20, 8 + json.length, 8 + json.length + pad);
  out.set(data, 8 + json.length + pad);
  return out;
}

const WEIRD: readonly unknown[] = [-1, 1.5, '3', null, true, [], {}, 2 ** 60, 2 ** 53, -0, 1e308, 'F32', 'f32', 'F8_E8M0', 'C64', ''];

/** Structured edits of one header field; each returns a description. */
function mutateJson(rng: Rng, header: Record<string, unknown>, data: Uint8Array): string {
  const names = Object.keys(header).filter((k) => k !== METADATA_KEY);
  const name = names.length > 0 ? pick(rng, names) : undefined;
  const entry = name === undefined ? undefined : (header[name] as Record<string, unknown>);
  const choice = int(rng, 12);
  if (entry === undefined || choice === 0) {
    header[`extra${String(int(rng, 3))}`] = { dtype: pick(rng, SAFETENSORS_DTYPES), shape: [int(rng, 3)], data_offsets: [int(rng, data.length + 2), int(rng, data.length + 2)] };
    return 'add-entry';
  }
  const offsets = entry['data_offsets'] as number[];
  const shape = entry['shape'] as unknown[];
  switch (choice) {
    case 1:
      entry['dtype'] = rng() < 0.5 ? pick(rng, SAFETENSORS_DTYPES) : pick(rng, WEIRD);
      return 'dtype';
    case 2:
      if (shape.length > 0 && rng() < 0.6) shape[int(rng, shape.length)] = rng() < 0.5 ? pick(rng, WEIRD) : int(rng, 6);
      else if (rng() < 0.5) shape.push(pick(rng, [0, 1, 2, -1, 1.5]));
      else shape.pop();
      return 'shape';
    case 3:
      offsets[int(rng, 2)]! += pick(rng, [-1, 1, -8, 8, 2 ** 40]);
      return 'offsets-shift';
    case 4:
      entry['data_offsets'] = pick(rng, [[offsets[1], offsets[0]], [offsets[0]], [...offsets, 0], [pick(rng, WEIRD), offsets[1]], 'x', null]);
      return 'offsets-shape';
    case 5:
      Reflect.deleteProperty(entry, pick(rng, ['dtype', 'shape', 'data_offsets']));
      return 'delete-field';
    case 6:
      header[name!] = pick(rng, WEIRD);
      return 'entry-type';
    case 7:
      header[METADATA_KEY] = pick(rng, [{ a: 1 }, { a: null }, ['x'], 'x', null, JSON.parse('{"__proto__":"x"}'), JSON.parse('{"__proto__":1}'), { b: { c: 'd' } }, {}]);
      return 'metadata';
    case 8:
      header[`${name!}.copy`] = { ...entry };
      return 'overlap';
    case 9:
      Reflect.deleteProperty(header, name!);
      return 'delete-entry';
    case 10:
      entry['extra_field'] = pick(rng, WEIRD);
      return 'unknown-field';
    default:
      header[`${name!}.empty`] = { dtype: 'F32', shape: [0], data_offsets: [offsets[1], offsets[1]] };
      return 'zero-size';
  }
}

type Mutation = (rng: Rng, file: Uint8Array) => Uint8Array;

/** End of the header per the length field, clamped to the file (mutations also see broken files). */
function headerEnd(file: Uint8Array): number {
  if (file.length < 8) return file.length;
  return Math.min(file.length, 8 + new DataView(file.buffer, file.byteOffset).getUint32(0, true));
}

/** Sets one random byte anywhere; never throws, so it is the fallback for broken inputs. */
function anyByte(rng: Rng, f: Uint8Array): Uint8Array {
  const g = f.slice();
  if (g.length > 0) g[int(rng, g.length)] = int(rng, 256);
  return g;
}

/** Every mutation, by name. */
export const MUTATIONS: Readonly<Record<string, Mutation>> = {
  'header-byte': (rng, f) => {
    const g = f.slice();
    g[8 + int(rng, Math.max(1, headerEnd(f) - 8))] = int(rng, 256);
    return g;
  },
  'data-byte': (rng, f) => {
    const g = f.slice();
    if (g.length > headerEnd(f)) g[headerEnd(f) + int(rng, g.length - headerEnd(f))] = int(rng, 256);
    return g;
  },
  'length-field': (rng, f) => {
    const g = f.slice();
    const view = new DataView(g.buffer);
    const n = headerEnd(f) - 8;
    const lo = pick(rng, [0, 1, n - 1, n + 1, n + 8, f.length - 8, f.length - 7, 100_000_001, 0xffffffff, int(rng, 2 ** 32)]);
    view.setUint32(0, Math.max(0, lo), true);
    view.setUint32(4, rng() < 0.2 ? int(rng, 2 ** 32) : 0, true);
    return g;
  },
  truncate: (rng, f) => f.slice(0, int(rng, f.length)),
  append: (rng, f) => {
    const g = new Uint8Array(f.length + 1 + int(rng, 16));
    g.set(f);
    g.set(randomBytes(rng, g.length - f.length), f.length);
    return g;
  },
  json: (rng, f) => {
    const { header, data } = split(f);
    mutateJson(rng, header, data);
    return join(JSON.stringify(header), data, int(rng, 9));
  },
  'duplicate-key': (rng, f) => {
    const { header, data } = split(f);
    const text = JSON.stringify(header);
    const key = pick(rng, [...Object.keys(header), 'dtype']);
    const at = text.indexOf(`${JSON.stringify(key)}:`);
    if (at < 0) return join(`{"a":1,"a":1}`, data);
    const value = key === 'dtype' ? '"F32"' : JSON.stringify(header[key]);
    return join(`${text.slice(0, at)}${JSON.stringify(key)}:${value},${text.slice(at)}`, data);
  },
  'reorder-data': (rng, f) => {
    const { header, data } = split(f);
    const names = Object.keys(header).filter((k) => k !== METADATA_KEY);
    const parts = names.map((k) => {
      const [b, e] = (header[k] as { data_offsets: [number, number] }).data_offsets;
      return { k, bytes: data.slice(b, e) };
    });
    parts.sort(() => rng() - 0.5);
    const out = new Uint8Array(data.length);
    let at = 0;
    for (const p of parts) {
      out.set(p.bytes, at);
      (header[p.k] as { data_offsets: number[] }).data_offsets = [at, at + p.bytes.length];
      at += p.bytes.length;
    }
    return join(JSON.stringify(header, null, rng() < 0.5 ? 1 : undefined), out, int(rng, 3));
  },
  'header-garbage': (rng, f) => join(randomBytes(rng, int(rng, 40)), split(f).data),
  'bad-utf8': (rng, f) => {
    const g = f.slice();
    const at = 8 + 1 + int(rng, Math.max(1, headerEnd(f) - 10));
    g.set(pick(rng, [[0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x82]]).slice(0, headerEnd(f) - at), at);
    return g;
  },
  whitespace: (rng, f) => {
    const { header, data } = split(f);
    const text = JSON.stringify(header);
    return join(pick(rng, [` ${text}`, `${text}\n`, `${text}\t`, `${text}\0`, `\ufeff${text}`, `${text}x`]), data);
  },
  'data-length': (rng, f) => {
    const end = headerEnd(f);
    if (rng() < 0.5 && f.length > end) return new Uint8Array([...f.subarray(0, end + int(rng, f.length - end)), ...f.subarray(end + int(rng, f.length - end) + 1)]);
    return new Uint8Array([...f.subarray(0, end), ...randomBytes(rng, 1 + int(rng, 8)), ...f.subarray(end)]);
  },
  'random-file': (rng) => randomBytes(rng, int(rng, 64)),
};

// Structured header edits find the most distinct validation paths, so they are drawn three times as often.
const MUTATION_NAMES = [...Object.keys(MUTATIONS), 'json', 'json'];

/** Result of one fuzz case. */
export interface FuzzCase {
  /** The mutations applied, joined by '+'. */
  readonly mutation: string;
  /** `'ok'` or the error code the reader threw. */
  readonly outcome: string;
  /** Wall time of parsing and reading, in milliseconds. */
  readonly ms: number;
}

/** A case that neither threw a coded error nor read back correctly (fuzzer-internal code). */
export class FuzzFailure extends StageError<'FUZZ_MISMATCH'> {}

function mismatch(what: string): FuzzFailure {
  return new FuzzFailure('FUZZ_MISMATCH', `fuzz mismatch: ${what}`);
}

/**
 * Parses `file` and checks every tensor against the reference decoder. Returns `'ok'`, the code
 * the parser threw, or `'ST_INT_RANGE'` when the file parsed but `readTensor` rightly refused a
 * 64-bit element beyond 2^53 (everything else in it having matched).
 */
export function checkFile(file: Uint8Array): string {
  let parsed;
  try {
    parsed = parseSafetensors(file);
  } catch (e) {
    if (e instanceof SafetensorsError && e.code.startsWith('ST_')) return e.code;
    throw e;
  }
  const { dataStart, dataLength } = parsed.header;
  let covered = 0;
  let refused = false;
  for (const name of parsed.names()) {
    const info = parsed.info(name);
    const [begin, end] = info.dataOffsets;
    covered += end - begin;
    const raw = parsed.readRaw(name);
    if (raw.length !== end - begin || raw.some((b, i) => b !== file[dataStart + begin + i])) throw mismatch(`raw bytes of '${name}'`);
    const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
    const refs = Array.from({ length: raw.length / safetensorsDTypeBytes(info.dtype) }, (_, i) => referenceElement(info.dtype, view, i));
    const f32 = parsed.readFloat32(name);
    refs.forEach((r, i) => {
      if (!sameNumber(f32[i]!, referenceF32(r))) throw mismatch(`readFloat32('${name}')[${String(i)}]`);
    });
    const expected = refs.map(referenceHost);
    let host;
    try {
      host = parsed.readTensor(name);
    } catch (e) {
      if (e instanceof SafetensorsError && e.code === 'ST_INT_RANGE' && expected.includes('range')) {
        refused = true;
        continue;
      }
      throw e;
    }
    if (expected.includes('range')) throw mismatch(`readTensor('${name}') accepted an element beyond 2^53`);
    expected.forEach((r, i) => {
      if (!sameNumber(host.data[i]!, host.data instanceof Float32Array ? Math.fround(r as number) : (r as number))) {
        throw mismatch(`readTensor('${name}')[${String(i)}]`);
      }
    });
  }
  if (covered !== dataLength) throw mismatch(`tensors cover ${String(covered)} of ${String(dataLength)} data bytes`);
  return refused ? 'ST_INT_RANGE' : 'ok';
}

/**
 * Opens `file` through the lazy reader (an in-memory source) and reads every tensor; returns
 * `'ok'` or the error code. Its outcome must equal {@link checkFile}'s.
 */
export async function checkFileLazy(file: Uint8Array): Promise<string> {
  try {
    const lazy = await SafetensorsFile.fromSource(memorySource(file));
    for (const name of lazy.names()) {
      await lazy.readRaw(name);
      await lazy.readFloat32(name);
      await lazy.readTensor(name);
    }
    await lazy.close();
    return 'ok';
  } catch (e) {
    if (e instanceof SafetensorsError) return e.code;
    throw e;
  }
}

/** The mutated file of case `index` of the stream seeded by `seed`, and the mutations applied. */
export function fuzzInput(seed: number, index: number): { file: Uint8Array; mutation: string } {
  const rng = seededRandom((Math.imul(seed, 0x9e3779b1) ^ Math.imul(index + 1, 0x85ebca6b)) >>> 0);
  let file = randomValidFile(rng);
  const applied: string[] = [];
  const rounds = rng() < 0.15 ? 2 : 1;
  for (let r = 0; r < rounds; r++) {
    const name = pick(rng, MUTATION_NAMES);
    // Later rounds may see an invalid file; structured mutations then fall back to a byte flip.
    try {
      file = MUTATIONS[name]!(rng, file);
      applied.push(name);
    } catch {
      file = anyByte(rng, file);
      applied.push('any-byte');
    }
  }
  return { file, mutation: applied.join('+') };
}

/** Runs case `index` of the stream seeded by `seed`; each case is reproducible on its own. */
export function runFuzzCase(seed: number, index: number): FuzzCase {
  const { file, mutation } = fuzzInput(seed, index);
  const start = performance.now();
  const outcome = checkFile(file);
  return { mutation, outcome, ms: performance.now() - start };
}

/** Totals of a fuzz run. */
export interface FuzzReport {
  /** Cases run. */
  readonly iterations: number;
  /** Count per outcome (`ok` or an error code). */
  readonly outcomes: Record<string, number>;
  /** Count per mutation name (a case applying two counts for both). */
  readonly mutations: Record<string, number>;
  /** Cases that failed, with the exception text (empty on success). */
  readonly failures: readonly { readonly index: number; readonly error: string }[];
  /** Slowest case, in milliseconds. */
  readonly maxCaseMs: number;
}

/**
 * Runs cases `[from, from + iterations)` of `seed`. A case slower than `caseLimitMs` counts as a
 * failure (a guard against pathological inputs; the script adds a watchdog for true hangs).
 */
export function runFuzz(opts: { seed: number; iterations: number; from?: number; caseLimitMs?: number; onCase?: (index: number) => void }): FuzzReport {
  const outcomes: Record<string, number> = {};
  const mutations: Record<string, number> = {};
  const failures: { index: number; error: string }[] = [];
  let maxCaseMs = 0;
  const from = opts.from ?? 0;
  for (let i = from; i < from + opts.iterations; i++) {
    opts.onCase?.(i);
    try {
      const c = runFuzzCase(opts.seed, i);
      outcomes[c.outcome] = (outcomes[c.outcome] ?? 0) + 1;
      for (const m of c.mutation.split('+')) mutations[m] = (mutations[m] ?? 0) + 1;
      maxCaseMs = Math.max(maxCaseMs, c.ms);
      if (c.ms > (opts.caseLimitMs ?? 1000)) failures.push({ index: i, error: `case took ${c.ms.toFixed(0)} ms (${c.mutation})` });
    } catch (e) {
      failures.push({ index: i, error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) });
    }
  }
  return { iterations: opts.iterations, outcomes, mutations, failures, maxCaseMs };
}
