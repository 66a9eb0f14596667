import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type HostTensor } from '@stageml/ir';
import { SafetensorsFile } from '@stageml/safetensors';
import { beforeAll, describe, expect, it } from 'vitest';
import { CausalLM, generate } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
interface Golden {
  families: { llama: { adapters: string[] } };
  'llama.mixed': { adapter_names: string[]; input_ids: number[] };
  [k: string]: unknown;
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Golden;
const ADAPTERS = golden.families.llama.adapters;
const prompt = (model: string, p: number) => (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
const logitsGolden: Record<string, HostTensor> = {};
let lm: CausalLM;

beforeAll(async () => {
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  for (const k of f.names()) if (k.startsWith('llama.')) logitsGolden[k] = await f.readTensor(k);
  await f.close();
  lm = await CausalLM.load(`${root}llama/base`);
  for (const a of ADAPTERS) await lm.loadAdapter(`${root}llama/adapters/${a}`);
});

function maxAbsDiff(a: HostTensor, b: HostTensor): number {
  expect(a.shape).toEqual(b.shape);
  let m = 0;
  for (let i = 0; i < a.data.length; i++) m = Math.max(m, Math.abs(a.data[i]! - b.data[i]!));
  return m;
}

describe('Llama fixture against transformers + PEFT', () => {
  for (const model of ['base', ...ADAPTERS]) {
    it(`${model}: logits within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
      const adapter = model === 'base' ? undefined : model;
      for (let p = 0; p < 4; p++) {
        const { input_ids, greedy_new_ids } = prompt(model, p);
        const { logits } = await lm.forward([input_ids], { adapters: [adapter] });
        const want = logitsGolden[`llama.${model}.prompt${String(p)}.logits`]!;
        expect(maxAbsDiff({ ...logits, shape: logits.shape.slice(1) }, want)).toBeLessThanOrEqual(1e-4);
        // The goldens come from HF generate with pad_token_id=0 (which masks the BOS token, id 0)
        // and eos_token_id=None (no early stop).
        const gen = await generate(lm, input_ids, { adapter, maxNewTokens: 12, padTokenId: 0, stopTokens: [] });
        expect(gen.newIds).toEqual(greedy_new_ids);
      }
    });
  }

  it('runs the mixed batch (four adapters and the base, one per row) within 1e-4', async () => {
    const mixed = golden['llama.mixed'];
    const { logits } = await lm.forward(mixed.adapter_names.map(() => mixed.input_ids), { adapters: mixed.adapter_names });
    expect(maxAbsDiff(logits, logitsGolden['llama.mixed.logits']!)).toBeLessThanOrEqual(1e-4);
  });

  it('decodes with the KV cache exactly as a full forward pass', async () => {
    const { input_ids } = prompt('base', 2);
    const full = await lm.forward([input_ids], { adapters: ['qv-r8'] });
    const head = await lm.forward([input_ids.slice(0, -1)], { adapters: ['qv-r8'] });
    const tail = await lm.forward([input_ids.slice(-1)], { adapters: ['qv-r8'], cache: head.cache });
    const V = lm.config.vocabSize;
    const last = Array.from(full.logits.data.subarray(full.logits.data.length - V));
    expect(maxAbsDiff({ dtype: 'f32', shape: [V], data: Float32Array.from(last) }, { dtype: 'f32', shape: [V], data: Float32Array.from(tail.logits.data) })).toBeLessThanOrEqual(1e-5);
  });

  it('decodes prompts and continuations with the tokenizer', async () => {
    expect(lm.tokenizer?.encode(golden['prompts' as keyof Golden] ? (golden['prompts'] as string[])[0]! : '')).toEqual(prompt('base', 0).input_ids);
    const gen = await generate(lm, prompt('base', 0).input_ids, { maxNewTokens: 3, padTokenId: 0, stopTokens: [] });
    expect(gen.text).toBe(lm.tokenizer!.decode(gen.newIds));
    expect(gen.finishReason).toBe('length');
  });
});
