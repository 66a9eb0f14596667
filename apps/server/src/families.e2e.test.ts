// The model families of issue 36 through the HTTP server (fixtures/hf-families: transformers 5.17 +
// PEFT 0.21 goldens). One server per family on the cpu-native executor (Qwen3-MoE included, on its
// MoE kernels), adapters loaded from the family's adapters directory at start. Every model (base and
// each adapter) answers /v1/completions on both golden prompts with transformers' 16 greedy tokens —
// all requests in flight together, so the scheduler batches different adapters in one step — and /v1/chat/completions renders the family's chat template as
// apply_chat_template does (prompt tokens counted as transformers tokenized them) and replies with
// its greedy tokens. Prompts of 24 and 81 tokens decode and prefill in the same steps, so a row's
// chunk is padded: Gemma's sliding windows compare key positions, not slots (a regression test).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Executor, createCpuNativeExecutor } from '@stageml/runtime';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/hf-families/', import.meta.url));
interface FamilyGolden {
  prompt_ids: number[][];
  prompts: Record<string, { greedy_new_ids: number[] }>;
  adapters: Record<string, { prompts: Record<string, { greedy_new_ids: number[] }> }>;
  chat: { messages: { role: string; content: string }[]; variables: Record<string, unknown>; input_ids: number[]; greedy_new_ids: number[] }[];
}
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as { families: string[] } & Record<string, FamilyGolden>;

interface Choice {
  token_ids?: number[];
  finish_reason: string;
}
interface Answer {
  choices: Choice[];
  usage: { prompt_tokens: number; completion_tokens: number };
}

for (const family of golden.families) {
  const g = golden[family]!;
  const adapters = Object.keys(g.adapters);
  describe(`${family} through the HTTP server`, () => {
    let server: StageServer;
    let base: string;
    let executor: Executor;
    beforeAll(async () => {
      executor = createCpuNativeExecutor({ threads: 2 });
      server = await createServer({ modelDir: `${root}${family}`, modelName: family, adaptersDir: `${root}${family}/adapters`, executor, maxLoras: adapters.length, maxLoraRank: 16 });
      base = await server.listen('127.0.0.1', 0);
    }, 120_000);
    afterAll(async () => {
      await server.shutdown();
      await executor.dispose();
    });
    const post = async (path: string, body: unknown): Promise<Answer> => {
      const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      const text = await r.text();
      expect(r.status, text).toBe(200);
      return JSON.parse(text) as Answer;
    };

    it(`base and ${adapters.join(', ')}: 16 greedy tokens on both prompts equal transformers' (all requests at once)`, async () => {
      const jobs = ['base', ...adapters].flatMap((m) =>
        g.prompt_ids.map(async (ids, p) => {
          const a = await post('/v1/completions', { model: m === 'base' ? family : m, prompt: ids, max_tokens: 16, temperature: 0, ignore_eos: true, return_token_ids: true });
          const want = (m === 'base' ? g.prompts : g.adapters[m]!.prompts)[`prompt${String(p)}`]!.greedy_new_ids;
          return { m, p, got: a.choices[0]!.token_ids, want };
        }),
      );
      for (const { m, p, got, want } of await Promise.all(jobs)) expect(got, `${m} prompt${String(p)}`).toEqual(want);
    }, 120_000);

    it('chat completions: apply_chat_template + 16 greedy tokens', async () => {
      for (const [i, chat] of g.chat.entries()) {
        const a = await post('/v1/chat/completions', { model: family, messages: chat.messages, chat_template_kwargs: chat.variables, max_tokens: 16, temperature: 0, ignore_eos: true, return_token_ids: true });
        expect(a.usage.prompt_tokens, `chat ${String(i)} prompt tokens`).toBe(chat.input_ids.length);
        expect(a.choices[0]!.token_ids, `chat ${String(i)}`).toEqual(chat.greedy_new_ids);
      }
    }, 120_000);
  });
}
