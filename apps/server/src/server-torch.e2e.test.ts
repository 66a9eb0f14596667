// The reference server on the torch executor (CPU torch here and in CI): the golden greedy tokens
// of every adapter, alone and under a concurrent mixed load. CI must run it (Debian's
// python3-torch); elsewhere it is skipped when Python 3 with torch is missing.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { RuntimeCode, RuntimeError, type TorchExecutor, createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type StageServer, createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown> & { families: { llama: { adapters: string[] } } };
const ADAPTERS = golden.families.llama.adapters;
const prompt = (model: string, p: number) => (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
const available = isTorchAvailable();

async function completion(base: string, model: string, p: number): Promise<{ status: number; ids: number[] }> {
  const body = { model: model === 'base' ? 'llama' : model, prompt: prompt(model, p).input_ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true };
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const json = (await r.json()) as { choices: { token_ids: number[] }[] };
  return { status: r.status, ids: json.choices[0]!.token_ids };
}

if (!available && process.env['CI'] !== undefined) {
  describe('reference server on the torch executor', () => {
    it('needs Python 3 with torch', () => {
      throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch');
    });
  });
} else {
  describe.skipIf(!available)('reference server on the torch executor', () => {
    let executor: TorchExecutor;
    let server: StageServer;
    let base: string;
    beforeAll(async () => {
      executor = await createTorchExecutor({ device: 'cpu' });
      server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: `${root}llama/adapters`, padTokenId: 0, maxBatch: 8, executor });
      base = await server.listen('127.0.0.1', 0);
    }, 120_000);
    afterAll(async () => {
      await server.shutdown();
      await executor.close();
    });

    it('returns the golden greedy tokens for every adapter, alone and as a concurrent mixed load', async () => {
      for (const model of ['base', ...ADAPTERS]) {
        const r = await completion(base, model, 0);
        expect(r.status).toBe(200);
        expect(r.ids, model).toEqual(prompt(model, 0).greedy_new_ids);
      }
      const jobs = ['base', ...ADAPTERS].flatMap((model) => [1, 2, 3].map(async (p) => {
        const r = await completion(base, model, p);
        expect(r.ids, `${model} prompt${String(p)}`).toEqual(prompt(model, p).greedy_new_ids);
      }));
      await Promise.all(jobs);
    }, 180_000);

    it('keeps the KV on the worker only, and a killed worker costs no request: its caches are rebuilt from the tokens', async () => {
      expect(server.lm.residentKv).toBe(true);
      const killed = completion(base, ADAPTERS[0]!, 1);
      // Killed once that request decodes (two positions past its prompt): it still gets its golden tokens.
      const c = server.lm.config;
      const perPosition = 2 * c.numLayers * c.numKvHeads * c.headDim * (server.lm.dtype === 'f32' ? 4 : 2) + 4;
      const decoding = (prompt(ADAPTERS[0]!, 1).input_ids.length + 2) * perPosition;
      for (let i = 0; i < 2000 && server.lm.memory().executorKv < decoding; i++) await new Promise((r) => setTimeout(r, 1));
      process.kill(executor.pid!, 'SIGKILL');
      const r = await killed;
      expect(r.status).toBe(200);
      expect(r.ids).toEqual(prompt(ADAPTERS[0]!, 1).greedy_new_ids);
      expect(executor.traffic().restarts).toBeGreaterThanOrEqual(1);
      const text = await (await fetch(`${base}/metrics`)).text();
      expect(text).toMatch(/^stageml_engine_cache_rebuilds [1-9]/m);
      expect(text).toMatch(/^vllm:kv_cache_usage_perc\{model_name="llama"\} 0$/m);
    }, 120_000);

    it('draws sampled tokens on the worker with executorPicks (one id per row back), penalties and bias included, the tokens of host picks for the same seeds', async () => {
      const picking = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: `${root}llama/adapters`, padTokenId: 0, maxBatch: 8, executor, executorPicks: true });
      try {
        const other = await picking.listen('127.0.0.1', 0);
        const sampleSpy = vi.spyOn(picking.lm, 'decodeSample');
        const sampled = async (url: string, model: string, p: number, seed: number): Promise<number[]> => {
          // Odd seeds with penalties and a bias (processed on the worker too).
          const penalties = seed % 2 === 1 ? { presence_penalty: 0.6, frequency_penalty: 0.3, repetition_penalty: 1.2, logit_bias: { '5': 3 } } : {};
          const body = { model: model === 'base' ? 'llama' : model, prompt: prompt(model, p).input_ids, max_tokens: 12, temperature: 0.9, top_p: 0.9, top_k: 40, seed, ignore_eos: true, return_token_ids: true, ...penalties };
          const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
          expect(r.status).toBe(200);
          return ((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids;
        };
        const cases = ['base', ...ADAPTERS].map((model, i) => [model, i % 4, 100 + i] as const);
        // On the CPU the default picks on the host: the first server is the reference.
        expect(server.lm.executorName).toBe('torch-cpu');
        const want = await Promise.all(cases.map(([m, p, seed]) => sampled(base, m, p, seed)));
        const got = await Promise.all(cases.map(([m, p, seed]) => sampled(other, m, p, seed)));
        expect(got).toEqual(want);
        expect(want.some((ids, i) => JSON.stringify(ids) !== JSON.stringify(prompt(cases[i]![0], cases[i]![1]).greedy_new_ids))).toBe(true);
        expect(sampleSpy).toHaveBeenCalled();
        sampleSpy.mockRestore();
      } finally {
        await picking.shutdown();
      }
    }, 180_000);
  });
}
