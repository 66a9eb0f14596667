// fixtures/hf-v2's Mistral (sliding_window 16, written by transformers 5.17 + PEFT 0.21) through the
// engine's staged programs on every executor: base and adapters a, b decoded in one mixed batch give
// transformers' greedy tokens, and the last prefill logits are within 1e-4. On the interpreter, each
// model alone: logits of every position of prompts past the window within 1e-4, 16 greedy tokens,
// and the chats' greedy continuations equal transformers'.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { describe, expect, it } from 'vitest';
import { applyChatTemplate } from '@stageml/models';
import { Engine, generateWithEngine } from './index.js';
import { checkMixedBatch, describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/hf-v2/', import.meta.url));
type Prompts = Record<string, { input_ids: number[]; greedy_new_ids: number[] }>;
type Chat = { messages: { role: string; content: string }[]; greedy_new_ids: number[] }[];
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, { prompts: Prompts }> & { 'mistral.chat': Chat };
const models = ['base', 'a', 'b'];

async function mixedBatch(executor: Executor): Promise<void> {
  const engine = await Engine.load(`${root}mistral-sw`, { maxLoras: 2, maxLoraRank: 16, prefillChunk: 16, executor });
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  try {
    expect(engine.programReport('gathered')?.cutoff).toBe('base');
    for (const a of models.slice(1)) await engine.loadAdapter(`${root}mistral-sw/adapters/${a}`, a);
    for (const p of Object.keys(golden['mistral.base']!.prompts).slice(0, 2)) {
      const rows = models.map((m) => ({ model: m, ids: golden[`mistral.${m}`]!.prompts[p]!.input_ids, logits: `mistral.${m}.${p}.logits`, greedy: golden[`mistral.${m}`]!.prompts[p]!.greedy_new_ids }));
      await checkMixedBatch(engine, f, rows);
    }
  } finally {
    await f.close();
    engine.dispose();
  }
}

const executors: [string, () => Promise<Executor> | Executor][] = [
  ['interpreter', () => interpreterExecutor],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 2 })],
  ['onnxruntime', () => createOrtExecutor()],
];
for (const [name, make] of executors) {
  describe(`engine: hf-v2 Mistral (sliding window) on ${name}`, () => {
    it('base, a and b in one mixed batch: last prefill logits within 1e-4, 16 greedy tokens equal transformers\'', async () => {
      await mixedBatch(await make());
    }, 240_000);
  });
}

describeWithTorch('engine: hf-v2 Mistral (sliding window) on torch (CPU)', () => {
  const torch = useCpuTorchExecutor();
  it('base, a and b in one mixed batch: last prefill logits within 1e-4, 16 greedy tokens equal transformers\'', async () => {
    await mixedBatch(torch());
  }, 240_000);
});

describe('engine: hf-v2 Mistral (sliding window) alone on the interpreter', () => {
  it('base, a, b: logits of every position within 1e-4 and 16 greedy tokens on prompts of 30+ tokens (past the window); chats\' greedy replies equal', async () => {
    const engine = await Engine.load(`${root}mistral-sw`, { maxLoras: 2, maxLoraRank: 16 });
    const f = await SafetensorsFile.open(`${root}golden.safetensors`);
    try {
      for (const a of models.slice(1)) await engine.loadAdapter(`${root}mistral-sw/adapters/${a}`, a);
      for (const m of models) {
        const adapter = m === 'base' ? undefined : m;
        for (const [p, { input_ids, greedy_new_ids }] of Object.entries(golden[`mistral.${m}`]!.prompts)) {
          expect(input_ids.length).toBeGreaterThanOrEqual(30);
          const got = (await engine.promptLogits(adapter, input_ids)).data;
          const want = (await f.readTensor(`mistral.${m}.${p}.logits`)).data;
          expect(got.length).toBe(want.length);
          let d = 0;
          for (let i = 0; i < want.length; i++) d = Math.max(d, Math.abs(got[i]! - want[i]!));
          expect(d, `${m} ${p}`).toBeLessThanOrEqual(1e-4);
          expect((await generateWithEngine(engine, input_ids, { adapter, maxNewTokens: 16, stopTokens: [] })).newIds, `${m} ${p}`).toEqual(greedy_new_ids);
        }
      }
      for (const c of golden['mistral.chat']) {
        const gen = await generateWithEngine(engine, applyChatTemplate(engine.tokenizer!, c.messages).ids, { maxNewTokens: 12, stopTokens: [] });
        expect(gen.newIds).toEqual(c.greedy_new_ids);
      }
    } finally {
      await f.close();
      engine.dispose();
    }
  }, 240_000);
});
