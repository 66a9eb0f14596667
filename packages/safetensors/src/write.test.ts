import { readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import type { HostTensor } from '@stageml/ir';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { asyncCodeOf, codeOf, tempDir } from '../test/helpers.js';
import type { TensorInputs } from './encode.js';
import { parseSafetensors } from './file.js';
import { serializeSafetensors, writeSafetensors } from './write.js';

let dir: string;
let cleanup: () => Promise<void>;
beforeAll(async () => ({ dir, cleanup } = await tempDir()));
afterAll(() => cleanup());

const headerText = (bytes: Uint8Array): string => {
  const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  return new TextDecoder().decode(bytes.subarray(8, 8 + n));
};

describe('serializeSafetensors', () => {
  it('lays tensors out widest dtype first, then by name, with metadata first and space padding', () => {
    const bytes = serializeSafetensors(
      {
        z: { dtype: 'U8', shape: [3], data: new Uint8Array([1, 2, 3]) },
        b: { dtype: 'F32', shape: [1], data: new Uint8Array(4) },
        a: { dtype: 'F32', shape: [1], data: new Uint8Array(4) },
        w: { dtype: 'F64', shape: [], data: new Uint8Array(8) },
      },
      { format: 'pt' },
    );
    const text = headerText(bytes);
    expect(text.trimEnd()).toBe(
      '{"__metadata__":{"format":"pt"},"w":{"dtype":"F64","shape":[],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]},"z":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}}',
    );
    expect(text.length % 8).toBe(0);
    expect(/^[^ ]* *$/.test(text)).toBe(true);
    expect(bytes.length).toBe(8 + text.length + 19);
    expect(Array.from(parseSafetensors(bytes).readRaw('z'))).toEqual([1, 2, 3]);
  });

  it('omits __metadata__ when none is given and writes an empty map when one is', () => {
    expect(headerText(serializeSafetensors({})).trimEnd()).toBe('{}');
    expect(headerText(serializeSafetensors({}, {})).trimEnd()).toBe('{"__metadata__":{}}');
  });

  it('encodes host tensors of every IR dtype so they read back equal', () => {
    const tensors: Record<string, HostTensor> = {
      f64: { dtype: 'f64', shape: [2], data: new Float64Array([Math.PI, -0]) },
      f32: { dtype: 'f32', shape: [2], data: new Float32Array([1.25, Number.NaN]) },
      f16: { dtype: 'f16', shape: [3], data: new Float32Array([65504, 2 ** -24, -0.333251953125]) },
      bf16: { dtype: 'bf16', shape: [2], data: new Float32Array([3.140625, -Infinity]) },
      i64: { dtype: 'i64', shape: [4], data: new Float64Array([-1, 2 ** 53, -(2 ** 53), 2 ** 32 + 7]) },
      i32: { dtype: 'i32', shape: [2], data: new Int32Array([-(2 ** 31), 2 ** 31 - 1]) },
      i8: { dtype: 'i8', shape: [2], data: new Int8Array([-128, 127]) },
      u8: { dtype: 'u8', shape: [1, 2], data: new Uint8Array([0, 255]) },
      bool: { dtype: 'bool', shape: [3], data: new Uint8Array([0, 1, 5]) },
    };
    const f = parseSafetensors(serializeSafetensors(tensors));
    for (const [name, t] of Object.entries(tensors)) {
      const back = f.readTensor(name);
      expect(back.dtype).toBe(t.dtype);
      expect(back.shape).toEqual(t.shape);
      expect(Array.from(back.data)).toEqual(name === 'bool' ? [0, 1, 1] : Array.from(t.data));
    }
    expect(Array.from(f.readRaw('i64').subarray(0, 8))).toEqual([255, 255, 255, 255, 255, 255, 255, 255]);
  });

  it('accepts a Map, which can hold any name', () => {
    const f = parseSafetensors(serializeSafetensors(new Map([['__proto__', { dtype: 'U8' as const, shape: [1], data: new Uint8Array([9]) }]])));
    expect(f.names()).toEqual(['__proto__']);
  });

  it.each<[string, string, unknown]>([
    ['the reserved metadata name', 'ST_BAD_TENSOR', { __metadata__: { dtype: 'U8', shape: [0], data: new Uint8Array(0) } }],
    ['a non-object tensor', 'ST_BAD_TENSOR', { a: 3 }],
    ['raw data that is not a Uint8Array', 'ST_BAD_TENSOR', { a: { dtype: 'U8', shape: [1], data: [1] } }],
    ['host data that is not a typed array', 'ST_BAD_TENSOR', { a: { dtype: 'f32', shape: [1], data: [1] } }],
    ['an unknown dtype', 'ST_BAD_DTYPE', { a: { dtype: 'float32', shape: [1], data: new Uint8Array(4) } }],
    ['a negative dim', 'ST_BAD_SHAPE', { a: { dtype: 'U8', shape: [-1], data: new Uint8Array(0) } }],
    ['a raw byte count off by one', 'ST_SIZE_MISMATCH', { a: { dtype: 'F32', shape: [1], data: new Uint8Array(5) } }],
    ['a host element count off by one', 'ST_SIZE_MISMATCH', { a: { dtype: 'f32', shape: [2], data: new Float32Array(1) } }],
    ['an i64 beyond 2^53', 'ST_INT_RANGE', { a: { dtype: 'i64', shape: [1], data: new Float64Array([2 ** 53 + 2]) } }],
    ['a fractional i64', 'ST_INT_RANGE', { a: { dtype: 'i64', shape: [1], data: new Float64Array([0.5]) } }],
    ['an i8 out of range in a wider array', 'ST_INT_RANGE', { a: { dtype: 'i8', shape: [1], data: new Int32Array([200]) } }],
    ['null instead of tensors', 'ST_BAD_TENSOR', null],
  ])('rejects %s with %s', (_, code, tensors) => {
    expect(codeOf(() => serializeSafetensors(tensors as TensorInputs))).toBe(code);
  });

  it('rejects non-string metadata with ST_BAD_METADATA', () => {
    expect(codeOf(() => serializeSafetensors({}, { a: 1 } as unknown as Record<string, string>))).toBe('ST_BAD_METADATA');
  });
});

describe('writeSafetensors', () => {
  it('writes the same bytes serializeSafetensors returns', async () => {
    const tensors = { x: { dtype: 'f16' as const, shape: [2], data: new Float32Array([1, 2]) } };
    const path = join(dir, 'same.safetensors');
    await writeSafetensors(path, tensors, { k: 'v' });
    expect(new Uint8Array(await readFile(path))).toEqual(serializeSafetensors(tensors, { k: 'v' }));
  });

  it('leaves the previous file and no temporary file when encoding fails midway', async () => {
    const path = join(dir, 'atomic.safetensors');
    await writeFile(path, 'previous');
    const tensors = {
      a: { dtype: 'f32' as const, shape: [1024], data: new Float32Array(1024) },
      z: { dtype: 'i64' as const, shape: [1], data: new Float64Array([2 ** 60]) },
    };
    expect(await asyncCodeOf(() => writeSafetensors(path, tensors))).toBe('ST_INT_RANGE');
    expect(await readFile(path, 'utf8')).toBe('previous');
    expect((await readdir(dir)).filter((n) => n.includes('atomic'))).toEqual(['atomic.safetensors']);
  });

  it('throws ST_IO when the directory does not exist', async () => {
    expect(await asyncCodeOf(() => writeSafetensors(join(dir, 'no', 'such', 'x.safetensors'), {}))).toBe('ST_IO');
  });
});
