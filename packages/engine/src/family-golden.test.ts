// The engine's slot programs for the model families of issue 36 (fixtures/hf-families, written by
// tools/gen_family_fixtures.py with transformers 5.17 + PEFT 0.21): the base model and every adapter
// decoded together in one mixed batch give transformers' greedy tokens, and the last prefill logits
// are within 1e-4, on the interpreter, cpu-native and onnxruntime (torch: family-torch.test.ts).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { argmaxOf } from '@stageml/models';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { describe, expect, it } from 'vitest';
import { Engine } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/hf-families/', import.meta.url));
interface FamilyGolden {
  prompt_ids: number[][];
  logit_positions: number[][];
  prompts: Record<string, { greedy_new_ids: number[] }>;
  adapters: Record<string, { prompts: Record<string, { greedy_new_ids: number[] }> }>;
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as { families: string[] } & Record<string, FamilyGolden>;

const executors: [string, () => Promise<Executor> | Executor][] = [
  ['interpreter', () => interpreterExecutor],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 2 })],
  ['onnxruntime', () => createOrtExecutor()],
];

async function mixedBatch(family: string, executor: Executor): Promise<void> {
  const g = golden[family]!;
  const models = ['base', ...Object.keys(g.adapters)];
  const engine = await Engine.load(`${root}${family}`, { maxLoras: models.length - 1, maxLoraRank: 16, prefillChunk: 16, executor });
  for (const a of models.slice(1)) await engine.loadAdapter(`${root}${family}/adapters/${a}`, a);
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  const V = engine.config.vocabSize;
  for (const [p, ids] of g.prompt_ids.entries()) {
    const seqs = models.map((m) => engine.open(m === 'base' ? undefined : m, ids));
    const out: number[][] = models.map(() => []);
    const last: number[] = [];
    for (const [i, s] of seqs.entries()) {
      expect(await engine.attach(s)).toBe(true);
      let logits: Float32Array | undefined;
      while (!s.ready) logits = await engine.prefill(s);
      const want = (await f.readTensor(`${family}.${models[i]!}.prompt${String(p)}.logits`)).data;
      let d = 0;
      for (let v = 0; v < V; v++) d = Math.max(d, Math.abs(logits![v]! - want[want.length - V + v]!));
      expect(d, `${models[i]!} prompt${String(p)} last logits`).toBeLessThanOrEqual(1e-4);
      out[i]!.push((last[i] = argmaxOf(logits!)));
    }
    for (let k = 0; k < 15; k++) (await engine.decode(seqs, last)).forEach((l, i) => out[i]!.push((last[i] = argmaxOf(l))));
    models.forEach((m, i) => {
      const want = (m === 'base' ? g.prompts : g.adapters[m]!.prompts)[`prompt${String(p)}`]!.greedy_new_ids;
      expect(out[i], `${m} prompt${String(p)}`).toEqual(want);
    });
    for (const s of seqs) engine.release(s);
  }
  await f.close();
  engine.dispose();
}

for (const family of golden.families) {
  const adapters = Object.keys(golden[family]!.adapters).length;
  for (const [exName, make] of executors) {
    // cpu-native lacks the MoE routing ops (topk, indexSelect, scatterAdd).
    if (family === 'qwen3_moe' && exName === 'cpu-native') continue;
    describe(`engine: ${family} on ${exName}`, () => {
      it(`base and ${String(adapters)} adapters in one mixed batch: last prefill logits within 1e-4, 16 greedy tokens equal transformers'`, async () => {
        await mixedBatch(family, await make());
      }, 240_000);
    });
  }
}
