import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Engine, writeRandomAdapter } from '@stageml/engine';
import { seededRandom } from '@stageml/ir';
import { parseLlamaConfig } from '@stageml/models';
import { afterAll, describe, expect, it } from 'vitest';
import { type GenerationResult, Scheduler } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'stageml-churn-'));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
});

describe('Engine under adapter churn', () => {
  it('loads and unloads 200 adapters in random order while serving; executor-held bytes return to the start', async () => {
    const shape = parseLlamaConfig(readFileSync(`${root}base/config.json`, 'utf8'), 'config.json');
    const rand = seededRandom(200);
    const names: string[] = [];
    for (let i = 0; i < 200; i++) {
      const name = `c${String(i)}`;
      await writeRandomAdapter(join(tmp, name), shape, { rank: 4 + Math.floor(rand() * 13), targets: ['q_proj', 'v_proj', 'down_proj'], seed: i });
      names.push(name);
    }
    const engine = await Engine.load(`${root}base`, { maxLoras: 6, maxLoraRank: 16, maxCpuLoras: 4 });
    const start = engine.memory();
    const scheduler = new Scheduler(engine, { maxBatch: 8 });
    const loaded = new Set<string>();
    const inFlight = new Map<string, number>();
    const served: Promise<GenerationResult>[] = [];
    const order = [...names].sort(() => rand() - 0.5);
    let failures = 0;
    for (const name of order) {
      await engine.loadAdapter(join(tmp, name), name);
      loaded.add(name);
      // Serve requests on a few loaded adapters (and the base model) while adapters come and go.
      for (let k = 0; k < 2; k++) {
        const pick = rand() < 0.2 ? undefined : [...loaded][Math.floor(rand() * loaded.size)];
        if (pick !== undefined) inFlight.set(pick, (inFlight.get(pick) ?? 0) + 1);
        const p = scheduler.submit({ tenant: 't', adapter: pick, prompt: [1, 5 + k, 9, 44], maxNewTokens: 3, sampling: { greedy: true }, stopTokens: [] });
        served.push(p.finally(() => {
          if (pick !== undefined) inFlight.set(pick, inFlight.get(pick)! - 1);
        }).catch((e: unknown) => {
          failures++;
          throw e;
        }));
      }
      // Unload a random idle adapter about as often as one is loaded.
      const idle = [...loaded].filter((n) => (inFlight.get(n) ?? 0) === 0);
      if (idle.length > 0 && rand() < 0.9) {
        const victim = idle[Math.floor(rand() * idle.length)]!;
        expect(engine.unloadAdapter(victim)).toBe(true);
        loaded.delete(victim);
      }
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    const results = await Promise.all(served);
    expect(failures).toBe(0);
    expect(results.every((r) => r.newIds.length === 3)).toBe(true);
    await scheduler.drain();
    // While adapters are loaded, at most maxLoras of them are resident in slots.
    expect(engine.stats().residentAdapters).toBeLessThanOrEqual(6);
    // Resident factors are counted unpadded (rank r of each adapter, not the slot rank 16).
    const perRank = shape.numLayers * (2 * shape.hiddenSize + (shape.hiddenSize + shape.numKvHeads * shape.headDim) + (shape.intermediateSize + shape.hiddenSize)) * 4;
    const mid = engine.memory().slotFactors;
    expect(mid).toBeGreaterThan(0);
    expect(mid % perRank).toBe(0);
    expect(mid).toBeLessThan(engine.stats().residentAdapters * 16 * perRank);
    for (const n of [...loaded]) engine.unloadAdapter(n);
    const end = engine.memory();
    expect(engine.stats()).toMatchObject({ preparations: 4, residentAdapters: 0, sequences: 0, freeSlots: 6 });
    // Weights and slot tables are allocated once; KV buffers are freed with their sequences; the
    // staging buffers are reused.
    expect(end.weights).toBe(start.weights);
    expect(end.slots).toBe(start.slots);
    expect(end.kv).toBe(0);
    expect(end.slotFactors).toBe(0);
    // Decode staging: maxBatch rows × one 64-position block (kept across steps); prefill staging and
    // the masks: rows × the longest context, grown by doubling.
    const width = shape.numKvHeads * shape.headDim;
    expect(end.staging).toBeLessThanOrEqual((2 * shape.numLayers * 8 * 64 * width + (2 * shape.numLayers * 8 * 8 * width + 8 * 65) * 2) * 4);
    expect(end.total - end.staging).toBe(start.total);
    expect(engine.slotsAreClear()).toBe(true);
  }, 300_000);
});

describe('Chunked prefill', () => {
  it('a long prompt arriving is prefilled one chunk per step while running streams keep decoding', async () => {
    const engine = await Engine.load(`${root}base`, { prefillChunk: 4 });
    const scheduler = new Scheduler(engine);
    const events: string[] = [];
    const running = scheduler.submit({ tenant: 'a', adapter: undefined, prompt: [1, 5, 9], maxNewTokens: 30, sampling: { greedy: true }, stopTokens: [], onToken: () => events.push('a') });
    while (events.length < 2) await new Promise((r) => setTimeout(r, 1));
    const runs0 = engine.stats().runs;
    const long = Array.from({ length: 40 }, (_, i) => 3 + ((i * 37) % 500));
    const arriving = scheduler.submit({ tenant: 'b', adapter: undefined, prompt: long, maxNewTokens: 1, sampling: { greedy: true }, stopTokens: [], onToken: () => events.push('b') });
    await Promise.all([running, arriving]);
    // 40 tokens in chunks of 4 take 10 steps; the running stream got a token in every one of them.
    const before = events.slice(0, events.indexOf('b'));
    expect(before.filter((e) => e === 'a').length).toBeGreaterThanOrEqual(2 + 10);
    // Each of those steps was one decode run plus one prefill chunk, never a whole-prompt run.
    expect(engine.stats().runs - runs0).toBeGreaterThanOrEqual(10 + 10);
  });
});

describe('Batched prefill', () => {
  it('a burst of arrivals is prefilled together, within the step budget, each with the tokens it gets alone', async () => {
    const engine = await Engine.load(`${root}base`, { prefillChunk: 4 });
    const prompts = Array.from({ length: 6 }, (_, i) => [1, 5 + i, 9, 44 + i]);
    const alone = new Scheduler(engine);
    const want: number[][] = [];
    for (const prompt of prompts) want.push((await alone.submit({ tenant: 't', adapter: undefined, prompt, maxNewTokens: 3, sampling: { greedy: true }, stopTokens: [] })).newIds);
    await alone.drain();
    // Six 4-token prompts under a budget of 8 tokens per step: at most two prefilled per run.
    const scheduler = new Scheduler(engine, { prefillTokens: 8, idlePrefillTokens: 8 });
    const prefills: number[] = [];
    // Plain greedy requests have their first tokens picked by the prefill run (prefillSample).
    const picking = engine.prefillSample.bind(engine);
    (engine as { prefillSample: typeof engine.prefillSample }).prefillSample = (seqs, rows, opts) => {
      prefills.push(seqs.length);
      return picking(seqs, rows, opts);
    };
    const got = await Promise.all(prompts.map((prompt) => scheduler.submit({ tenant: 't', adapter: undefined, prompt, maxNewTokens: 3, sampling: { greedy: true }, stopTokens: [] })));
    expect(got.map((r) => r.newIds)).toEqual(want);
    // Arrivals attach asynchronously, so the first step may start with fewer; never above the budget.
    expect(prefills.reduce((a, n) => a + n, 0)).toBe(6);
    expect(Math.max(...prefills)).toBe(2);
    expect(prefills.length).toBeLessThanOrEqual(4);
    expect(() => new Scheduler(engine, { prefillTokens: 0 })).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }) as Error);
    expect(() => new Scheduler(engine, { idlePrefillTokens: 1.5 })).toThrow(expect.objectContaining({ code: 'ROUTER_BAD_CONFIG' }) as Error);
  });

  it('with nothing decoding, a long prompt is prefilled in one run (up to idlePrefillTokens), with the tokens chunked prefill gives', async () => {
    const engine = await Engine.load(`${root}base`, { prefillChunk: 4 });
    const long = Array.from({ length: 40 }, (_, i) => 3 + ((i * 37) % 500));
    const chunked = new Scheduler(engine, { idlePrefillTokens: 4 });
    const want = await chunked.submit({ tenant: 't', adapter: undefined, prompt: long, maxNewTokens: 4, sampling: { greedy: true }, stopTokens: [] });
    const runs0 = engine.stats().runs;
    const got = await new Scheduler(engine).submit({ tenant: 't', adapter: undefined, prompt: long, maxNewTokens: 4, sampling: { greedy: true }, stopTokens: [] });
    expect(got.newIds).toEqual(want.newIds);
    // One prefill run (40 ≤ 512 tokens) and three decode steps.
    expect(engine.stats().runs - runs0).toBe(1 + 3);
  });
});
