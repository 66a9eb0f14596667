// generateWithEngine against the goldens (transformers' greedy tokens), against the staged
// single-adapter graph for seeded sampling (the same picker over the same logits), and on adapter
// kinds PEFT alone defines (DoRA, trainable tokens): the first new token is the argmax of PEFT's logits.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { StageError } from '@stageml/ir';
import { type GenerateOptions, argmaxOf, makePicker } from '@stageml/models';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, generateWithEngine } from './index.js';
import { type StagedReference, stagedReference } from './test-support.js';

const tiny = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const kinds = fileURLToPath(new URL('../../../fixtures/peft-kinds/', import.meta.url));
const golden = JSON.parse(readFileSync(`${tiny}golden.json`, 'utf8')) as Record<string, Record<string, { input_ids: number[]; greedy_new_ids: number[] }>>;
const ADAPTERS = ['qv-r8', 'all-r16'];

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (e) {
    return e instanceof StageError ? e.code : 'uncoded';
  }
  return undefined;
}

describe('generateWithEngine', () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = await Engine.load(`${tiny}llama/base`, { maxLoras: ADAPTERS.length, maxLoraRank: 16 });
    for (const a of ADAPTERS) await engine.loadAdapter(`${tiny}llama/adapters/${a}`, a);
  });

  /** What generation picks from the reference's logits: one full forward per new token, the picker of `opts`, no stop tokens. */
  async function referenceSample(lm: StagedReference, ids: readonly number[], opts: GenerateOptions): Promise<number[]> {
    const pick = makePicker(opts.sampling ?? { greedy: true });
    const out: number[] = [];
    while (out.length < opts.maxNewTokens) out.push(pick(await lm.last([...ids, ...out])));
    return out;
  }
  afterAll(() => {
    engine.dispose();
  });

  for (const model of ['base', ...ADAPTERS]) {
    it(`gives transformers' 12 greedy tokens, the pad id masked (${model})`, async () => {
      for (const p of ['prompt0', 'prompt1']) {
        const g = golden[`llama.${model}`]![p]!;
        const r = await generateWithEngine(engine, g.input_ids, { adapter: model === 'base' ? undefined : model, maxNewTokens: 12, padTokenId: 0, stopTokens: [] });
        expect(r.newIds, `${model} ${p}`).toEqual(g.greedy_new_ids.slice(0, 12));
        expect(r).toMatchObject({ finishReason: 'length', promptTokens: g.input_ids.length });
        expect(typeof r.text).toBe('string');
      }
      expect(engine.stats().sequences).toBe(0);
    });
  }

  it('samples the tokens the same seeded picker draws from the staged graph\'s logits, and stops at a stop token', async () => {
    const ids = golden['llama.base']!['prompt0']!.input_ids;
    for (const adapter of [undefined, 'all-r16']) {
      const opts = { adapter, maxNewTokens: 10, sampling: { temperature: 0.8, topP: 0.9, topK: 50, seed: 7 }, stopTokens: [] };
      const lm = await stagedReference(`${tiny}llama/base`, { adapter: adapter === undefined ? undefined : `${tiny}llama/adapters/${adapter}` });
      const want = { newIds: await referenceSample(lm, ids, opts) };
      lm.dispose();
      const got = await generateWithEngine(engine, ids, opts);
      expect(got.newIds, adapter ?? 'base').toEqual(want.newIds);
      expect(got.text).toBe(engine.tokenizer!.decode(want.newIds));
      // The third token as a stop token: generation ends there, the stop token kept.
      const stopped = await generateWithEngine(engine, ids, { ...opts, stopTokens: [want.newIds[2]!] });
      expect(stopped.newIds).toEqual(want.newIds.slice(0, want.newIds.indexOf(want.newIds[2]!) + 1));
      expect(stopped.finishReason).toBe('stop');
    }
    // A different seed draws another continuation (the seed is used).
    const other = await generateWithEngine(engine, ids, { maxNewTokens: 10, sampling: { temperature: 0.8, seed: 8 }, stopTokens: [] });
    const seven = await generateWithEngine(engine, ids, { maxNewTokens: 10, sampling: { temperature: 0.8, seed: 7 }, stopTokens: [] });
    expect(other.newIds).not.toEqual(seven.newIds);
  });

  it('refuses bad options with MODEL_ codes and releases the sequence on every exit', async () => {
    expect(await codeOf(generateWithEngine(engine, [1, 2], { maxNewTokens: 0 }))).toBe('MODEL_BAD_OPTIONS');
    expect(await codeOf(generateWithEngine(engine, [], { maxNewTokens: 1 }))).toBe('MODEL_BAD_OPTIONS');
    expect(await codeOf(generateWithEngine(engine, [1, 2], { maxNewTokens: engine.config.maxPositions }))).toBe('MODEL_BAD_OPTIONS');
    expect(await codeOf(generateWithEngine(engine, [1, engine.config.vocabSize], { maxNewTokens: 1 }))).toBe('MODEL_BAD_TOKEN');
    expect(await codeOf(generateWithEngine(engine, [1, 2], { maxNewTokens: 1, adapter: 'missing' }))).toBe('MODEL_BAD_ADAPTER');
    expect(await codeOf(generateWithEngine(engine, [1, 2], { maxNewTokens: 2, sampling: { temperature: -1 } }))).toBe('MODEL_BAD_OPTIONS');
    expect(engine.stats().sequences).toBe(0);
  });
});

describe('generateWithEngine on adapter kinds beyond plain LoRA', () => {
  it('DoRA, lora_bias, trainable tokens and a tied lm_head: the first new token is the argmax of PEFT logits', async () => {
    const g = JSON.parse(readFileSync(`${kinds}golden.json`, 'utf8')) as { prompt_ids: number[][] };
    const f = await SafetensorsFile.open(`${kinds}golden.safetensors`);
    const adapters = ['dora', 'lora-bias', 'tokens', 'head'];
    const engine = await Engine.load(`${kinds}qwen2`, { maxLoras: adapters.length, maxLoraRank: 4 });
    try {
      for (const a of adapters) await engine.loadAdapter(`${kinds}qwen2/adapters/${a}`, a);
      const V = engine.config.vocabSize;
      for (const [p, ids] of g.prompt_ids.entries()) {
        for (const a of adapters) {
          const want = (await f.readTensor(`qwen2.${a}.prompt${String(p)}`)).data;
          const last = Float32Array.from(want.subarray((ids.length - 1) * V, ids.length * V));
          const r = await generateWithEngine(engine, ids, { adapter: a, maxNewTokens: 1, stopTokens: [] });
          expect(r.newIds, `${a} prompt${String(p)}`).toEqual([argmaxOf(last)]);
        }
      }
    } finally {
      engine.dispose();
    }
  });
});
