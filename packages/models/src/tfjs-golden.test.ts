import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { HostTensor } from '@stageml/ir';
import { createTfjsExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { beforeAll, describe, expect, it } from 'vitest';
import { CausalLM, generate } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown> & { families: Record<string, { adapters: string[] }> };
const want: Record<string, HostTensor> = {};

beforeAll(async () => {
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  for (const k of f.names()) if (!k.startsWith('linear.')) want[k] = await f.readTensor(k);
  await f.close();
});

function maxDiff(a: HostTensor, b: HostTensor): number {
  let m = 0;
  for (let i = 0; i < b.data.length; i++) m = Math.max(m, Math.abs(a.data[i]! - b.data[i]!));
  return m;
}

for (const family of ['llama', 'mixtral'] as const) {
  describe(`${family} fixture on the tfjs wasm executor`, () => {
    let lm: CausalLM;
    beforeAll(async () => {
      lm = await CausalLM.load(`${root}${family}/base`, { executor: await createTfjsExecutor({ backend: 'wasm' }) });
      for (const a of golden.families[family]!.adapters) await lm.loadAdapter(`${root}${family}/adapters/${a}`);
    });

    for (const model of ['base', ...golden.families[family]!.adapters]) {
      it(`${model}: logits within 1e-4 and greedy tokens equal`, async () => {
        expect(lm.executorName).toBe('tfjs-wasm');
        const adapter = model === 'base' ? undefined : model;
        for (let p = 0; p < 4; p++) {
          const g = (golden[`${family}.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
          const { logits } = await lm.forward([g.input_ids], { adapters: [adapter] });
          expect(maxDiff(logits, want[`${family}.${model}.prompt${String(p)}.logits`]!)).toBeLessThanOrEqual(1e-4);
          const gen = await generate(lm, g.input_ids, { adapter, maxNewTokens: 12, padTokenId: 0, stopTokens: [] });
          expect(gen.newIds).toEqual(g.greedy_new_ids);
        }
      });
    }
  });
}

describe('llama mixed batch on tfjs wasm', () => {
  it('equals the golden within 1e-4', async () => {
    const lm = await CausalLM.load(`${root}llama/base`, { executor: await createTfjsExecutor({ backend: 'wasm' }) });
    for (const a of golden.families['llama']!.adapters) await lm.loadAdapter(`${root}llama/adapters/${a}`);
    const mixed = golden['llama.mixed'] as { adapter_names: string[]; input_ids: number[] };
    const { logits } = await lm.forward(mixed.adapter_names.map(() => mixed.input_ids), { adapters: mixed.adapter_names });
    expect(maxDiff(logits, want['llama.mixed.logits']!)).toBeLessThanOrEqual(1e-4);
  });
});
