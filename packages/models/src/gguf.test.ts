import { readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type HostTensor, seededRandom } from '@stageml/ir';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GGML_TYPE, decodeGgml, encodeGgml, parseGguf, permuteRotaryRows, writeGguf, writeLlamaGguf, writeLoraGguf } from './index.js';
import { type LlamaConfig, parseLlamaConfig } from './hf-config.js';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'stageml-gguf-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const rnd = seededRandom(7);
const values = (n: number) => Float32Array.from({ length: n }, () => rnd() * 2 - 1);

describe('GGUF writer', () => {
  it('round-trips metadata and F32/F16/Q8_0/Q4_0 tensors through the parser', async () => {
    const a = values(64 * 3);
    const path = join(dir, 'a.gguf');
    await writeGguf(
      path,
      { 'general.architecture': 'llama', 'general.alignment': { u32: 32 }, 'x.f': { f32: 0.5 }, 'x.b': true, 'x.s': { strings: ['a', 'bc'] }, 'x.i': { i32s: [1, -2] } },
      (['F32', 'F16', 'Q8_0', 'Q4_0'] as const).map((type) => ({ name: `t.${type}`, shape: [3, 64], data: a, type })),
    );
    const f = parseGguf(new Uint8Array(await readFile(path)));
    expect(f.version).toBe(3);
    expect(f.metadata).toEqual({ 'general.architecture': 'llama', 'general.alignment': 32, 'x.f': 0.5, 'x.b': true, 'x.s': ['a', 'bc'], 'x.i': [1, -2] });
    expect(f.tensors.map((t) => [t.name, t.dims, t.type])).toEqual([
      ['t.F32', [64, 3], GGML_TYPE.F32],
      ['t.F16', [64, 3], GGML_TYPE.F16],
      ['t.Q8_0', [64, 3], GGML_TYPE.Q8_0],
      ['t.Q4_0', [64, 3], GGML_TYPE.Q4_0],
    ]);
    const maxErr = (t: (typeof f.tensors)[number]) => {
      const d = decodeGgml(t.type, t.data, a.length);
      return Math.max(...Array.from(d, (v, i) => Math.abs(v - a[i]!)));
    };
    expect(maxErr(f.tensors[0]!)).toBe(0);
    expect(maxErr(f.tensors[1]!)).toBeLessThan(1e-3);
    // Q8_0: half a step of max|x|/127 (plus the f16 scale); Q4_0: one step max|x|/8 (codes span
    // [−8, 7]·d with the signed max at −8, so its negation clamps to 7).
    expect(maxErr(f.tensors[2]!)).toBeLessThan(0.5 / 127 + 2e-3);
    expect(maxErr(f.tensors[2]!)).toBeGreaterThan(0);
    expect(maxErr(f.tensors[3]!)).toBeLessThan(1 / 8 + 2e-3);
    for (const t of f.tensors) expect(t.data.byteOffset % 32).toBe(0);
  });

  it('encodes Q4_0 as llama.cpp does: d = max/−8, first 16 values in the low nibbles', () => {
    const x = Float32Array.from({ length: 32 }, (_, i) => (i === 20 ? -4 : i / 16));
    const b = encodeGgml('Q4_0', x);
    expect(b.byteLength).toBe(18);
    // d = -4 / -8 = 0.5: value 0 → q 8, -4 → 0, 0.5 → 9.
    expect(b[2]! & 0x0f).toBe(8);
    expect(b[2 + 4]! >> 4).toBe(0);
    const d = decodeGgml(GGML_TYPE.Q4_0, b, 32);
    expect(d[20]).toBe(-4);
    expect(d[8]).toBe(0.5);
  });

  it('rejects block types on sizes that are not whole blocks, and truncated files', () => {
    expect(() => encodeGgml('Q8_0', new Float32Array(31))).toThrow(expect.objectContaining({ code: 'MODEL_BAD_OPTIONS' }));
    expect(() => parseGguf(new TextEncoder().encode('GGML'))).toThrow(expect.objectContaining({ code: 'MODEL_BAD_WEIGHT' }));
    expect(() => parseGguf(Uint8Array.of(0x47, 0x47, 0x55, 0x46, 3, 0, 0))).toThrow(expect.objectContaining({ code: 'MODEL_BAD_WEIGHT' }));
  });

  it('permutes q/k rows from rotate-half to interleaved pairs within each head', () => {
    // 2 heads of dim 4, 1 column: rows [h0: a0 a1 b0 b1, h1: …] → [a0 b0 a1 b1, …].
    expect(Array.from(permuteRotaryRows(Float32Array.from([0, 1, 2, 3, 4, 5, 6, 7]), 2, 1))).toEqual([0, 2, 1, 3, 4, 6, 5, 7]);
  });

  it('writes LoRA adapters with llama.cpp adapter metadata and tensor names', async () => {
    const cfg = { modelType: 'llama', numHeads: 2, numKvHeads: 1 } as LlamaConfig;
    const path = join(dir, 'l.gguf');
    await writeLoraGguf(path, cfg, 16, [{ module: 'model.layers.1.self_attn.k_proj', A: { dtype: 'f32', shape: [2, 8], data: values(16) }, B: { dtype: 'f32', shape: [4, 2], data: values(8) } }]);
    const f = parseGguf(new Uint8Array(await readFile(path)));
    expect(f.metadata).toMatchObject({ 'general.type': 'adapter', 'adapter.type': 'lora', 'adapter.lora.alpha': 16 });
    expect(f.tensors.map((t) => [t.name, t.dims])).toEqual([
      ['blk.1.attn_k.weight.lora_a', [8, 2]],
      ['blk.1.attn_k.weight.lora_b', [2, 4]],
    ]);
  });
  it("writes a Qwen3 checkpoint for llama.cpp's qwen3 architecture: q/k rows kept (NeoX rotary), per-head q/k norms, head_dim as key/value length", async () => {
    const root = fileURLToPath(new URL('../../../fixtures/hf-families/qwen3/', import.meta.url));
    const cfg = parseLlamaConfig(readFileSync(`${root}config.json`, 'utf8'), 'config.json');
    const f = await SafetensorsFile.open(`${root}model.safetensors`);
    const w = new Map<string, HostTensor>();
    for (const k of f.names()) w.set(k, await f.readTensor(k));
    await f.close();
    const path = join(dir, 'qwen3.gguf');
    await writeLlamaGguf(path, cfg, w, { type: 'F32' });
    const g = parseGguf(new Uint8Array(await readFile(path)));
    expect(g.metadata).toMatchObject({ 'general.architecture': 'qwen3', 'qwen3.attention.key_length': cfg.headDim, 'qwen3.attention.value_length': cfg.headDim, 'qwen3.block_count': cfg.numLayers, 'qwen3.attention.head_count_kv': cfg.numKvHeads });
    const byName = new Map(g.tensors.map((t) => [t.name, t]));
    expect(byName.get('blk.0.attn_q_norm.weight')?.dims).toEqual([cfg.headDim]);
    expect(byName.get('blk.1.attn_k_norm.weight')?.dims).toEqual([cfg.headDim]);
    const q = byName.get('blk.0.attn_q.weight')!;
    expect(Array.from(decodeGgml(q.type, q.data, q.dims.reduce((a, b) => a * b, 1)))).toEqual(Array.from(w.get('model.layers.0.self_attn.q_proj.weight')!.data));
    await writeLoraGguf(join(dir, 'qwen3-lora.gguf'), cfg, 16, [{ module: 'model.layers.0.self_attn.q_proj', A: { dtype: 'f32', shape: [2, cfg.hiddenSize], data: values(2 * cfg.hiddenSize) }, B: { dtype: 'f32', shape: [cfg.numHeads * cfg.headDim, 2], data: values(2 * cfg.numHeads * cfg.headDim) } }]);
    expect(parseGguf(new Uint8Array(await readFile(join(dir, 'qwen3-lora.gguf')))).metadata['general.architecture']).toBe('qwen3');
  });

  it('refuses families it has no llama.cpp layout for, naming the model_type', async () => {
    const cfg = { modelType: 'olmo2', vocabSize: 512 } as LlamaConfig;
    await expect(writeLlamaGguf(join(dir, 'o.gguf'), cfg, new Map(), { type: 'F32' })).rejects.toMatchObject({ code: 'MODEL_BAD_OPTIONS', message: expect.stringContaining("'olmo2'") });
  });
});
