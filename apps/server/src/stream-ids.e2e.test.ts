// A model without a tokenizer streams token ids only: each chosen token must leave as its own
// chunk (regression: the chunks were held until the end, since no text ever arrived to release).
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { createServer } from './app.js';

const base = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/base/', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'stageml-no-tokenizer-'));
for (const f of ['config.json', 'model.safetensors']) copyFileSync(join(base, f), join(dir, f));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe('streaming without a tokenizer', () => {
  it('sends every token id in a chunk of its own as it is chosen', async () => {
    const server = await createServer({ modelDir: dir, modelName: 'bare', padTokenId: 0 });
    const url = await server.listen('127.0.0.1', 0);
    try {
      const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'bare', prompt: [0, 52, 317], max_tokens: 8, temperature: 0, ignore_eos: true, stream: true, return_token_ids: true }) });
      expect(r.status).toBe(200);
      const events = (await r.text()).split('\n\n').filter((e) => e.startsWith('data: {'));
      const perChunk = events.map((e) => ((JSON.parse(e.slice(6)) as { choices: { token_ids?: number[] }[] }).choices[0]?.token_ids ?? []).length).filter((n) => n > 0);
      expect(perChunk).toEqual(new Array<number>(8).fill(1));
    } finally {
      await server.shutdown();
    }
  });
});
