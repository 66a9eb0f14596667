import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { SafetensorsError, type SafetensorsErrorCode } from '../src/errors.js';

/** The repository's `fixtures/` directory, located from this file (tests never read /work/shared). */
export const FIXTURES: string = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'fixtures');

/**
 * Assembles a safetensors file from a header (object, or raw JSON text for malformed cases) and a
 * data section; `length` overrides the 8-byte length field.
 */
export function buildFile(header: unknown, data: Uint8Array | number[] = [], opts: { length?: bigint; pad?: number } = {}): Uint8Array {
  const json = new TextEncoder().encode(typeof header === 'string' ? header : JSON.stringify(header));
  const pad = opts.pad ?? 0;
  const out = new Uint8Array(8 + json.length + pad + data.length);
  new DataView(out.buffer).setBigUint64(0, opts.length ?? BigInt(json.length + pad), true);
  out.set(json, 8);
  out.fill(0x20, 8 + json.length, 8 + json.length + pad);
  out.set(data, 8 + json.length + pad);
  return out;
}

/** Little-endian bytes of the given 16-bit words. */
export function u16le(...words: number[]): number[] {
  return words.flatMap((w) => [w & 0xff, (w >>> 8) & 0xff]);
}

/** The code of the SafetensorsError `f` throws (fails the test if it throws anything else or nothing). */
export function codeOf(f: () => unknown): SafetensorsErrorCode {
  try {
    f();
  } catch (e) {
    if (e instanceof SafetensorsError) return e.code;
    throw e;
  }
  throw new SafetensorsError('ST_BAD_TENSOR', 'expected a SafetensorsError, nothing was thrown');
}

/** Async variant of {@link codeOf}. */
export async function asyncCodeOf(f: () => Promise<unknown>): Promise<SafetensorsErrorCode> {
  try {
    await f();
  } catch (e) {
    if (e instanceof SafetensorsError) return e.code;
    throw e;
  }
  throw new SafetensorsError('ST_BAD_TENSOR', 'expected a SafetensorsError, nothing was thrown');
}

/** A fresh temporary directory and a function that removes it. */
export async function tempDir(): Promise<{ dir: string; cleanup: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), 'stageml-safetensors-'));
  return { dir, cleanup: () => rm(dir, { recursive: true, force: true }) };
}

/**
 * Whether two typed arrays hold the same bytes (and are the same type). Vitest's `toEqual` walks
 * large typed arrays element by element and takes seconds on fixture-sized tensors.
 */
export function sameBytes(a: ArrayBufferView, b: ArrayBufferView): boolean {
  return (
    a.constructor === b.constructor &&
    Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength))
  );
}
