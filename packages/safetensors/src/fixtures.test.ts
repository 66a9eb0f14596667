import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { FIXTURES, sameBytes } from '../test/helpers.js';
import { SafetensorsFile, parseSafetensors } from './file.js';
import { serializeSafetensors } from './write.js';

const ROOT = join(FIXTURES, 'peft-tiny');
const files = (await readdir(ROOT, { recursive: true })).filter((p) => p.endsWith('.safetensors')).sort();

describe('peft-tiny fixtures', () => {
  it('finds the golden file, every adapter and both base models', () => {
    expect(files).toContain('golden.safetensors');
    expect(files).toContain(join('llama', 'base', 'model.safetensors'));
    expect(files).toContain(join('mixtral', 'base', 'model.safetensors'));
    expect(files.filter((p) => p.endsWith('adapter_model.safetensors')).length).toBeGreaterThanOrEqual(10);
  });

  it.each(files)('%s opens lazily and every tensor reads the same as in memory', async (rel) => {
    const path = join(ROOT, rel);
    const bytes = new Uint8Array(await readFile(path));
    const mem = parseSafetensors(bytes, rel);
    const lazy = await SafetensorsFile.open(path);
    try {
      expect(lazy.names()).toEqual(mem.names());
      expect(lazy.names().length).toBeGreaterThan(0);
      for (const name of lazy.names()) {
        const info = lazy.info(name);
        const t = await lazy.readTensor(name);
        expect(t.shape).toEqual(info.shape);
        expect(t.data.length).toBe(info.shape.reduce((a, b) => a * b, 1));
        expect(sameBytes(await lazy.readRaw(name), mem.readRaw(name))).toBe(true);
        expect(sameBytes(await lazy.readFloat32(name), mem.readFloat32(name))).toBe(true);
        expect(t.data.every(Number.isFinite)).toBe(true);
      }
    } finally {
      await lazy.close();
    }
  });

  it.each(files)('%s re-serializes byte-identically (raw tensors and as host tensors)', async (rel) => {
    const bytes = new Uint8Array(await readFile(join(ROOT, rel)));
    const f = parseSafetensors(bytes, rel);
    const raw = Object.fromEntries(f.names().map((n) => [n, { dtype: f.info(n).dtype, shape: f.info(n).shape, data: f.readRaw(n) }]));
    const rewritten = serializeSafetensors(raw, f.metadata);
    expect(sameBytes(rewritten, bytes)).toBe(true);
    const back = parseSafetensors(rewritten);
    expect(back.metadata).toEqual(f.metadata);
    for (const n of f.names()) expect(sameBytes(back.readRaw(n), f.readRaw(n))).toBe(true);
    const host = Object.fromEntries(f.names().map((n) => [n, f.readTensor(n)]));
    expect(sameBytes(serializeSafetensors(host, f.metadata), bytes)).toBe(true);
  });
});
