// The model families of issue 36 (Qwen3, OLMo 2, Phi-3, Gemma 3 text, Gemma 2, Qwen3-MoE) against
// transformers 5.17 + PEFT 0.21 goldens (fixtures/hf-families, written by
// tools/gen_family_fixtures.py): logits within 1e-4 for the base and every adapter, 16 greedy
// tokens equal, the mixed batch equal to PEFT's, and chats equal to apply_chat_template + greedy,
// on the interpreter, cpu-native, onnxruntime and torch (CPU), Qwen3-MoE and CausalLM's mixed-batch
// bank (row gathers) included on each.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { HostTensor } from '@stageml/ir';
import { type Executor, RuntimeCode, RuntimeError, type TorchExecutor, createCpuNativeExecutor, createOrtExecutor, createTorchExecutor, interpreterExecutor, isTorchAvailable } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { describeNeeding } from '@stageml/testkit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CausalLM } from './causal-lm.js';
import { applyChatTemplate } from './chat-template.js';
import { generate } from './generate.js';
import { maxAbsDiff } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/hf-families/', import.meta.url));

interface FamilyGolden {
  prompt_ids: number[][];
  logit_positions: number[][];
  prompts: Record<string, { greedy_new_ids: number[] }>;
  adapters: Record<string, { prompts: Record<string, { greedy_new_ids: number[] }> }>;
  chat: { messages: { role: string; content: string }[]; variables: Record<string, unknown>; text: string; input_ids: number[]; greedy_new_ids: number[] }[];
  mixed?: { adapter_names: string[]; prompt: number };
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as { families: string[] } & Record<string, FamilyGolden>;
const want: Record<string, HostTensor> = {};

beforeAll(async () => {
  const f = await SafetensorsFile.open(`${root}golden.safetensors`);
  for (const k of f.names()) want[k] = await f.readTensor(k);
  await f.close();
});

/** Rows `positions` of logits [1, seq, vocab] as [n, vocab]. */
function rowsAt(logits: HostTensor, positions: readonly number[]): HostTensor {
  const vocab = logits.shape[2]!;
  const data = new Float32Array(positions.length * vocab);
  positions.forEach((p, i) => {
    data.set((logits.data as Float32Array).subarray(p * vocab, (p + 1) * vocab), i * vocab);
  });
  return { dtype: 'f32', shape: [positions.length, vocab], data };
}

const executors: [string, () => Promise<Executor> | Executor, { moe: boolean; bank: boolean }][] = [
  ['interpreter', () => interpreterExecutor, { moe: true, bank: true }],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 2 }), { moe: true, bank: true }],
  ['onnxruntime', () => createOrtExecutor(), { moe: true, bank: true }],
];

/** The tests of one family on one executor (`chats`: also the chat template and its greedy reply). */
function familySuite(family: string, exName: string, make: () => Promise<Executor> | Executor, runs: { moe: boolean; bank: boolean }, chats: boolean): void {
  const g = golden[family]!;
  const adapters = Object.keys(g.adapters);
  describe(`${family} on ${exName} against transformers + PEFT`, () => {
    let lm: CausalLM;
    beforeAll(async () => {
      lm = await CausalLM.load(`${root}${family}`, { executor: await make() });
      for (const a of adapters) await lm.loadAdapter(`${root}${family}/adapters/${a}`, a);
    }, 240_000);

    it(`runs on ${exName}`, () => {
      expect(lm.executorName).toBe(exName);
    });

    for (const model of ['base', ...adapters]) {
      it(`${model}: logits within 1e-4 on both prompts, 16 greedy tokens equal`, async () => {
        const adapter = model === 'base' ? undefined : model;
        for (const [p, ids] of g.prompt_ids.entries()) {
          const { logits } = await lm.forward([ids], { adapters: [adapter] });
          const diff = maxAbsDiff(rowsAt(logits, g.logit_positions[p]!), want[`${family}.${model}.prompt${String(p)}.logits`]!);
          expect(diff, `prompt ${String(p)}`).toBeLessThanOrEqual(1e-4);
          const greedy = (model === 'base' ? g.prompts : g.adapters[model]!.prompts)[`prompt${String(p)}`]!.greedy_new_ids;
          const gen = await generate(lm, ids, { ...(adapter === undefined ? {} : { adapter }), maxNewTokens: 16, stopTokens: [] });
          expect(gen.newIds, `prompt ${String(p)} greedy`).toEqual(greedy);
        }
      }, 120_000);
    }

    if (g.mixed !== undefined && runs.bank) {
      const mixed = g.mixed;
      it(`mixed batch (${mixed.adapter_names.join(', ')}) equals PEFT's and each row alone`, async () => {
        const ids = g.prompt_ids[mixed.prompt]!;
        const { logits } = await lm.forward(mixed.adapter_names.map(() => ids), { adapters: mixed.adapter_names });
        const vocab = logits.shape[2]!;
        const last = new Float32Array(mixed.adapter_names.length * vocab);
        for (let r = 0; r < mixed.adapter_names.length; r++) last.set((logits.data as Float32Array).subarray(((r + 1) * ids.length - 1) * vocab, (r + 1) * ids.length * vocab), r * vocab);
        expect(maxAbsDiff({ dtype: 'f32', shape: [mixed.adapter_names.length, vocab], data: last }, want[`${family}.mixed.last_logits`]!)).toBeLessThanOrEqual(1e-4);
        for (const [r, a] of mixed.adapter_names.entries()) {
          const alone = await lm.forward([ids], { adapters: [a] });
          const row = { dtype: 'f32' as const, shape: [ids.length, vocab], data: (logits.data as Float32Array).slice(r * ids.length * vocab, (r + 1) * ids.length * vocab) };
          expect(maxAbsDiff(row, { ...alone.logits, shape: alone.logits.shape.slice(1) }), `row ${String(r)} (${a})`).toBeLessThanOrEqual(1e-5);
        }
      }, 120_000);
    }

    if (chats) {
      it('renders the chat template as apply_chat_template does, and its greedy reply matches', async () => {
        for (const chat of g.chat) {
          const { text, ids } = applyChatTemplate(lm.tokenizer!, chat.messages, { variables: chat.variables });
          expect(text).toBe(chat.text);
          expect(ids).toEqual(chat.input_ids);
          const gen = await generate(lm, ids, { maxNewTokens: 16, stopTokens: [] });
          expect(gen.newIds).toEqual(chat.greedy_new_ids);
        }
      }, 120_000);
    }
  });
}

for (const family of golden.families) {
  for (const [exName, make, runs] of executors) {
    if (family === 'qwen3_moe' && !runs.moe) continue;
    familySuite(family, exName, make, runs, exName === 'interpreter');
  }
}

// One torch worker (CPU, f32) serves every family in turn: its cache batch re-stages when a family's
// shapes differ.
describeNeeding(
  'families on the torch executor (CPU, f32) against transformers + PEFT',
  isTorchAvailable(),
  () => new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)'),
  () => {
    let executor: TorchExecutor | undefined;
    const torch = async (): Promise<TorchExecutor> => (executor ??= await createTorchExecutor({ device: 'cpu' }));
    afterAll(async () => {
      await executor?.close();
    });
    for (const family of golden.families) familySuite(family, 'torch-cpu', torch, { moe: true, bank: true }, true);
  },
);
