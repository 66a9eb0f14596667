import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Engine, generateWithEngine, writeRandomAdapter } from '@stageml/engine';
import { parseLlamaConfig } from '@stageml/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StageServer, createServer } from './index.js';
import { sleep, slowedInterpreter } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown> & { families: { llama: { adapters: string[] } } };
const ADAPTERS = golden.families.llama.adapters;
const prompt = (model: string, p: number) => (golden[`llama.${model}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
const tmp = mkdtempSync(join(tmpdir(), 'stageml-server-engine-'));
/** The interpreter with a pause before every run (a step lasts long enough to observe). */
const slowed = slowedInterpreter(25);

function body(model: string, p: number, extra: Record<string, unknown> = {}) {
  return { model: model === 'base' ? 'llama' : model, prompt: prompt(model, p).input_ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true, ...extra };
}

describe('server on the engine', () => {
  let server: StageServer;
  let base: string;
  beforeAll(async () => {
    server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adaptersDir: `${root}llama/adapters`, adapterRoots: [`${root}llama/adapters`, tmp], padTokenId: 0, executor: slowed, maxLoras: 4, maxLoraRank: 16 });
    base = await server.listen('127.0.0.1', 0);
  });
  afterAll(async () => {
    await server.shutdown();
    rmSync(tmp, { recursive: true, force: true });
  });

  it('frees the sequences of 6 abandoned requests (plain and SSE) within one step', async () => {
    const models = ['base', ...ADAPTERS.slice(0, 2), ...ADAPTERS.slice(1, 4)];
    const clients = models.map((m, i) => {
      const ac = new AbortController();
      const stream = i >= 3;
      const done = fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body(m, i % 4, { max_tokens: 200, stream })), signal: ac.signal })
        .then(async (r) => {
          if (stream) await r.body!.getReader().read();
          return r;
        });
      done.catch(() => undefined);
      return { ac, done, stream };
    });
    // Every request decodes (the SSE ones have streamed their first event).
    while (server.lm.stats().sequences < 6 || server.scheduler.snapshot().running < 6) await sleep(2);
    for (const c of clients.filter((x) => x.stream)) await c.done;
    await sleep(50);
    const before = server.lm.stats().runs;
    expect(server.lm.memory().kv).toBeGreaterThan(0);
    for (const c of clients) c.ac.abort();
    for (let i = 0; i < 2000 && server.lm.stats().sequences > 0; i++) await sleep(1);
    // One step is a decode run over every row plus at most one prefill chunk: the step in flight
    // when the clients went away finishes, and then their sequences are gone.
    expect(server.lm.stats().runs - before).toBeLessThanOrEqual(2);
    expect(server.scheduler.snapshot().running).toBe(0);
    expect(server.lm.memory().kv).toBe(0);
    await Promise.allSettled(clients.map((c) => c.done));
    // And the server serves on.
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body('qv-r8', 1)) });
    expect(((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids).toEqual(prompt('qv-r8', 1).greedy_new_ids);
  });

  it('serves a whole-tensor-override adapter in batches of its own; every other tenant succeeds', async () => {
    const shape = parseLlamaConfig(readFileSync(`${root}llama/base/config.json`, 'utf8'), 'config.json');
    await writeRandomAdapter(join(tmp, 'head-override'), shape, { rank: 4, targets: ['q_proj'], overrideLmHead: true });
    // Reference: the adapter alone on an engine of its own.
    const lm = await Engine.load(`${root}llama/base`, { maxLoras: 1 });
    await lm.loadAdapter(join(tmp, 'head-override'), 'head-override');
    const alone: Awaited<ReturnType<typeof generateWithEngine>>[] = [];
    for (const p of [0, 1]) alone.push(await generateWithEngine(lm, prompt('base', p).input_ids, { adapter: 'head-override', maxNewTokens: 12, padTokenId: 0, stopTokens: [] }));
    lm.dispose();
    const post = (path: string, b: unknown) => fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(b) });
    const load = await post('/v1/load_lora_adapter', { lora_name: 'head-override', lora_path: join(tmp, 'head-override') });
    expect(load.status).toBe(200);
    const tokensOf = async (r: Response): Promise<number[]> => {
      expect(r.status).toBe(200);
      return ((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids;
    };
    const others = ['base', ...ADAPTERS].flatMap((m) => [0, 1].map(async (p) => {
      expect(await tokensOf(await post('/v1/completions', body(m, p))), `${m} prompt${String(p)}`).toEqual(prompt(m, p).greedy_new_ids);
    }));
    const own = [0, 1].map(async (p) => {
      expect(await tokensOf(await post('/v1/completions', body('base', p, { model: 'head-override' }))), `head-override prompt${String(p)}`).toEqual(alone[p]!.newIds);
    });
    await Promise.all([...others, ...own]);
    expect((await post('/v1/unload_lora_adapter', { lora_name: 'head-override' })).status).toBe(200);
    expect(server.lm.memory().lanes).toBe(0);
  });
});

describe('server on the engine: Mixtral', () => {
  let server: StageServer;
  let base: string;
  beforeAll(async () => {
    server = await createServer({ modelDir: `${root}mixtral/base`, modelName: 'mixtral', adaptersDir: `${root}mixtral/adapters`, padTokenId: 0, maxLoras: 2 });
    base = await server.listen('127.0.0.1', 0);
  });
  afterAll(async () => {
    await server.shutdown();
  });

  it('serves attn-r8, experts-r4 and base requests concurrently, each with its golden tokens', async () => {
    const g = (m: string, p: number) => (golden[`mixtral.${m}`] as Record<string, { input_ids: number[]; greedy_new_ids: number[] }>)[`prompt${String(p)}`]!;
    await Promise.all(['base', 'attn-r8', 'experts-r4'].flatMap((m) => [0, 1, 2, 3].map(async (p) => {
      const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: m === 'base' ? 'mixtral' : m, prompt: g(m, p).input_ids, max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true }) });
      expect(r.status).toBe(200);
      expect(((await r.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids, `${m} prompt${String(p)}`).toEqual(g(m, p).greedy_new_ids);
    })));
    // Expert factors are in slot tables: the slot programs serve all three in shared batches (plus the base program).
    expect(server.lm.stats().preparations).toBe(4);
  });
});

describe('server on the engine: plans', () => {
  it('GET /v1/plan shows the applied plan; re-planned after loading an adapter, every request golden', async () => {
    const server = await createServer({ modelDir: `${root}llama/base`, modelName: 'llama', adapterRoots: [`${root}llama/adapters`], padTokenId: 0, maxLoras: 4, memoryBudget: 1e12 });
    const base = await server.listen('127.0.0.1', 0);
    try {
      const post = (path: string, b: unknown) => fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(b) });
      expect((await post('/v1/load_lora_adapter', { lora_name: 'qv-r8', lora_path: `${root}llama/adapters/qv-r8` })).status).toBe(200);
      const first = await post('/v1/completions', body('qv-r8', 0));
      expect(((await first.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids).toEqual(prompt('qv-r8', 0).greedy_new_ids);
      const plan1 = (await (await fetch(`${base}/v1/plan`)).json()) as { memoryBudget: number; merged: Record<string, string[]>; applied: number; plan: { format: string } };
      expect(plan1.memoryBudget).toBe(1e12);
      expect(plan1.plan.format).toBe('stageml.plan');
      expect(plan1.merged['qv-r8']).toHaveLength(4);
      const running = post('/v1/completions', body('qv-r8', 1, { max_tokens: 40 }));
      expect((await post('/v1/load_lora_adapter', { lora_name: 'o-r2', lora_path: `${root}llama/adapters/o-r2` })).status).toBe(200);
      const other = await post('/v1/completions', body('o-r2', 2));
      expect(((await other.json()) as { choices: { token_ids: number[] }[] }).choices[0]!.token_ids).toEqual(prompt('o-r2', 2).greedy_new_ids);
      const long = (await (await running).json()) as { choices: { token_ids: number[] }[] };
      expect(long.choices[0]!.token_ids.slice(0, 12)).toEqual(prompt('qv-r8', 1).greedy_new_ids);
      const plan2 = (await (await fetch(`${base}/v1/plan`)).json()) as { merged: Record<string, string[]>; applied: number };
      expect(plan2.applied).toBeGreaterThan(plan1.applied);
      // Re-planned when o-r2 arrived (before it had traffic: a zero share gains nothing from a merge).
      expect(plan2.merged['qv-r8']).toHaveLength(4);
      const scraped = await (await fetch(`${base}/metrics`)).text();
      expect(scraped).toContain('stageml_engine_merged_modules{adapter="qv-r8"} 4');
      expect(scraped).toMatch(/stageml_engine_bytes\{kind="weights"\} [1-9]/);
      expect(scraped).toContain('stageml_engine_preparations 4');
      expect(scraped).toMatch(/^stageml_engine_steps [1-9]/m);
      expect(scraped).toMatch(/^stageml_engine_runs [1-9]/m);
    } finally {
      await server.shutdown();
    }
  });
});
