import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { hostTensor } from '@stageml/ir';
import { SafetensorsFile, writeSafetensors } from '@stageml/safetensors';
import { afterAll, describe, expect, it } from 'vitest';
import { parseLlamaConfig, ropeInvFreqFor, stagedModelGraph } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'stageml-models-'));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
});

function copyBase(name: string): string {
  const dir = join(tmp, name);
  cpSync(`${root}llama/base`, dir, { recursive: true });
  return dir;
}

async function rejectsWith(p: Promise<unknown>, code: string, ...fragments: string[]): Promise<void> {
  const e = await p.then(() => undefined, (err: unknown) => err);
  expect(e, `expected ${code}`).toBeInstanceOf(Error);
  expect((e as { code?: string }).code).toBe(code);
  for (const f of fragments) expect((e as Error).message).toContain(f);
}

describe('stagedModelGraph (the model graph the engine and `stageml stage` load) rejects bad checkpoints', () => {
  it('an unsupported architecture', async () => {
    const dir = copyBase('gpt2');
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, model_type: 'gpt2', architectures: ['GPT2LMHeadModel'] }));
    await rejectsWith(stagedModelGraph(dir), 'MODEL_UNSUPPORTED_ARCH', 'gpt2');
  });

  it('a sharded checkpoint with a missing shard, naming the file', async () => {
    const dir = copyBase('sharded');
    const f = await SafetensorsFile.open(join(dir, 'model.safetensors'));
    const names = f.names();
    const half = Math.floor(names.length / 2);
    const shard = async (file: string, keys: string[]) => {
      const tensors: Record<string, ReturnType<typeof hostTensor>> = {};
      for (const k of keys) tensors[k] = await f.readTensor(k);
      await writeSafetensors(join(dir, file), tensors);
    };
    await shard('model-00001-of-00002.safetensors', names.slice(0, half));
    await f.close();
    rmSync(join(dir, 'model.safetensors'));
    const weightMap = Object.fromEntries(names.map((n, i) => [n, i < half ? 'model-00001-of-00002.safetensors' : 'model-00002-of-00002.safetensors']));
    writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: weightMap }));
    await rejectsWith(stagedModelGraph(dir), 'ST_MISSING_SHARD', 'model-00002-of-00002.safetensors');
  });

  it('a wrongly shaped tensor, naming file and key', async () => {
    const dir = copyBase('badshape');
    const f = await SafetensorsFile.open(join(dir, 'model.safetensors'));
    const tensors: Record<string, ReturnType<typeof hostTensor>> = {};
    for (const k of f.names()) tensors[k] = await f.readTensor(k);
    await f.close();
    tensors['model.layers.1.self_attn.k_proj.weight'] = hostTensor('f32', [16, 64], new Array(16 * 64).fill(0));
    await writeSafetensors(join(dir, 'model.safetensors'), tensors);
    await rejectsWith(stagedModelGraph(dir), 'MODEL_BAD_WEIGHT', 'model.safetensors', 'model.layers.1.self_attn.k_proj.weight', '[16, 64]', '[32, 64]');
  });

  it('an adapter made for another base model', async () => {
    const dir = join(tmp, 'wide-adapter');
    cpSync(`${root}llama/adapters/qv-r8`, dir, { recursive: true });
    await writeSafetensors(join(dir, 'adapter_model.safetensors'), {
      'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': hostTensor('f32', [8, 96], new Array(8 * 96).fill(0)),
      'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': hostTensor('f32', [96, 8], new Array(96 * 8).fill(0)),
    });
    await rejectsWith(stagedModelGraph(`${root}llama/base`, { adapter: dir }), 'PEFT_SHAPE_MISMATCH', 'model.layers.0.self_attn.q_proj.lora_A.weight', '[8, 96]', '[64, 64]');
    await rejectsWith(stagedModelGraph(`${root}llama/base`, { adapter: `${root}mixtral/adapters/experts-r4` }), 'MODEL_BAD_ADAPTER', 'experts');
  });
});

describe('parseLlamaConfig', () => {
  it('reads rope parameters, GQA and defaults', () => {
    const c = parseLlamaConfig(readFileSync(`${root}llama/base/config.json`, 'utf8'));
    expect(c).toMatchObject({ numKvHeads: 2, headDim: 16, ropeTheta: 10000, rope: { type: 'default' }, eosTokenIds: [2], tieWordEmbeddings: false });
  });

  it('supports linear and llama3 rope scaling and rejects others', () => {
    const base = JSON.parse(readFileSync(`${root}llama/base/config.json`, 'utf8')) as Record<string, unknown>;
    const lin = parseLlamaConfig(JSON.stringify({ ...base, rope_parameters: { rope_theta: 10000, rope_type: 'linear', factor: 2 } }));
    expect(ropeInvFreqFor(16, 10000, lin.rope)[1]).toBeCloseTo(ropeInvFreqFor(16, 10000)[1]! / 2, 7);
    const l3 = parseLlamaConfig(
      JSON.stringify({ ...base, rope_parameters: { rope_theta: 500000, rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 } }),
    );
    const inv = ropeInvFreqFor(128, l3.ropeTheta, l3.rope);
    expect(inv[0]).toBe(1);
    expect(inv[63]).toBeCloseTo(ropeInvFreqFor(128, 500000)[63]! / 8, 12);
    expect(() => parseLlamaConfig(JSON.stringify({ ...base, rope_parameters: { rope_type: 'yarn', factor: 4 } }))).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG' }) as Error);
    expect(() => parseLlamaConfig(JSON.stringify({ ...base, hidden_size: 'big' }))).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG' }) as Error);
    expect(() => parseLlamaConfig('{')).toThrow(expect.objectContaining({ code: 'MODEL_BAD_CONFIG' }) as Error);
  });
});
