// The engine's slot programs for the model families of issue 36 (fixtures/hf-families, written by
// tools/gen_family_fixtures.py with transformers 5.17 + PEFT 0.21): the base model and every adapter
// decoded together in one mixed batch give transformers' greedy tokens, and the last prefill logits
// are within 1e-4, on the interpreter, cpu-native, onnxruntime and torch (CPU; one worker serving
// every family in turn, and each row decoded alone gives the same tokens).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { describe, it } from 'vitest';
import { Engine } from './index.js';
import { checkMixedBatch, describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/hf-families/', import.meta.url));
interface FamilyGolden {
  prompt_ids: number[][];
  prompts: Record<string, { greedy_new_ids: number[] }>;
  adapters: Record<string, { prompts: Record<string, { greedy_new_ids: number[] }> }>;
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as { families: string[] } & Record<string, FamilyGolden>;

const executors: [string, () => Promise<Executor> | Executor][] = [
  ['interpreter', () => interpreterExecutor],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 2 })],
  ['onnxruntime', () => createOrtExecutor()],
];

/** Every prompt of `family` with the base and all its adapters as rows of one mixed batch (and, with `alone`, each row by itself on the first prompt). */
async function familyGoldens(family: string, executor: Executor, alone = false): Promise<void> {
  const g = golden[family]!;
  const models = ['base', ...Object.keys(g.adapters)];
  const engine = await Engine.load(`${root}${family}`, { maxLoras: models.length - 1, maxLoraRank: 16, prefillChunk: 16, executor });
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  try {
    for (const a of models.slice(1)) await engine.loadAdapter(`${root}${family}/adapters/${a}`, a);
    for (const [p, ids] of g.prompt_ids.entries()) {
      const prompt = `prompt${String(p)}`;
      const rows = models.map((m) => ({ model: m, ids, logits: `${family}.${m}.${prompt}.logits`, greedy: (m === 'base' ? g.prompts : g.adapters[m]!.prompts)[prompt]!.greedy_new_ids }));
      await checkMixedBatch(engine, f, rows, { alone: alone && p === 0 });
    }
  } finally {
    await f.close();
    engine.dispose();
  }
}

for (const family of golden.families) {
  const adapters = Object.keys(golden[family]!.adapters).length;
  for (const [exName, make] of executors) {
    describe(`engine: ${family} on ${exName}`, () => {
      it(`base and ${String(adapters)} adapters in one mixed batch: last prefill logits within 1e-4, 16 greedy tokens equal transformers'`, async () => {
        await familyGoldens(family, await make());
      }, 240_000);
    });
  }
}

describeWithTorch('engine: every family on one torch executor (CPU, f32)', () => {
  const torch = useCpuTorchExecutor();
  for (const family of golden.families) {
    it(`${family}: base and its adapters mixed: last prefill logits within 1e-4, 16 greedy tokens equal transformers', each row alone the same`, async () => {
      await familyGoldens(family, torch(), true);
    }, 300_000);
  }
});
