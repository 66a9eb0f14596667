// fixtures/peft-tiny (Llama and Mixtral written by transformers, adapters by PEFT, goldens by both)
// through the engine on every executor: the interpreter, cpu-native, onnxruntime, tfjs (wasm) and
// torch (CPU). Each model alone: logits of every prompt position within 1e-4 and transformers' 12
// greedy tokens (its `generate` with pad_token_id=0, which masks the BOS token). PEFT's mixed batch:
// every row's prompt logits within 1e-4, and the rows prefilled together in one run give each row's
// last logits.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { HostTensor } from '@stageml/ir';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, createTfjsExecutor, interpreterExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, generateWithEngine } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
interface PromptGolden {
  input_ids: number[];
  greedy_new_ids: number[];
}
type Golden = Record<string, unknown> & {
  prompts: string[];
  families: Record<'llama' | 'mixtral', { adapters: string[] }>;
  'llama.mixed': { adapter_names: string[]; input_ids: number[] };
};
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Golden;
const promptOf = (family: string, model: string, p: number): PromptGolden => (golden[`${family}.${model}`] as Record<string, PromptGolden>)[`prompt${String(p)}`]!;
const want: Record<string, HostTensor> = {};

beforeAll(async () => {
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  for (const k of f.names()) if (k.startsWith('llama.') || k.startsWith('mixtral.')) want[k] = await f.readTensor(k);
  await f.close();
});

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

const adapterOf = (m: string): string | undefined => (m === 'base' || m === '__base__' ? undefined : m);

/** The tests of one family on one executor (`extras`: the KV-cache and tokenizer checks, which do not depend on the executor). */
function familySuite(family: 'llama' | 'mixtral', exName: string, make: () => Promise<Executor> | Executor, extras: boolean): void {
  const adapters = golden.families[family].adapters;
  describe(`engine: peft-tiny ${family} on ${exName} against transformers + PEFT`, () => {
    let engine: Engine;
    beforeAll(async () => {
      engine = await Engine.load(`${root}${family}/base`, { executor: await make(), maxLoras: adapters.length, maxLoraRank: 16, prefillChunk: 64 });
      for (const a of adapters) await engine.loadAdapter(`${root}${family}/adapters/${a}`, a);
    }, 240_000);
    afterAll(() => {
      engine.dispose();
    });

    for (const model of ['base', ...adapters]) {
      it(`${model}: logits of every position within 1e-4 and 12 greedy tokens equal on every prompt`, async () => {
        expect(engine.executorName).toBe(exName);
        for (let p = 0; p < 4; p++) {
          const { input_ids, greedy_new_ids } = promptOf(family, model, p);
          const logits = await engine.promptLogits(adapterOf(model), input_ids);
          expect(maxAbsDiff(logits.data, want[`${family}.${model}.prompt${String(p)}.logits`]!.data), `prompt ${String(p)}`).toBeLessThanOrEqual(1e-4);
          const gen = await generateWithEngine(engine, input_ids, { adapter: adapterOf(model), maxNewTokens: 12, padTokenId: 0, stopTokens: [] });
          expect(gen.newIds, `prompt ${String(p)} greedy`).toEqual(greedy_new_ids);
        }
        expect(engine.stats().sequences).toBe(0);
      }, 120_000);
    }

    it(`the base and every adapter prefilled together in one run: each row's last logits within 1e-4 of PEFT's`, async () => {
      const names = golden['llama.mixed'].adapter_names;
      const rowOf = (t: HostTensor, r: number): HostTensor['data'] => t.data.subarray((r * t.data.length) / names.length, ((r + 1) * t.data.length) / names.length);
      const rows = family === 'llama'
        ? names.map((a, r) => ({ model: a, ids: golden['llama.mixed'].input_ids, at: (t: HostTensor) => rowOf(t, r), logits: 'llama.mixed.logits' }))
        : ['base', ...adapters].map((m) => ({ model: m, ids: promptOf(family, m, 0).input_ids, at: (t: HostTensor) => t.data, logits: `${family}.${m}.prompt0.logits` }));
      const V = engine.config.vocabSize;
      if (family === 'llama') {
        for (const r of rows) {
          const alone = await engine.promptLogits(adapterOf(r.model), r.ids);
          expect(maxAbsDiff(alone.data, r.at(want[r.logits]!)), `${r.model} alone`).toBeLessThanOrEqual(1e-4);
        }
      }
      const seqs = rows.map((r) => engine.open(adapterOf(r.model), r.ids));
      for (const s of seqs) expect(await engine.attach(s)).toBe(true);
      const before = engine.stats().runs;
      const last = await engine.prefillMany(seqs, { maxChunk: 64 });
      expect(engine.stats().runs - before).toBe(1);
      rows.forEach((r, i) => {
        const g = r.at(want[r.logits]!);
        expect(maxAbsDiff(last[i]!, g.subarray(g.length - V)), `${r.model} in the batch`).toBeLessThanOrEqual(1e-4);
      });
      for (const s of seqs) engine.release(s);
    }, 120_000);

    if (!extras) return;
    it('a decode step over the resident KV equals the last position of the whole sequence', async () => {
      const { input_ids } = promptOf(family, 'base', 2);
      const a = adapters[0];
      const full = await engine.promptLogits(a, input_ids);
      const s = engine.open(a, input_ids.slice(0, -1));
      expect(await engine.attach(s)).toBe(true);
      while (!s.ready) await engine.prefill(s);
      const [step] = await engine.decode([s], [input_ids.at(-1)!]);
      engine.release(s);
      const V = engine.config.vocabSize;
      expect(maxAbsDiff(step!, full.data.subarray(full.data.length - V))).toBeLessThanOrEqual(1e-5);
    });

    it('tokenizes the prompts as transformers did and decodes generated text with the tokenizer', async () => {
      golden.prompts.forEach((text, p) => {
        expect(engine.tokenizer!.encode(text), `prompt ${String(p)}`).toEqual(promptOf(family, 'base', p).input_ids);
      });
      const gen = await generateWithEngine(engine, promptOf(family, 'base', 0).input_ids, { maxNewTokens: 3, padTokenId: 0, stopTokens: [] });
      expect(gen.text).toBe(engine.tokenizer!.decode(gen.newIds));
      expect(gen.finishReason).toBe('length');
    });
  });
}

const executors: [string, () => Promise<Executor> | Executor][] = [
  ['interpreter', () => interpreterExecutor],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 2 })],
  ['onnxruntime', () => createOrtExecutor()],
  ['tfjs-wasm', () => createTfjsExecutor({ backend: 'wasm' })],
];
for (const family of ['llama', 'mixtral'] as const) {
  for (const [name, make] of executors) familySuite(family, name, make, name === 'interpreter');
}

describeWithTorch('engine: peft-tiny on one torch executor (CPU, f32)', () => {
  const torch = useCpuTorchExecutor();
  for (const family of ['llama', 'mixtral'] as const) familySuite(family, 'torch-cpu', torch, false);
});
