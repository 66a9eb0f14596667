// `adapterDtype: 'int8'` through the server: the engine's byte gauge counts int8 slot tables, and a
// request on an int8-factor adapter is served.
import { fileURLToPath } from 'node:url';
import { createCpuNativeExecutor } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { createServer } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));

async function bytesOf(adapterDtype: 'f32' | 'int8'): Promise<{ slots: number; slotFactors: number; tokens: number[] }> {
  const server = await createServer({ modelDir: `${root}base`, modelName: 'llama', adaptersDir: `${root}adapters`, executor: createCpuNativeExecutor({ threads: 2 }), maxLoras: 4, maxLoraRank: 16, adapterDtype });
  const base = await server.listen('127.0.0.1', 0);
  try {
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'all-r16', prompt: [1, 52, 317, 335], max_tokens: 4, temperature: 0, return_token_ids: true }) });
    expect(r.status).toBe(200);
    const tokens = ((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids;
    const scraped = await (await fetch(`${base}/metrics`)).text();
    const gauge = (kind: string): number => Number(new RegExp(`stageml_engine_bytes\\{kind="${kind}"\\} (\\S+)`).exec(scraped)?.[1]);
    return { slots: gauge('slots'), slotFactors: gauge('slot_factors'), tokens };
  } finally {
    await server.shutdown();
  }
}

describe('server with int8 adapter factors', () => {
  it('reports int8 slot tables in stageml_engine_bytes (a quarter of f32 plus row scales) and serves the adapter', async () => {
    const f32 = await bytesOf('f32');
    const int8 = await bytesOf('int8');
    expect(int8.tokens).toHaveLength(4);
    expect(int8.slotFactors).toBeGreaterThan(f32.slotFactors / 4);
    expect(int8.slotFactors).toBeLessThan(f32.slotFactors / 3);
    expect(int8.slots).toBeGreaterThan(f32.slots / 4);
    expect(int8.slots).toBeLessThan(f32.slots / 2);
  }, 120_000);
});
