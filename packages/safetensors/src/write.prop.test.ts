import { fc, test } from '@fast-check/vitest';
import type { DType, HostTensor } from '@stageml/ir';
import { f16FromBits } from '@stageml/ir';
import { describe, expect } from 'vitest';

import { SAFETENSORS_DTYPES, safetensorsDTypeBytes } from './dtype.js';
import type { RawTensor } from './encode.js';
import { parseSafetensors } from './file.js';
import { serializeSafetensors } from './write.js';

const arbShape = fc.array(fc.integer({ min: 0, max: 4 }), { maxLength: 3 });
const count = (shape: readonly number[]): number => shape.reduce((a, b) => a * b, 1);

const arbRaw: fc.Arbitrary<RawTensor> = fc
  .tuple(fc.constantFrom(...SAFETENSORS_DTYPES), arbShape)
  .chain(([dtype, shape]) =>
    fc.uint8Array({ minLength: count(shape) * safetensorsDTypeBytes(dtype), maxLength: count(shape) * safetensorsDTypeBytes(dtype) }).map((data) => ({ dtype, shape, data })),
  );

const arbName = fc.string({ unit: 'grapheme', maxLength: 8 }).filter((s) => s !== '__metadata__');
const arbMetadata = fc.option(fc.dictionary(fc.string({ maxLength: 6 }), fc.string({ unit: 'grapheme', maxLength: 6 }), { maxKeys: 3 }), { nil: undefined });

/** Values each IR dtype can hold exactly, in its host storage. */
const VALUES: Record<DType, fc.Arbitrary<number>> = {
  f64: fc.double(),
  f32: fc.float(),
  f16: fc.integer({ min: 0, max: 0xffff }).map(f16FromBits),
  bf16: fc.integer({ min: 0, max: 0xffff }).map((h) => new Float32Array(new Uint32Array([h << 16]).buffer)[0]!),
  i64: fc.integer({ min: -(2 ** 53), max: 2 ** 53 }),
  i32: fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 }),
  i8: fc.integer({ min: -128, max: 127 }),
  u8: fc.integer({ min: 0, max: 255 }),
  bool: fc.constantFrom(0, 1),
};
const STORAGE = { f64: Float64Array, f32: Float32Array, f16: Float32Array, bf16: Float32Array, i64: Float64Array, i32: Int32Array, i8: Int8Array, u8: Uint8Array, bool: Uint8Array };

const arbHost: fc.Arbitrary<HostTensor> = fc
  .tuple(fc.constantFrom(...(Object.keys(VALUES) as DType[])), arbShape)
  .chain(([dtype, shape]) =>
    fc.array(VALUES[dtype], { minLength: count(shape), maxLength: count(shape) }).map((values) => ({ dtype, shape, data: STORAGE[dtype].from(values) })),
  );

describe('write → read round trip', () => {
  test.prop([fc.dictionary(arbName, arbRaw, { maxKeys: 5 }), arbMetadata])('is bit-exact for raw tensors of every dtype', (tensors, metadata) => {
    const bytes = serializeSafetensors(tensors, metadata);
    const f = parseSafetensors(bytes);
    expect(f.metadata).toEqual(metadata);
    expect(f.names().sort()).toEqual(Object.keys(tensors).sort());
    for (const [name, t] of Object.entries(tensors)) {
      expect(f.info(name)).toMatchObject({ dtype: t.dtype, shape: t.shape });
      expect(f.readRaw(name)).toEqual(t.data);
    }
    // Re-serializing what was read reproduces the file byte for byte.
    const again = Object.fromEntries(f.names().map((n) => [n, { ...f.info(n), data: f.readRaw(n) }]));
    expect(serializeSafetensors(again, f.metadata)).toEqual(bytes);
  });

  test.prop([fc.dictionary(arbName, arbHost, { maxKeys: 5 })])('is exact for host tensors of every IR dtype', (tensors) => {
    const f = parseSafetensors(serializeSafetensors(tensors));
    for (const [name, t] of Object.entries(tensors)) {
      const back = f.readTensor(name);
      expect(back.dtype).toBe(t.dtype);
      expect(back.shape).toEqual(t.shape);
      expect(back.data.constructor).toBe(t.data.constructor);
      for (let i = 0; i < t.data.length; i++) if (!Object.is(back.data[i], t.data[i])) expect.fail(`${name}[${String(i)}]: ${String(back.data[i])} ≠ ${String(t.data[i])}`);
    }
  });
});
