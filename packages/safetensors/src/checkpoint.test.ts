import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { FIXTURES, asyncCodeOf, sameBytes, tempDir } from '../test/helpers.js';
import { loadWeightStore, openCheckpoint } from './checkpoint.js';
import { parseSafetensors } from './file.js';
import { writeSafetensors } from './write.js';

const LLAMA = join(FIXTURES, 'peft-tiny', 'llama', 'base');
const ADAPTER = join(FIXTURES, 'peft-tiny', 'llama', 'adapters', 'qv-r8');

let dir: string;
let cleanup: () => Promise<void>;
let names: string[];
beforeAll(async () => {
  ({ dir, cleanup } = await tempDir());
  // Split the llama fixture into two shards plus an index, the way transformers saves large models.
  const src = parseSafetensors(new Uint8Array(await readFile(join(LLAMA, 'model.safetensors'))));
  names = src.names();
  const weightMap: Record<string, string> = {};
  const shards: Record<string, Record<string, { dtype: 'F32'; shape: readonly number[]; data: Uint8Array }>> = {};
  names.forEach((n, i) => {
    const shard = `model-0000${String(1 + (i % 2))}-of-00002.safetensors`;
    weightMap[n] = shard;
    (shards[shard] ??= {})[n] = { dtype: 'F32', shape: src.info(n).shape, data: src.readRaw(n) };
  });
  const sharded = join(dir, 'sharded');
  await mkdir(sharded);
  for (const [file, tensors] of Object.entries(shards)) await writeSafetensors(join(sharded, file), tensors, { format: 'pt' });
  await writeFile(join(sharded, 'model.safetensors.index.json'), JSON.stringify({ metadata: { total_size: 1234 }, weight_map: weightMap }));
});
afterAll(() => cleanup());

/** Writes `index` as the checkpoint index of a fresh directory that shares the sharded files. */
async function withIndex(name: string, index: string): Promise<string> {
  const d = join(dir, 'sharded', name);
  await mkdir(d, { recursive: true });
  await writeFile(join(d, 'model.safetensors.index.json'), index);
  return d;
}

describe('openCheckpoint', () => {
  it('opens a single model.safetensors directory', async () => {
    const ckpt = await openCheckpoint(LLAMA);
    expect(ckpt.layout).toBe('single');
    expect(ckpt.metadata).toEqual({ format: 'pt' });
    expect(ckpt.names()).toEqual(names);
    const t = await ckpt.readTensor(names[0]!);
    expect(t.shape).toEqual(ckpt.info(names[0]!).shape);
    await ckpt.close();
  });

  it('opens an adapter directory by file name, and a weights file by path', async () => {
    const adapter = await openCheckpoint(ADAPTER, { fileName: 'adapter_model.safetensors' });
    expect(adapter.names().length).toBeGreaterThan(0);
    await adapter.close();
    const direct = await openCheckpoint(join(ADAPTER, 'adapter_model.safetensors'));
    expect(direct.names()).toEqual(adapter.names());
    await direct.close();
  });

  it('opens a sharded checkpoint and reads each tensor from its shard', async () => {
    const single = await openCheckpoint(LLAMA);
    const ckpt = await openCheckpoint(join(dir, 'sharded'));
    expect(ckpt.layout).toBe('sharded');
    expect(ckpt.metadata).toEqual({ total_size: 1234 });
    expect(ckpt.names()).toEqual(names);
    expect(ckpt.fileOf(names[1]!)).toMatch(/model-00002-of-00002\.safetensors$/);
    for (const n of names) {
      expect(sameBytes(await ckpt.readRaw(n), await single.readRaw(n))).toBe(true);
      expect(sameBytes(await ckpt.readFloat32(n), await single.readFloat32(n))).toBe(true);
    }
    expect(await asyncCodeOf(() => ckpt.readTensor('nope'))).toBe('ST_MISSING_TENSOR');
    await ckpt.close();
    expect(await asyncCodeOf(() => ckpt.readRaw(names[0]!))).toBe('ST_CLOSED');
    await single.close();
  });

  it('names the float dtype holding most elements (storedFloatDType), ignoring integer tensors', async () => {
    const d = join(dir, 'mixed');
    await mkdir(d);
    const raw = (n: number) => new Uint8Array(n);
    await writeSafetensors(join(d, 'model.safetensors'), { big: { dtype: 'BF16', shape: [4, 8], data: raw(64) }, small: { dtype: 'F32', shape: [8], data: raw(32) }, ids: { dtype: 'I64', shape: [64], data: raw(512) } }, { format: 'pt' });
    const ckpt = await openCheckpoint(d);
    try {
      expect(ckpt.storedFloatDType()).toBe('BF16');
    } finally {
      await ckpt.close();
    }
    const ints = join(dir, 'ints');
    await mkdir(ints);
    await writeSafetensors(join(ints, 'model.safetensors'), { ids: { dtype: 'I32', shape: [4], data: raw(16) } }, { format: 'pt' });
    const only = await openCheckpoint(ints);
    try {
      expect(only.storedFloatDType()).toBeUndefined();
    } finally {
      await only.close();
    }
  });

  it('loads a WeightStore for the interpreter', async () => {
    const ckpt = await openCheckpoint(join(dir, 'sharded'));
    const store = await loadWeightStore(ckpt, names.slice(0, 2));
    expect(store.get(names[0]!)?.dtype).toBe('f32');
    expect(store.get(names[2]!)).toBeUndefined();
    await ckpt.close();
  });

  it('names the missing shard file and key with ST_MISSING_SHARD', async () => {
    const d = await withIndex('missing-shard', JSON.stringify({ weight_map: { w: 'gone.safetensors' } }));
    await expect(openCheckpoint(d)).rejects.toMatchObject({ code: 'ST_MISSING_SHARD', tensor: 'w', message: expect.stringMatching(/gone\.safetensors/) });
  });

  it('names a key absent from its shard with ST_MISSING_TENSOR', async () => {
    const ok = join(dir, 'sharded');
    await writeFile(join(ok, 'alt.safetensors.index.json'), JSON.stringify({ weight_map: { [names[0]!]: 'model-00002-of-00002.safetensors' } }));
    await expect(openCheckpoint(join(ok, 'alt.safetensors.index.json'))).rejects.toMatchObject({
      code: 'ST_MISSING_TENSOR',
      tensor: names[0],
      message: expect.stringMatching(/model-00002-of-00002\.safetensors/),
    });
  });

  it.each([
    ['not JSON', '{'],
    ['not an object', '[]'],
    ['no weight_map', '{"metadata":{}}'],
    ['a non-string shard', '{"weight_map":{"w":1}}'],
    ['an absolute shard path', '{"weight_map":{"w":"/etc/passwd"}}'],
    ['a shard path escaping the directory', '{"weight_map":{"w":"a/../../x.safetensors"}}'],
    ['non-object metadata', '{"metadata":3,"weight_map":{}}'],
  ])('rejects an index with %s as ST_BAD_INDEX', async (what, text) => {
    expect(await asyncCodeOf(async () => openCheckpoint(await withIndex(`bad-${what.replace(/\W/g, '-')}`, text)))).toBe('ST_BAD_INDEX');
  });

  it('rejects duplicate keys in the index with ST_DUPLICATE_KEY', async () => {
    const d = await withIndex('dup', '{"weight_map":{"w":"a.safetensors","w":"b.safetensors"}}');
    expect(await asyncCodeOf(() => openCheckpoint(d))).toBe('ST_DUPLICATE_KEY');
  });

  it('throws ST_NO_CHECKPOINT for an empty or missing directory', async () => {
    const empty = join(dir, 'empty');
    await mkdir(empty);
    expect(await asyncCodeOf(() => openCheckpoint(empty))).toBe('ST_NO_CHECKPOINT');
    expect(await asyncCodeOf(() => openCheckpoint(join(dir, 'does-not-exist')))).toBe('ST_NO_CHECKPOINT');
  });
});
