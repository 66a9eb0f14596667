import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { HostTensor } from '@stageml/ir';
import { SafetensorsFile } from '@stageml/safetensors';
import { beforeAll, describe, expect, it } from 'vitest';
import { CausalLM, generate } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown> & { families: { mixtral: { adapters: string[] } } };
const ADAPTERS = golden.families.mixtral.adapters;
const prompt = (model: string, p: number) => (golden[`mixtral.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
const want: Record<string, HostTensor> = {};
let lm: CausalLM;

beforeAll(async () => {
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  for (const k of f.names()) if (k.startsWith('mixtral.')) want[k] = await f.readTensor(k);
  await f.close();
  lm = await CausalLM.load(`${root}mixtral/base`);
  for (const a of ADAPTERS) await lm.loadAdapter(`${root}mixtral/adapters/${a}`);
});

describe('Mixtral fixture against transformers + PEFT', () => {
  it('maps the per-expert checkpoint layout onto fused expert tensors', () => {
    expect(lm.config.moe).toEqual({ numExperts: 4, topK: 2 });
  });

  for (const model of ['base', ...ADAPTERS]) {
    it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
      const adapter = model === 'base' ? undefined : model;
      for (let p = 0; p < 4; p++) {
        const { input_ids, greedy_new_ids } = prompt(model, p);
        const { logits } = await lm.forward([input_ids], { adapters: [adapter] });
        const g = want[`mixtral.${model}.prompt${String(p)}.logits`]!;
        let m = 0;
        for (let i = 0; i < g.data.length; i++) m = Math.max(m, Math.abs(g.data[i]! - logits.data[i]!));
        expect(m).toBeLessThanOrEqual(1e-4);
        const gen = await generate(lm, input_ids, { adapter, maxNewTokens: 12, padTokenId: 0, stopTokens: [] });
        expect(gen.newIds).toEqual(greedy_new_ids);
      }
    });
  }

  it('refuses to mix an expert adapter into a mixed batch, with a coded error', async () => {
    const ids = prompt('base', 0).input_ids;
    await expect(lm.forward([ids, ids], { adapters: ['experts-r4', '__base__'] })).rejects.toMatchObject({ code: 'MODEL_BAD_ADAPTER' });
    const mixed = await lm.forward([ids, ids], { adapters: ['attn-r8', '__base__'] });
    const single = await lm.forward([ids], { adapters: ['attn-r8'] });
    const V = lm.config.vocabSize;
    const n = ids.length * V;
    let m = 0;
    for (let i = 0; i < n; i++) m = Math.max(m, Math.abs(mixed.logits.data[i]! - single.logits.data[i]!));
    expect(m).toBeLessThanOrEqual(1e-5);
  });
});
