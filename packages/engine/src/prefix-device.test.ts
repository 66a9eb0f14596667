import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { seededRandom } from '@stageml/ir';
import { type LlamaShape, argmaxOf } from '@stageml/models';
import { type TorchExecutor, createTorchExecutor } from '@stageml/runtime';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { Engine, type EngineOptions, writeRandomAdapter, writeRandomLlama } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

// Prefix caching with the KV only on the torch worker (no host copy): retained caches are kept on
// the worker (`CacheStore.keep`) and hits fork them there (`CacheStore.fork`).

const tmp = mkdtempSync(join(tmpdir(), 'stageml-prefix-device-'));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
});

const shape: LlamaShape = { vocabSize: 96, hiddenSize: 32, intermediateSize: 64, numLayers: 3, numHeads: 4, numKvHeads: 2 };
const model = join(tmp, 'model');
/** `kv` reaches every layer's K/V; `last-mlp` reaches none (it shares the base model's blocks). */
const ADAPTERS = ['kv', 'last-mlp'] as const;

beforeAll(async () => {
  await writeRandomLlama(model, shape, 3);
  await writeRandomAdapter(join(tmp, 'kv'), shape, { rank: 4, seed: 11 });
  await writeRandomAdapter(join(tmp, 'last-mlp'), shape, { rank: 4, seed: 13, targets: ['gate_proj', 'up_proj', 'down_proj'], layers: [2] });
});

const rand = seededRandom(7);
const tokens = (n: number): number[] => Array.from({ length: n }, () => 3 + Math.floor(rand() * (shape.vocabSize - 3)));
const SYSTEM = tokens(40);
const QUESTIONS = [tokens(7), tokens(9), tokens(5)];
/** Bytes one position takes on the worker in f32: keys and values of every layer, and its mask entry. */
const PER_POSITION = 2 * shape.numLayers * shape.numKvHeads * (shape.hiddenSize / shape.numHeads) * 4 + 4;

/** Opens, prefills (chunk by chunk) and greedily decodes `n` tokens; returns them and the tokens the prefix cache served. */
async function generate(engine: Engine, adapter: string | undefined, prompt: readonly number[], n = 5): Promise<{ ids: number[]; cached: number }> {
  const s = engine.open(adapter, prompt);
  expect(await engine.attach(s)).toBe(true);
  let logits: Float32Array | undefined;
  while (!s.ready) logits = await engine.prefill(s);
  const ids = [argmaxOf(logits!)];
  for (let k = 1; k < n; k++) ids.push(argmaxOf((await engine.decode([s], [ids[ids.length - 1]!]))[0]!));
  engine.release(s);
  return { ids, cached: s.cachedTokens };
}

async function load(executor: TorchExecutor, prefixCaching: NonNullable<EngineOptions['prefixCaching']>): Promise<Engine> {
  const e = await Engine.load(model, { executor, maxLoras: 4, maxLoraRank: 4, prefillChunk: 16, prefixCaching, deviceWeights: false });
  for (const a of ADAPTERS) await e.loadAdapter(join(tmp, a), a);
  return e;
}

/** The worker's cache count once the release requests sent so far are answered. */
function workerCaches(executor: TorchExecutor): number | undefined {
  return executor.caches.stats!()['caches'];
}

describeWithTorch('prefix caching with the KV only on the torch worker (CPU)', () => {
  const torch = useCpuTorchExecutor();
  let cached: Engine;
  let plain: Engine;
  beforeAll(async () => {
    cached = await load(torch(), { blockSize: 8 });
    plain = await load(torch(), false);
  }, 120_000);
  afterAll(() => {
    cached.dispose();
    plain.dispose();
  });

  it('serves hits with no host copy and gives the same greedy tokens as no caching, base and adapters with and without K/V reach', async () => {
    expect(cached.residentKv).toBe(true);
    expect(cached.prefixCaching).toBe(true);
    const seen = new Set<string>();
    for (const [i, q] of QUESTIONS.entries()) {
      for (const a of [undefined, ...ADAPTERS]) {
        const prompt = [...SYSTEM, ...q];
        const got = await generate(cached, a, prompt);
        expect(got.ids, `${a ?? 'base'} question ${String(i)}`).toEqual((await generate(plain, a, prompt)).ids);
        // `kv` has blocks of its own; the base and `last-mlp` share the base's.
        const key = a === 'kv' ? 'kv' : 'base';
        expect(got.cached, `${a ?? 'base'}: cached tokens`).toBe(seen.has(`${key} ${String(i)}`) ? Math.floor((prompt.length - 1) / 8) * 8 : seen.has(key) ? 40 : 0);
        seen.add(key).add(`${key} ${String(i)}`);
      }
    }
    const st = cached.stats().prefixCache!;
    expect(st.hits).toBeGreaterThan(0);
    expect(st.retained).toBeGreaterThan(0);
    // The host keeps no KV: the retained caches are worker memory, counted at its size per position.
    const m = cached.memory();
    expect(m.kv).toBe(0);
    expect(m.prefixKv % PER_POSITION).toBe(0);
    expect(m.prefixKv).toBeGreaterThan(0);
    expect(m.onDevice).toBeGreaterThanOrEqual(m.prefixKv);
    // Every hit was a fork on the worker: a cache the worker lacked would have been rebuilt.
    expect(cached.stats().cacheRebuilds).toBe(0);
  }, 120_000);

  it('forks a running sequence’s cache for a concurrent one and batches them together', async () => {
    const a = [...SYSTEM, ...QUESTIONS[1]!, 7];
    const b = [...SYSTEM, ...QUESTIONS[1]!, 9, 9, 9, 9, 9, 9, 9, 9];
    const run = async (engine: Engine): Promise<{ ids: number[][]; cached: number }> => {
      const s1 = engine.open('last-mlp', a);
      expect(await engine.attach(s1)).toBe(true);
      let l1: Float32Array | undefined;
      while (!s1.ready) l1 = await engine.prefill(s1);
      const s2 = engine.open(undefined, b);
      expect(await engine.attach(s2)).toBe(true);
      let l2: Float32Array | undefined;
      while (!s2.ready) l2 = await engine.prefill(s2);
      const ids = [[argmaxOf(l1!)], [argmaxOf(l2!)]];
      for (let k = 0; k < 4; k++) (await engine.decode([s1, s2], ids.map((x) => x[x.length - 1]!))).forEach((l, i) => ids[i]!.push(argmaxOf(l)));
      engine.release(s1);
      engine.release(s2);
      return { ids, cached: s2.cachedTokens };
    };
    const got = await run(cached);
    expect(got.ids).toEqual((await run(plain)).ids);
    // s1's 48 prompt positions are cached whole blocks: s2 forks all of them from the running s1.
    expect(got.cached).toBe(48);
  }, 120_000);
});

describeWithTorch('prefix caching on the torch worker under a small KV budget (CPU)', () => {
  const torch = useCpuTorchExecutor();

  it('evicts retained caches on the worker (its cache count returns), never holding more than the budget', async () => {
    // A 40-token prompt and 4 decoded tokens: 43 positions live, 40 retained (5 blocks of 8).
    const budget = Math.floor(2.5 * 44 * PER_POSITION);
    const e = await load(torch(), { blockSize: 8, kvBudget: budget });
    const warm = await generate(e, undefined, tokens(12));
    expect(warm.ids).toHaveLength(5);
    e.setPrefixKvBudget(0);
    await vi.waitFor(() => {
      expect(workerCaches(torch())).toBe(0);
    });
    e.setPrefixKvBudget(budget);
    const prompts = [0, 1, 2, 3].map(() => tokens(40));
    for (const p of prompts) {
      const s = e.open(undefined, p);
      expect(await e.attach(s)).toBe(true);
      while (!s.ready) await e.prefill(s);
      let t = 5;
      for (let k = 0; k < 3; k++) t = argmaxOf((await e.decode([s], [t]))[0]!);
      const live = e.memory();
      expect(live.executorKv + live.prefixKv).toBeLessThanOrEqual(budget);
      e.release(s);
      const m = e.memory();
      expect(m.executorKv + m.prefixKv).toBeLessThanOrEqual(budget);
    }
    const st = e.stats().prefixCache!;
    expect(st.evictions).toBeGreaterThan(0);
    expect(st.retained).toBe(2);
    await vi.waitFor(() => {
      expect(workerCaches(torch())).toBe(2);
    });
    // The newest is served, the oldest is gone.
    expect((await generate(e, undefined, prompts[3]!)).cached).toBe(32);
    expect((await generate(e, undefined, prompts[0]!)).cached).toBe(0);
    // Evicting everything drops every worker cache.
    e.setPrefixKvBudget(0);
    await vi.waitFor(() => {
      expect(workerCaches(torch())).toBe(0);
    });
    expect(e.memory().prefixKv).toBe(0);
    e.dispose();
  }, 120_000);
});

describeWithTorch('prefix caching across a restarted torch worker (CPU)', () => {
  it('never serves a retained prefix the worker lost, rebuilds running sequences, and serves hits again after', async () => {
    const own = await createTorchExecutor({ device: 'cpu' });
    const reference = await createTorchExecutor({ device: 'cpu' });
    try {
      const e = await load(own, { blockSize: 8 });
      const plain = await load(reference, false);
      const prompt = [...SYSTEM, ...QUESTIONS[0]!];
      const want = await generate(plain, 'kv', prompt);
      expect((await generate(e, 'kv', prompt)).ids).toEqual(want.ids);
      // A running sequence across the restart too.
      const live = e.open(undefined, [...SYSTEM, ...QUESTIONS[2]!]);
      expect(await e.attach(live)).toBe(true);
      let l: Float32Array | undefined;
      while (!live.ready) l = await e.prefill(live);
      process.kill(own.pid!, 'SIGKILL');
      await vi.waitFor(() => {
        expect(own.pid).toBeUndefined();
      });
      // The retained `kv` prefix is gone with the worker: not served, and the tokens are right.
      const after = await generate(e, 'kv', prompt);
      expect(after.ids).toEqual(want.ids);
      expect(after.cached).toBe(0);
      expect(own.traffic().restarts).toBe(1);
      expect(e.stats().prefixCache!.invalidations).toBeGreaterThan(0);
      // The running sequence is rebuilt at its next step and decodes as it would have.
      const t0 = argmaxOf(l!);
      const got = [t0, argmaxOf((await e.decode([live], [t0]))[0]!)];
      expect(e.stats().cacheRebuilds).toBe(1);
      const ref = plain.open(undefined, [...SYSTEM, ...QUESTIONS[2]!]);
      expect(await plain.attach(ref)).toBe(true);
      let r: Float32Array | undefined;
      while (!ref.ready) r = await plain.prefill(ref);
      expect(got).toEqual([argmaxOf(r!), argmaxOf((await plain.decode([ref], [argmaxOf(r!)]))[0]!)]);
      plain.release(ref);
      // The rebuilt sequence's cache serves a concurrent sequence again (a fork of the new worker's cache).
      const next = await generate(e, undefined, [...SYSTEM, ...QUESTIONS[1]!]);
      expect(next.cached).toBe(40);
      expect(next.ids).toEqual((await generate(plain, undefined, [...SYSTEM, ...QUESTIONS[1]!])).ids);
      e.release(live);
      // And a retained cache of the new worker is served.
      expect((await generate(e, 'kv', prompt)).cached).toBe(40);
      e.dispose();
      plain.dispose();
    } finally {
      await own.close();
      await reference.close();
    }
  }, 180_000);
});
