import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { createServer } from './index.js';
import { sleep, slowedInterpreter } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, Record<string, { input_ids: number[] }>>;
/** The interpreter with a pause before every run (a step lasts long enough to observe). */
const slowed = slowedInterpreter(20);

describe('vllm:kv_cache_usage_perc from the engine', () => {
  it('reads the KV bytes live sequences hold ÷ maxBatch × maxModelLen × KV bytes per token, 0 when idle', async () => {
    const server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: `${root}llama/adapters`, padTokenId: 0, executor: slowed, maxBatch: 2, maxModelLen: 64, maxLoras: 4, maxLoraRank: 16 });
    const base = await server.listen('127.0.0.1', 0);
    const usage = async (): Promise<number> => {
      const text = await (await fetch(`${base}/metrics`)).text();
      const m = /^vllm:kv_cache_usage_perc\{model_name="llama"\} (\S+)$/m.exec(text);
      expect(m).not.toBeNull();
      return Number(m![1]);
    };
    try {
      // 2 layers × (keys + values) × 2 KV heads × head dim 16, plus the mask entry, in f32.
      expect(server.lm.kvBytesPerToken).toBe((2 * 2 * 2 * 16 + 1) * 4);
      expect(await usage()).toBe(0);
      const ids = golden['llama.qv-r8']!['prompt0']!.input_ids;
      const running = fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'qv-r8', prompt: ids, max_tokens: 30, temperature: 0, ignore_eos: true }) });
      let seen = 0;
      for (let i = 0; i < 100 && seen === 0; i++) {
        await sleep(20);
        seen = await usage();
      }
      const cap = 2 * 64 * server.lm.kvBytesPerToken;
      // One sequence holds at least its prompt's positions and at most the whole context of one row.
      expect(seen).toBeGreaterThanOrEqual((ids.length * server.lm.kvBytesPerToken) / cap);
      expect(seen).toBeLessThanOrEqual(0.5 + 1e-9);
      expect((await running).status).toBe(200);
      expect(await usage()).toBe(0);
    } finally {
      await server.shutdown();
    }
  }, 60_000);
});
