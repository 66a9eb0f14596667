import { describe, expect, it } from 'vitest';

import { buildFile, codeOf } from '../test/helpers.js';
import { SafetensorsError } from './errors.js';
import { parseSafetensors } from './file.js';
import { MAX_HEADER_BYTES } from './header.js';
import { findDuplicateKey } from './json-keys.js';

const f32 = (shape: number[], offsets: [number, number]) => ({ dtype: 'F32', shape, data_offsets: offsets });
const zeros = (n: number): Uint8Array => new Uint8Array(n);
const parse = (bytes: Uint8Array) => () => parseSafetensors(bytes);

describe('parseSafetensors: accepted headers', () => {
  it('accepts an empty header with an empty data section', () => {
    const f = parseSafetensors(buildFile({}));
    expect(f.names()).toEqual([]);
    expect(f.metadata).toBeUndefined();
  });

  it('accepts trailing-space padding, zero-size tensors and out-of-name-order offsets', () => {
    const header = { b: f32([2], [0, 8]), a: f32([1], [8, 12]), e: f32([0, 3], [12, 12]), __metadata__: { k: 'v' } };
    const f = parseSafetensors(buildFile(header, zeros(12), { pad: 5 }));
    expect(f.names()).toEqual(['b', 'a', 'e']);
    expect(f.info('a')).toEqual({ dtype: 'F32', shape: [1], byteLength: 4, dataOffsets: [8, 12] });
    expect(f.info('e').byteLength).toBe(0);
    expect(f.metadata).toEqual({ k: 'v' });
  });

  it('keeps a "__proto__" metadata key as plain data', () => {
    const f = parseSafetensors(buildFile('{"__metadata__":{"__proto__":"x"}}'));
    expect(Object.getOwnPropertyDescriptor(f.metadata, '__proto__')?.value).toBe('x');
    expect(Object.getPrototypeOf(f.metadata)).toBe(Object.prototype);
  });

  it('ignores unknown fields inside an entry, as upstream does', () => {
    expect(parseSafetensors(buildFile({ a: { ...f32([1], [0, 4]), extra: 1 } }, zeros(4))).names()).toEqual(['a']);
  });
});

describe('parseSafetensors: header length', () => {
  it('rejects a length over 100 MB with ST_HEADER_TOO_LARGE', () => {
    expect(codeOf(parse(buildFile({}, [], { length: BigInt(MAX_HEADER_BYTES + 1) })))).toBe('ST_HEADER_TOO_LARGE');
    expect(codeOf(parse(buildFile({}, [], { length: 2n ** 64n - 1n })))).toBe('ST_HEADER_TOO_LARGE');
  });

  it('rejects a length past the end of the file with ST_TRUNCATED', () => {
    expect(codeOf(parse(buildFile({}, [], { length: 3n })))).toBe('ST_TRUNCATED');
  });

  it('rejects files shorter than 8 bytes with ST_TRUNCATED', () => {
    expect(codeOf(parse(new Uint8Array(0)))).toBe('ST_TRUNCATED');
    expect(codeOf(parse(new Uint8Array(7)))).toBe('ST_TRUNCATED');
  });
});

describe('parseSafetensors: JSON', () => {
  it.each([
    ['an empty header', ''],
    ['a header not starting with {', ' {}'],
    ['a byte-order mark', '\ufeff{}'],
    ['malformed JSON', '{"a":'],
    ['trailing garbage', '{}x'],
    ['a NUL after the object', '{}\0'],
  ])('rejects %s with ST_BAD_JSON', (_, text) => {
    expect(codeOf(parse(buildFile(text)))).toBe('ST_BAD_JSON');
  });

  it('rejects invalid UTF-8 with ST_BAD_JSON', () => {
    const file = buildFile('{"a":1}');
    file[10] = 0xff;
    expect(codeOf(parse(file))).toBe('ST_BAD_JSON');
  });

  it('rejects a duplicate tensor name with ST_DUPLICATE_KEY', () => {
    const e = f32([1], [0, 4]);
    const text = `{"w":${JSON.stringify(e)},"w":${JSON.stringify(e)}}`;
    expect(codeOf(parse(buildFile(text, zeros(4))))).toBe('ST_DUPLICATE_KEY');
  });

  it('rejects a duplicate field inside an entry, even when spelled with escapes', () => {
    const text = '{"w":{"dtype":"F32","d\\u0074ype":"F16","shape":[1],"data_offsets":[0,4]}}';
    expect(codeOf(parse(buildFile(text, zeros(4))))).toBe('ST_DUPLICATE_KEY');
  });
});

describe('parseSafetensors: entries', () => {
  it.each([
    ['an entry that is not an object', { w: [1, 2] }],
    ['a missing dtype', { w: { shape: [1], data_offsets: [0, 4] } }],
    ['a missing shape', { w: { dtype: 'F32', data_offsets: [0, 4] } }],
    ['missing data_offsets', { w: { dtype: 'F32', shape: [1] } }],
  ])('rejects %s with ST_BAD_HEADER', (_, header) => {
    expect(codeOf(parse(buildFile(header, zeros(4))))).toBe('ST_BAD_HEADER');
  });

  it.each(['f32', 'F128', 'C64', 'F8_E8M0', 7, null])('rejects dtype %j with ST_BAD_DTYPE', (dtype) => {
    expect(codeOf(parse(buildFile({ w: { dtype, shape: [1], data_offsets: [0, 4] } }, zeros(4))))).toBe('ST_BAD_DTYPE');
  });

  it.each([[[-1]], [[1.5]], [['1']], ['1'], [[null]], [[2 ** 53, 2 ** 53]]])('rejects shape %j with ST_BAD_SHAPE', (shape) => {
    expect(codeOf(parse(buildFile({ w: { dtype: 'F32', shape, data_offsets: [0, 4] } }, zeros(4))))).toBe('ST_BAD_SHAPE');
  });

  it.each([[[4, 0]], [[0]], [[0, 4, 8]], [[-4, 0]], [[0, 4.5]], ['0,4'], [[0, '4']]])('rejects data_offsets %j with ST_OFFSETS', (offsets) => {
    expect(codeOf(parse(buildFile({ w: { dtype: 'F32', shape: [1], data_offsets: offsets } }, zeros(4))))).toBe('ST_OFFSETS');
  });

  it('rejects a span that disagrees with shape × dtype size with ST_SIZE_MISMATCH, naming the numbers', () => {
    const bytes = buildFile({ w: { dtype: 'F16', shape: [3], data_offsets: [0, 8] } }, zeros(8));
    expect(() => parseSafetensors(bytes)).toThrow(/tensor 'w': F16\[3\] needs 3 × 2 = 6 bytes, data_offsets \[0, 8\] span 8/);
    expect(codeOf(parse(bytes))).toBe('ST_SIZE_MISMATCH');
  });

  it('rejects an end past the data section with ST_TRUNCATED', () => {
    expect(codeOf(parse(buildFile({ w: f32([2], [0, 8]) }, zeros(4))))).toBe('ST_TRUNCATED');
  });
});

describe('parseSafetensors: layout', () => {
  it('rejects overlapping tensors with ST_OVERLAP', () => {
    expect(codeOf(parse(buildFile({ a: f32([2], [0, 8]), b: f32([1], [4, 8]) }, zeros(8))))).toBe('ST_OVERLAP');
    expect(codeOf(parse(buildFile({ a: f32([1], [0, 4]), b: f32([1], [0, 4]) }, zeros(4))))).toBe('ST_OVERLAP');
    expect(codeOf(parse(buildFile({ a: f32([2], [0, 8]), z: f32([0], [4, 4]) }, zeros(8))))).toBe('ST_OVERLAP');
  });

  it('rejects a gap between tensors with ST_GAP', () => {
    expect(codeOf(parse(buildFile({ a: f32([1], [0, 4]), b: f32([1], [8, 12]) }, zeros(12))))).toBe('ST_GAP');
    expect(codeOf(parse(buildFile({ b: f32([1], [4, 8]) }, zeros(8))))).toBe('ST_GAP');
  });

  it('rejects trailing bytes after the last tensor with ST_GAP', () => {
    expect(codeOf(parse(buildFile({ a: f32([1], [0, 4]) }, zeros(5))))).toBe('ST_GAP');
    expect(codeOf(parse(buildFile({}, zeros(1))))).toBe('ST_GAP');
  });

  it('names both tensors in an overlap', () => {
    expect(() => parseSafetensors(buildFile({ a: f32([2], [0, 8]), b: f32([1], [4, 8]) }, zeros(8)))).toThrow(
      /tensor 'b' \[4, 8\] overlaps tensor 'a' \[0, 8\]/,
    );
  });
});

describe('parseSafetensors: metadata', () => {
  it.each([[['x']], ['x'], [null], [{ a: 1 }], [{ a: null }], [{ a: { b: 'c' } }]])('rejects __metadata__ %j with ST_BAD_METADATA', (metadata) => {
    expect(codeOf(parse(buildFile({ __metadata__: metadata })))).toBe('ST_BAD_METADATA');
  });
});

describe('SafetensorsError', () => {
  it('carries the code, file label and tensor name', () => {
    try {
      parseSafetensors(buildFile({ w: { dtype: 'X', shape: [1], data_offsets: [0, 4] } }, zeros(4)), 'mem.safetensors');
      expect.fail('should throw');
    } catch (e) {
      expect(e).toBeInstanceOf(SafetensorsError);
      expect(e).toMatchObject({ name: 'SafetensorsError', code: 'ST_BAD_DTYPE', file: 'mem.safetensors', tensor: 'w' });
      expect((e as Error).message).toMatch(/^mem\.safetensors: tensor 'w': dtype "X"/);
    }
  });

  it('is thrown for a non-Uint8Array argument instead of a TypeError', () => {
    expect(codeOf(() => parseSafetensors('abc' as unknown as Uint8Array))).toBe('ST_BAD_TENSOR');
  });
});

describe('findDuplicateKey', () => {
  it('finds repeats per object, not across objects or in arrays', () => {
    expect(findDuplicateKey('{"a":{"x":1},"b":{"x":1},"c":["a","a"]}')).toBeUndefined();
    expect(findDuplicateKey('{"a":{"x":1,"y":{"x":2},"x":3}}')).toEqual({ key: 'x', path: ['a'] });
    expect(findDuplicateKey('{"q\\"":1,"q\\"":2}')).toEqual({ key: 'q"', path: [] });
    expect(findDuplicateKey('{"a":"\\\\","a":1}')).toEqual({ key: 'a', path: [] });
  });
});
