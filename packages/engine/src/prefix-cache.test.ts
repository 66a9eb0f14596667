import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { seededRandom } from '@stageml/ir';
import { type LlamaShape, argmaxOf } from '@stageml/models';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor } from '@stageml/runtime';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, EngineCode, PrefixCache, SequenceKv, type Sequence, moduleReachesKv, writeRandomAdapter, writeRandomLlama } from './index.js';
import { describeWithTorch, useCpuTorchExecutor } from './test-support.js';

const tmp = mkdtempSync(join(tmpdir(), 'stageml-prefix-'));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
});

const shape: LlamaShape = { vocabSize: 96, hiddenSize: 32, intermediateSize: 64, numLayers: 3, numHeads: 4, numKvHeads: 2 };
const model = join(tmp, 'model');
/** Adapters by name: `kv` reaches every layer's K/V; `last-mlp`, `last-q` and `head` reach none. */
const ADAPTERS = ['kv', 'last-mlp', 'last-q', 'head'] as const;

beforeAll(async () => {
  await writeRandomLlama(model, shape, 3);
  await writeRandomAdapter(join(tmp, 'kv'), shape, { rank: 4, seed: 11 });
  await writeRandomAdapter(join(tmp, 'kv2'), shape, { rank: 4, seed: 12 });
  await writeRandomAdapter(join(tmp, 'last-mlp'), shape, { rank: 4, seed: 13, targets: ['gate_proj', 'up_proj', 'down_proj'], layers: [2] });
  await writeRandomAdapter(join(tmp, 'last-q'), shape, { rank: 4, seed: 14, targets: ['q_proj', 'o_proj'], layers: [2] });
  await writeRandomAdapter(join(tmp, 'head'), shape, { rank: 2, seed: 15, targets: ['down_proj'], layers: [2], overrideLmHead: true });
});

const rand = seededRandom(5);
const tokens = (n: number): number[] => Array.from({ length: n }, () => 3 + Math.floor(rand() * (shape.vocabSize - 3)));
const SYSTEM = tokens(40);
const QUESTIONS = [tokens(7), tokens(9), tokens(5), tokens(12)];
/** A question no other test asks (its prompt's own blocks are cached nowhere). */
const FRESH = tokens(6);

/** Opens, prefills (chunk by chunk) and greedily decodes `n` tokens; returns them and the tokens the prefix cache served. */
async function generate(engine: Engine, adapter: string | undefined, prompt: readonly number[], n = 5): Promise<{ ids: number[]; cached: number; seq: Sequence }> {
  const s = engine.open(adapter, prompt);
  expect(await engine.attach(s)).toBe(true);
  let logits: Float32Array | undefined;
  while (!s.ready) logits = await engine.prefill(s);
  const ids = [argmaxOf(logits!)];
  for (let k = 1; k < n; k++) ids.push(argmaxOf((await engine.decode([s], [ids[ids.length - 1]!]))[0]!));
  engine.release(s);
  return { ids, cached: s.cachedTokens, seq: s };
}

async function loadPair(executor: () => Promise<Executor> | Executor, opts: { kvBudget?: number } = {}): Promise<[Engine, Engine]> {
  const engines: Engine[] = [];
  for (const prefixCaching of [{ blockSize: 8, ...opts }, false] as const) {
    const e = await Engine.load(model, { executor: await executor(), maxLoras: 4, maxLoraRank: 4, prefillChunk: 16, prefixCaching });
    for (const a of ADAPTERS) await e.loadAdapter(join(tmp, a), a);
    engines.push(e);
  }
  return engines as [Engine, Engine];
}

const executors: [string, () => Promise<Executor> | Executor][] = [
  ['interpreter', () => interpreterExecutor],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 1 })],
  ['onnxruntime', () => createOrtExecutor({ intraOpNumThreads: 1 })],
];

describe.each(executors)('prefix caching on %s', (_name, executor) => {
  let cached: Engine;
  let plain: Engine;
  beforeAll(async () => {
    [cached, plain] = await loadPair(executor);
  }, 60_000);
  afterAll(() => {
    cached.dispose();
    plain.dispose();
  });

  it('gives the same greedy tokens as no caching, reusing the shared system prompt per K/V key', async () => {
    const seen = new Set<string>();
    for (const [i, q] of QUESTIONS.entries()) {
      for (const a of [undefined, ...ADAPTERS]) {
        const prompt = [...SYSTEM, ...q];
        const got = await generate(cached, a, prompt);
        const want = await generate(plain, a, prompt);
        expect(got.ids, `${a ?? 'base'} ${String(q.length)}`).toEqual(want.ids);
        expect(want.cached).toBe(0);
        // `kv` has blocks of its own; base and the adapters that reach no K/V share the base's.
        // The same prompt again reuses every whole block short of its last token.
        const key = a === 'kv' ? 'kv' : 'base';
        expect(got.cached, `${a ?? 'base'}: cached tokens`).toBe(seen.has(`${key} ${String(i)}`) ? Math.floor((prompt.length - 1) / 8) * 8 : seen.has(key) ? 40 : 0);
        seen.add(key).add(`${key} ${String(i)}`);
      }
    }
    const st = cached.stats().prefixCache!;
    expect(st.hits).toBeGreaterThan(0);
    expect(st.queries).toBeGreaterThan(st.hits);
  });

  it('serves a prompt that is an exact prefix of a cached one, computing its last token', async () => {
    const long = [...SYSTEM, ...QUESTIONS[0]!];
    await generate(cached, undefined, long);
    for (const n of [8, 16, 17, 24]) {
      const prompt = long.slice(0, n);
      const got = await generate(cached, undefined, prompt);
      expect(got.ids).toEqual((await generate(plain, undefined, prompt)).ids);
      // Whole blocks short of the last prompt token.
      expect(got.cached).toBe(Math.floor((n - 1) / 8) * 8);
    }
  });

  it('shares a live sequence’s blocks with a concurrent one, and batches them together', async () => {
    const a = [...SYSTEM, ...QUESTIONS[1]!, 7];
    const b = [...SYSTEM, ...QUESTIONS[1]!, 9];
    const run = async (engine: Engine): Promise<{ ids: number[][]; cached: number[] }> => {
      const s1 = engine.open('last-mlp', a);
      expect(await engine.attach(s1)).toBe(true);
      let l1: Float32Array | undefined;
      while (!s1.ready) l1 = await engine.prefill(s1);
      // s2 opens while s1 runs (and before anything retains s1's KV).
      const s2 = engine.open(undefined, b);
      expect(await engine.attach(s2)).toBe(true);
      let l2: Float32Array | undefined;
      while (!s2.ready) l2 = await engine.prefill(s2);
      const ids = [[argmaxOf(l1!)], [argmaxOf(l2!)]];
      for (let k = 0; k < 4; k++) (await engine.decode([s1, s2], ids.map((x) => x[x.length - 1]!))).forEach((l, i) => ids[i]!.push(argmaxOf(l)));
      const out = { ids, cached: [s1.cachedTokens, s2.cachedTokens] };
      engine.release(s1);
      engine.release(s2);
      return out;
    };
    const got = await run(cached);
    expect(got.ids).toEqual((await run(plain)).ids);
    expect(got.cached[1]).toBe(Math.floor((b.length - 1) / 8) * 8);
  });

  it('runs a hit’s remaining chunk merged with decode rows in one step', async () => {
    const run = async (engine: Engine): Promise<{ first: number; decoded: number; merged: boolean }> => {
      const d = engine.open(undefined, [...SYSTEM, 5, 6, 7]);
      expect(await engine.attach(d)).toBe(true);
      let l: Float32Array | undefined;
      while (!d.ready) l = await engine.prefill(d);
      const p = engine.open('last-q', [...SYSTEM, ...QUESTIONS[2]!]);
      expect(await engine.attach(p)).toBe(true);
      while (engine.chunkOf(p) < p.prompt.length - p.prefilled) await engine.prefill(p);
      const r = await engine.step({ decode: { seqs: [d], tokens: [argmaxOf(l!)] }, prefill: { seqs: [p] } });
      engine.release(d);
      engine.release(p);
      return { decoded: argmaxOf(r.decode!.values![0] as Float32Array), first: argmaxOf(r.prefill!.values![0] as Float32Array), merged: r.merged };
    };
    const got = await run(cached);
    const want = await run(plain);
    expect([got.decoded, got.first]).toEqual([want.decoded, want.first]);
  });

  it('never reuses KV of an unloaded or reloaded adapter', async () => {
    const prompt = [...SYSTEM, ...FRESH];
    expect((await generate(cached, 'kv', prompt)).cached).toBe(40);
    for (const e of [cached, plain]) {
      e.unloadAdapter('kv');
      await e.loadAdapter(join(tmp, 'kv2'), 'kv');
    }
    const got = await generate(cached, 'kv', prompt);
    expect(got.cached).toBe(0);
    expect(got.ids).toEqual((await generate(plain, 'kv', prompt)).ids);
    // Reloading the first weights again is a new version too.
    for (const e of [cached, plain]) await e.loadAdapter(join(tmp, 'kv'), 'kv');
    const again = await generate(cached, 'kv', prompt);
    expect(again.cached).toBe(0);
    expect(again.ids).toEqual((await generate(plain, 'kv', prompt)).ids);
  });
});

describe('prefix caching across a plan change', () => {
  it('keys an adapter’s blocks by the modules its plan merges', async () => {
    // A memory budget lets the engine plan merges; replanning changes them as traffic shifts.
    const engines: Engine[] = [];
    for (const prefixCaching of [{ blockSize: 8 }, false] as const) {
      const e = await Engine.load(model, { maxLoras: 4, maxLoraRank: 4, prefillChunk: 16, prefixCaching, memoryBudget: 1 << 30, replanEvery: 2 });
      await e.loadAdapter(join(tmp, 'kv'), 'kv');
      engines.push(e);
    }
    const [cached, plain] = engines as [Engine, Engine];
    const prompt = [...SYSTEM, ...QUESTIONS[0]!];
    const before = await generate(cached, 'kv', prompt);
    expect(before.ids).toEqual((await generate(plain, 'kv', prompt)).ids);
    const merged = JSON.stringify(cached.plan().merged);
    const after = await generate(cached, 'kv', prompt);
    expect(after.ids).toEqual((await generate(plain, 'kv', prompt)).ids);
    // The plan applied at the first prefill merged every module of `kv`: blocks computed under it are reused.
    expect(merged).not.toBe('{}');
    expect(JSON.stringify(cached.plan().merged)).toBe(merged);
    expect(after.cached).toBe(40);
    cached.dispose();
    plain.dispose();
  }, 60_000);
});

describe('prefix caching under a tiny KV budget', () => {
  it('evicts retained caches least recently used first and never holds more than the budget', async () => {
    const perSeq = new SequenceKv(shape.numLayers, shape.numKvHeads * (shape.hiddenSize / shape.numHeads), 64).bytes;
    const budget = 2.5 * perSeq;
    const e = await Engine.load(model, { maxLoras: 4, maxLoraRank: 4, prefillChunk: 16, prefixCaching: { blockSize: 8, kvBudget: budget } });
    const prompts = [0, 1, 2, 3].map(() => tokens(40));
    for (const p of prompts) {
      await generate(e, undefined, p);
      const m = e.memory();
      expect(m.kv + m.prefixKv).toBeLessThanOrEqual(budget);
    }
    const st = e.stats().prefixCache!;
    expect(st.evictions).toBeGreaterThan(0);
    // The oldest is gone, the newest is served.
    expect((await generate(e, undefined, prompts[3]!)).cached).toBe(32);
    expect((await generate(e, undefined, prompts[0]!)).cached).toBe(0);
    e.dispose();
  }, 60_000);
});

describe('PrefixCache', () => {
  it('refuses a bad block size or budget with a coded error', () => {
    expect(() => new PrefixCache(0, 1)).toThrow(expect.objectContaining({ code: EngineCode.BAD_OPTIONS }));
    expect(() => new PrefixCache(16, -1)).toThrow(expect.objectContaining({ code: EngineCode.BAD_OPTIONS }));
  });

  it('misses on a different key, and confirms hits token by token', () => {
    const c = new PrefixCache(4, 1 << 20);
    const kv = new SequenceKv(1, 2, 16);
    const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    const mask = prompt.map(() => 1);
    c.track(kv, 'k', prompt, mask);
    kv.append([new Float32Array(18)], [new Float32Array(18)], 0, new Array<number>(9).fill(0));
    c.extend(kv, 'k');
    expect(c.lookup('k', prompt, mask)?.tokens).toBe(8);
    expect(c.lookup('other', prompt, mask)).toBeUndefined();
    expect(c.lookup('k', [1, 2, 3, 9, 5], mask)).toBeUndefined();
    // Padding is part of the key: the same ids with another mask miss.
    expect(c.lookup('k', prompt, [0, ...mask.slice(1)])).toBeUndefined();
  });

  it('retains a finished cache at its filled length, not its grown capacity', () => {
    const c = new PrefixCache(4, 1 << 20);
    const kv = new SequenceKv(1, 2, 16);
    const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    c.track(kv, 'k', prompt, prompt.map(() => 1));
    kv.append([new Float32Array(18)], [new Float32Array(18)], 0, new Array<number>(9).fill(0));
    c.extend(kv, 'k');
    expect(kv.capacity).toBe(16);
    c.retire(kv);
    expect([kv.capacity, c.retainedBytes]).toEqual([9, (2 * 9 * 2 + 9) * 4]);
    // Still served after compaction.
    const into = new SequenceKv(1, 2, 4);
    const hit = c.lookup('k', prompt, prompt.map(() => 1))!;
    into.copyPrefix(hit.from, hit.tokens);
    expect(into.length).toBe(8);
  });
});

describe('PrefixCache with device-resident entries', () => {
  /** A host record without keys and values (resident KV, no host copy) that has run `n` positions of `prompt` under key 'k'. */
  const ran = (c: PrefixCache, prompt: readonly number[], n: number): SequenceKv => {
    const kv = new SequenceKv(1, 2, 16, 'f32', false);
    c.track(kv, 'k', prompt, prompt.map(() => 1));
    kv.append([], [], 0, new Array<number>(n).fill(0));
    c.extend(kv, 'k');
    return kv;
  };

  it('retains a finished cache by its executor id, trimmed to its indexed blocks, and releases it when evicted', () => {
    const released: number[] = [];
    const c = new PrefixCache(4, 1000);
    c.onRelease((id) => released.push(id));
    const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    const kv = ran(c, prompt, 10);
    // Without a device cache a record holding no KV is not retained.
    expect(c.retire(new SequenceKv(1, 2, 16, 'f32', false))).toBeUndefined();
    expect(c.retire(kv, { cache: 7, bytesPerPosition: 20 })).toBe(8);
    expect([c.retainedBytes, c.stats().retained]).toEqual([160, 1]);
    const hit = c.lookup('k', prompt, prompt.map(() => 1))!;
    expect([hit.tokens, hit.cache]).toEqual([8, 7]);
    // Live KV grows past the budget: the retained cache goes, and its executor cache with it.
    c.fit(900);
    expect([c.retainedBytes, c.stats().evictions, released]).toEqual([0, 1, [7]]);
    expect(c.lookup('k', prompt, prompt.map(() => 1))).toBeUndefined();
  });

  it('drops a retained entry whose executor cache is gone (a lookup tries the next), and misses on a live holder that lost it', () => {
    const released: number[] = [];
    const c = new PrefixCache(4, 1 << 20);
    c.onRelease((id) => released.push(id));
    const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    c.retire(ran(c, prompt, 9), { cache: 1, bytesPerPosition: 1 });
    c.retire(ran(c, prompt.slice(0, 5), 5), { cache: 2, bytesPerPosition: 1 });
    // The newest holder of block 0 is cache 2 (4 positions); cache 1 holds both blocks.
    const gone = new Set([1]);
    const hit = c.lookup('k', prompt, prompt.map(() => 1), (h) => h.cache !== undefined && !gone.has(h.cache));
    expect(hit).toMatchObject({ tokens: 4, cache: 2 });
    expect(c.stats().invalidations).toBe(1);
    expect(released).toEqual([1]);
    // prune: every retained entry the executor lost.
    c.prune(() => false);
    expect([c.stats().retained, c.stats().invalidations, released]).toEqual([0, 2, [1, 2]]);
    // A live holder whose cache is unusable is a miss, and stays indexed.
    ran(c, prompt, 9);
    expect(c.lookup('k', prompt, prompt.map(() => 1), () => false)).toBeUndefined();
    expect(c.lookup('k', prompt, prompt.map(() => 1))?.tokens).toBe(8);
  });
});

describe('moduleReachesKv', () => {
  it('says which modules feed some layer’s keys or values', () => {
    const reach = (m: string): boolean => moduleReachesKv(m, 3);
    expect(['lm_head', 'model.norm', 'model.layers.2.mlp.down_proj', 'model.layers.2.self_attn.q_proj', 'model.layers.2.self_attn.o_proj', 'model.layers.2.post_attention_layernorm'].map(reach)).toEqual([false, false, false, false, false, false]);
    expect(['model.embed_tokens', 'model.layers.2.self_attn.k_proj', 'model.layers.2.self_attn.v_proj', 'model.layers.2.input_layernorm', 'model.layers.1.mlp.down_proj', 'model.layers.0.self_attn.q_proj', 'something.else'].map(reach)).toEqual([true, true, true, true, true, true, true]);
  });
});

describeWithTorch('prefix caching on the torch executor (CPU)', () => {
  const torch = useCpuTorchExecutor();
  it('gives the same greedy tokens as no caching, resident KV with a host copy', async () => {
    const engines: Engine[] = [];
    for (const prefixCaching of [{ blockSize: 8 }, false] as const) {
      const e = await Engine.load(model, { executor: torch(), maxLoras: 4, maxLoraRank: 4, prefillChunk: 16, prefixCaching, hostKvCopy: true, deviceWeights: false });
      for (const a of ADAPTERS) await e.loadAdapter(join(tmp, a), a);
      engines.push(e);
    }
    const [cached, plain] = engines as [Engine, Engine];
    for (const q of QUESTIONS.slice(0, 2)) {
      for (const a of [undefined, ...ADAPTERS]) {
        const prompt = [...SYSTEM, ...q];
        expect((await generate(cached, a, prompt)).ids).toEqual((await generate(plain, a, prompt)).ids);
      }
    }
    expect(cached.stats().prefixCache!.hits).toBeGreaterThan(0);
    cached.dispose();
    plain.dispose();
  }, 120_000);
});
