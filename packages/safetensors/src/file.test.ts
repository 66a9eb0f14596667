import { open, truncate, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { asyncCodeOf, buildFile, codeOf, tempDir, u16le } from '../test/helpers.js';
import { SafetensorsFile, parseSafetensors } from './file.js';
import { type ByteSource, READ_CHUNK, memorySource, openFileSource } from './source.js';
import { writeSafetensors } from './write.js';

let dir: string;
let cleanup: () => Promise<void>;
beforeAll(async () => ({ dir, cleanup } = await tempDir()));
afterAll(() => cleanup());

/** One tensor of every dtype, deliberately starting at odd offsets (a U8 first shifts the rest). */
function everyDtypeFile(): Uint8Array {
  const parts: [string, string, number[], number[]][] = [
    ['a_u8', 'U8', [3], [1, 2, 255]],
    ['b_f64', 'F64', [1], Array.from(new Uint8Array(new Float64Array([-0.1]).buffer))],
    ['c_f32', 'F32', [2], Array.from(new Uint8Array(new Float32Array([1.5, -2]).buffer))],
    ['d_f16', 'F16', [2], u16le(0x3c00, 0xc000)],
    ['e_bf16', 'BF16', [1], u16le(0x4049)],
    ['f_i64', 'I64', [2], Array.from(new Uint8Array(new BigInt64Array([-5n, 2n ** 40n]).buffer))],
    ['g_i32', 'I32', [1], Array.from(new Uint8Array(new Int32Array([-7]).buffer))],
    ['h_i16', 'I16', [1], u16le(0xfffe)],
    ['i_i8', 'I8', [2], [0x80, 0x7f]],
    ['j_bool', 'BOOL', [2], [0, 1]],
    ['k_e4m3', 'F8_E4M3', [2], [0x7e, 0x38]],
    ['l_e5m2', 'F8_E5M2', [2], [0x7c, 0x3c]],
    ['m_u16', 'U16', [1], u16le(0xffff)],
    ['n_u32', 'U32', [1], [0, 0, 0, 0x80]],
    ['o_u64', 'U64', [1], [1, 0, 0, 0, 0, 0, 0x10, 0]],
    ['p_empty', 'F32', [2, 0], []],
  ];
  const header: Record<string, unknown> = {};
  const data: number[] = [];
  for (const [name, dtype, shape, bytes] of parts) {
    header[name] = { dtype, shape, data_offsets: [data.length, data.length + bytes.length] };
    data.push(...bytes);
  }
  return buildFile(header, data, { pad: 3 });
}

const EXPECTED: Record<string, [string, number[]]> = {
  a_u8: ['u8', [1, 2, 255]],
  b_f64: ['f64', [-0.1]],
  c_f32: ['f32', [1.5, -2]],
  d_f16: ['f16', [1, -2]],
  e_bf16: ['bf16', [3.140625]],
  f_i64: ['i64', [-5, 2 ** 40]],
  g_i32: ['i32', [-7]],
  h_i16: ['i32', [-2]],
  i_i8: ['i8', [-128, 127]],
  j_bool: ['bool', [0, 1]],
  k_e4m3: ['f32', [448, 1]],
  l_e5m2: ['f32', [Infinity, 1]],
  m_u16: ['i32', [65535]],
  n_u32: ['i64', [2 ** 31]],
  o_u64: ['i64', [2 ** 52 + 1]],
  p_empty: ['f32', []],
};

describe('parseSafetensors', () => {
  it('decodes every dtype at unaligned offsets', () => {
    const f = parseSafetensors(everyDtypeFile());
    for (const [name, [dtype, values]] of Object.entries(EXPECTED)) {
      const t = f.readTensor(name);
      expect([name, t.dtype, Array.from(t.data)]).toEqual([name, dtype, values]);
      expect(Array.from(f.readFloat32(name))).toEqual(values.map(Math.fround));
    }
    expect(f.readTensor('p_empty').shape).toEqual([2, 0]);
  });

  it('returns copies from readRaw', () => {
    const bytes = everyDtypeFile();
    const raw = parseSafetensors(bytes).readRaw('a_u8');
    raw[0] = 99;
    expect(parseSafetensors(bytes).readRaw('a_u8')[0]).toBe(1);
  });

  it('throws ST_MISSING_TENSOR for an unknown name', () => {
    expect(codeOf(() => parseSafetensors(everyDtypeFile()).readTensor('nope'))).toBe('ST_MISSING_TENSOR');
  });
});

describe('SafetensorsFile', () => {
  it('reads a tensor larger than one positioned read in pieces (READ_CHUNK), byte for byte (issue 39)', async () => {
    const path = join(dir, 'big.safetensors');
    const bytes = READ_CHUNK + READ_CHUNK / 2 + 8;
    const header = Buffer.from(JSON.stringify({ big: { dtype: 'U8', shape: [bytes], data_offsets: [0, bytes] } }));
    const prefix = Buffer.alloc(8);
    prefix.writeBigUInt64LE(BigInt(header.length));
    // Sparse: zeros in between, a marker at both ends of the data.
    await writeFile(path, Buffer.concat([prefix, header, Buffer.from([7, 7, 7])]));
    await truncate(path, 8 + header.length + bytes);
    const h = await open(path, 'r+');
    await h.write(Buffer.from([9, 9, 9]), 0, 3, 8 + header.length + bytes - 3);
    await h.close();
    const f = await SafetensorsFile.open(path);
    const raw = await f.readRaw('big');
    await f.close();
    expect(raw.length).toBe(bytes);
    expect([...raw.subarray(0, 4), ...raw.subarray(READ_CHUNK - 1, READ_CHUNK + 1), ...raw.subarray(bytes - 4)]).toEqual([7, 7, 7, 0, 0, 0, 0, 9, 9, 9]);
  });

  it('reads every dtype from disk', async () => {
    const path = join(dir, 'every.safetensors');
    await writeFile(path, everyDtypeFile());
    const f = await SafetensorsFile.open(path);
    for (const [name, [dtype, values]] of Object.entries(EXPECTED)) {
      const t = await f.readTensor(name);
      expect([name, t.dtype, Array.from(t.data)]).toEqual([name, dtype, values]);
    }
    await f.close();
  });

  it('reads only the header and the requested byte range', async () => {
    const path = join(dir, 'lazy.safetensors');
    const big = new Float32Array(1 << 20).fill(1);
    await writeSafetensors(path, { big: { dtype: 'f32', shape: [1024, 1024], data: big }, small: { dtype: 'f32', shape: [4], data: new Float32Array([1, 2, 3, 4]) } });
    const reads: [number, number][] = [];
    const inner = await openFileSource(path);
    const counting: ByteSource = {
      label: inner.label,
      byteLength: inner.byteLength,
      read: (offset, length) => {
        reads.push([offset, length]);
        return inner.read(offset, length);
      },
      close: () => inner.close(),
    };
    const f = await SafetensorsFile.fromSource(counting);
    expect(Array.from(await f.readFloat32('small'))).toEqual([1, 2, 3, 4]);
    const { dataStart, headerLength } = f.header;
    expect(reads).toEqual([
      [0, 8],
      [8, headerLength],
      [dataStart + f.info('small').dataOffsets[0], 16],
    ]);
    expect(reads.reduce((s, [, n]) => s + n, 0)).toBeLessThan(1024);
    expect(inner.byteLength).toBeGreaterThan(4 << 20);
    await f.close();
  });

  it('reads tensors that lie together with one read (readTensors), decoded as readTensor decodes them', async () => {
    const reads: [number, number][] = [];
    const inner = memorySource(everyDtypeFile());
    const counting: ByteSource = { label: inner.label, byteLength: inner.byteLength, read: (offset, length) => (reads.push([offset, length]), inner.read(offset, length)), close: () => inner.close() };
    const f = await SafetensorsFile.fromSource(counting);
    const names = Object.keys(EXPECTED);
    reads.length = 0;
    const got = await f.readTensors(names);
    expect(reads.length).toBe(1);
    for (const [i, name] of names.entries()) expect([name, got[i]!.dtype, got[i]!.shape, Array.from(got[i]!.data)]).toEqual([name, EXPECTED[name]![0], f.info(name).shape, EXPECTED[name]![1]]);
    // Tensors spread over a span more than twice their own bytes are read one by one.
    reads.length = 0;
    await f.readTensors(['a_u8', 'o_u64']);
    expect(reads.length).toBe(2);
    expect(await asyncCodeOf(() => f.readTensors(['a_u8', 'nope']))).toBe('ST_MISSING_TENSOR');
    await f.close();
    expect(await asyncCodeOf(() => f.readTensors(['a_u8']))).toBe('ST_CLOSED');
  });

  it('throws ST_CLOSED after close, and close is idempotent', async () => {
    const f = await SafetensorsFile.fromSource(memorySource(everyDtypeFile()));
    await f.close();
    await f.close();
    expect(f.closed).toBe(true);
    expect(await asyncCodeOf(() => f.readRaw('a_u8'))).toBe('ST_CLOSED');
  });

  it('throws ST_IO for a missing file or a directory, with the system error as cause', async () => {
    const missing = join(dir, 'missing.safetensors');
    await expect(SafetensorsFile.open(missing)).rejects.toMatchObject({ code: 'ST_IO', file: missing, cause: { code: 'ENOENT' } });
    expect(await asyncCodeOf(() => SafetensorsFile.open(dir))).toBe('ST_IO');
  });

  it('throws ST_TRUNCATED when the file shrinks after opening', async () => {
    const path = join(dir, 'shrink.safetensors');
    await writeFile(path, everyDtypeFile());
    const f = await SafetensorsFile.open(path);
    await truncate(path, f.header.dataStart + 2);
    expect(await asyncCodeOf(() => f.readRaw('c_f32'))).toBe('ST_TRUNCATED');
    await f.close();
  });

  it('reports header errors with the path and closes the handle', async () => {
    const path = join(dir, 'bad.safetensors');
    await writeFile(path, buildFile('{"w":1}'));
    await expect(SafetensorsFile.open(path)).rejects.toMatchObject({ code: 'ST_BAD_HEADER', file: path, tensor: 'w' });
    await writeFile(path, new Uint8Array(5));
    expect(await asyncCodeOf(() => SafetensorsFile.open(path))).toBe('ST_TRUNCATED');
  });
});
