// The model families of issue 36 (fixtures/hf-families, transformers 5.17 + PEFT 0.21 goldens) on the
// torch executor (CPU torch, f32): for every family, the base model and every adapter are prefilled as
// rows of one mixed batch and decoded together; each row's last prefill logits are within 1e-4 of
// transformers' and its 16 greedy tokens equal transformers'. The same rows decoded alone give the
// same tokens (the mixed batch equals each row by itself).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { argmaxOf } from '@stageml/models';
import { type TorchExecutor, createTorchExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Engine } from './index.js';
import { describeWithTorch } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/hf-families/', import.meta.url));
interface FamilyGolden {
  prompt_ids: number[][];
  prompts: Record<string, { greedy_new_ids: number[] }>;
  adapters: Record<string, { prompts: Record<string, { greedy_new_ids: number[] }> }>;
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as { families: string[] } & Record<string, FamilyGolden>;

describeWithTorch('engine families on the torch executor (CPU, f32)', () => {
  let executor: TorchExecutor | undefined;
  beforeAll(async () => {
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor?.close();
  });

  for (const family of golden.families) {
    const g = golden[family]!;
    const models = ['base', ...Object.keys(g.adapters)];
    it(`${family}: base and ${String(models.length - 1)} adapters mixed: last prefill logits within 1e-4, 16 greedy tokens equal transformers', each row alone the same`, async () => {
      const engine = await Engine.load(`${root}${family}`, { maxLoras: models.length - 1, maxLoraRank: 16, prefillChunk: 16, executor: executor! });
      try {
        for (const a of models.slice(1)) await engine.loadAdapter(`${root}${family}/adapters/${a}`, a);
        const f = await SafetensorsFile.open(`${root}golden.safetensors`);
        const V = engine.config.vocabSize;
        const wantOf = (m: string, p: number): number[] => (m === 'base' ? g.prompts : g.adapters[m]!.prompts)[`prompt${String(p)}`]!.greedy_new_ids;
        try {
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
              expect(out[i], `${m} prompt${String(p)} mixed`).toEqual(wantOf(m, p));
            });
            for (const s of seqs) engine.release(s);
            if (p !== 0) continue;
            // Each row alone (first prompt): the same tokens as in the mixed batch.
            for (const m of models) {
              const s = engine.open(m === 'base' ? undefined : m, ids);
              expect(await engine.attach(s)).toBe(true);
              let logits: Float32Array | undefined;
              while (!s.ready) logits = await engine.prefill(s);
              const alone = [argmaxOf(logits!)];
              for (let k = 0; k < 15; k++) alone.push(argmaxOf((await engine.decode([s], [alone[alone.length - 1]!]))[0]!));
              expect(alone, `${m} prompt0 alone`).toEqual(wantOf(m, p));
              engine.release(s);
            }
          }
        } finally {
          await f.close();
        }
      } finally {
        engine.dispose();
      }
    }, 300_000);
  }
});
