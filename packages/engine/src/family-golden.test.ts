// The engine's slot programs for the model families of issue 36 (fixtures/hf-families, written by
// tools/gen_family_fixtures.py with transformers 5.17 + PEFT 0.21): the base model and every adapter
// decoded together in one mixed batch give transformers' greedy tokens, and the last prefill logits
// are within 1e-4; each model alone gives the golden logits at every recorded position, PEFT's mixed
// batch prefilled in one run gives PEFT's last logits, and (interpreter, torch) chats rendered as
// apply_chat_template give transformers' greedy reply — on the interpreter, cpu-native, onnxruntime
// and torch (CPU; one worker serving every family in turn, and each row decoded alone gives the same
// tokens).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { describe, expect, it } from 'vitest';
import { applyChatTemplate } from '@stageml/models';
import { Engine, generateWithEngine } from './index.js';
import { checkMixedBatch, describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/hf-families/', import.meta.url));
interface FamilyGolden {
  prompt_ids: number[][];
  logit_positions: number[][];
  chat: { messages: { role: string; content: string }[]; variables: Record<string, unknown>; text: string; input_ids: number[]; greedy_new_ids: number[] }[];
  mixed?: { adapter_names: string[]; prompt: number };
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

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/**
 * Each model of `family` alone: the prompt logits at the golden's positions within 1e-4; PEFT's
 * mixed batch prefilled in one run: its last logits within 1e-4; with `chats`, each chat rendered
 * as apply_chat_template did and its 16 greedy tokens equal transformers'.
 */
async function familyAlone(family: string, executor: Executor, chats: boolean): Promise<void> {
  const g = golden[family]!;
  const adapters = Object.keys(g.adapters);
  const engine = await Engine.load(`${root}${family}`, { maxLoras: adapters.length, maxLoraRank: 16, prefillChunk: 64, executor });
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  try {
    for (const a of adapters) await engine.loadAdapter(`${root}${family}/adapters/${a}`, a);
    const V = engine.config.vocabSize;
    for (const m of ['base', ...adapters]) {
      for (const [p, ids] of g.prompt_ids.entries()) {
        const logits = (await engine.promptLogits(m === 'base' ? undefined : m, ids)).data;
        const at = g.logit_positions[p]!.flatMap((i) => Array.from(logits.subarray(i * V, (i + 1) * V)));
        expect(maxAbsDiff(at, (await f.readTensor(`${family}.${m}.prompt${String(p)}.logits`)).data), `${m} prompt ${String(p)}`).toBeLessThanOrEqual(1e-4);
      }
    }
    if (g.mixed !== undefined) {
      const ids = g.prompt_ids[g.mixed.prompt]!;
      const seqs = g.mixed.adapter_names.map((a) => engine.open(a === '__base__' ? undefined : a, ids));
      for (const s of seqs) expect(await engine.attach(s)).toBe(true);
      const last = await engine.prefillMany(seqs, { maxChunk: ids.length });
      for (const s of seqs) engine.release(s);
      const got = last.flatMap((l) => Array.from(l!));
      expect(maxAbsDiff(got, (await f.readTensor(`${family}.mixed.last_logits`)).data), 'mixed batch').toBeLessThanOrEqual(1e-4);
    }
    if (!chats) return;
    for (const chat of g.chat) {
      const { text, ids } = applyChatTemplate(engine.tokenizer!, chat.messages, { variables: chat.variables });
      expect(text).toBe(chat.text);
      expect(ids).toEqual(chat.input_ids);
      expect((await generateWithEngine(engine, ids, { maxNewTokens: 16, stopTokens: [] })).newIds).toEqual(chat.greedy_new_ids);
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
      it(`each model alone: logits at the golden positions within 1e-4; PEFT's mixed batch in one prefill${exName === 'interpreter' ? '; chats as apply_chat_template with its greedy reply' : ''}`, async () => {
        await familyAlone(family, await make(), exName === 'interpreter');
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
    it(`${family}: each model alone at the golden positions, PEFT's mixed batch, chats`, async () => {
      await familyAlone(family, torch(), true);
    }, 300_000);
  }
});
