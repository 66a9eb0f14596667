// KV resident on the torch worker (`EngineOptions.residentKv`, `Executor.caches`): the same tokens
// as the engine feeding the KV from the host, O(new tokens) bytes per decode step whatever the
// context, and a killed worker replaced without losing a sequence.
import { fileURLToPath } from 'node:url';
import { argmaxOf } from '@stageml/models';
import { RuntimeCode, type TorchExecutor, createTorchExecutor } from '@stageml/runtime';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type EngineOptions, Engine, EngineCode, type Sequence } from './index.js';
import { describeWithTorch } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));

async function load(opts: EngineOptions): Promise<Engine> {
  const e = await Engine.load(`${root}base`, { maxLoras: 4, maxLoraRank: 16, ...opts });
  await e.loadAdapter(`${root}adapters/all-r16`, 'a');
  await e.loadAdapter(`${root}adapters/qv-r8`, 'b');
  return e;
}

const PROMPTS: [string | undefined, number[]][] = [
  ['a', [1, 52, 317, 335, 262, 438, 309, 487]],
  ['b', [1, 54, 264, 479, 455]],
  [undefined, [1, 500, 72, 283, 10, 90, 11, 4, 77, 21, 5]],
];

/**
 * A script over one engine: chunked mixed prefill (two adapters and the base), decode steps, a
 * release in the middle of the batch, a new sequence reusing the freed place, more steps; after
 * step `kill` (if given) `between()` runs. Returns every row's greedy tokens.
 */
async function script(e: Engine, between?: { after: number; run: () => Promise<void> }, greedy = false): Promise<number[][]> {
  const seqs: Sequence[] = PROMPTS.map(([a, p]) => e.open(a, p));
  for (const s of seqs) expect(await e.attach(s)).toBe(true);
  const tokens = new Map<Sequence, number[]>(seqs.map((s) => [s, []]));
  const last = new Map<Sequence, Float32Array>();
  const prefill = async (group: Sequence[]): Promise<void> => {
    while (group.some((s) => !s.ready)) {
      const todo = group.filter((s) => !s.ready);
      (await e.prefillMany(todo, { maxChunk: 3 })).forEach((l, i) => {
        if (l !== undefined) last.set(todo[i]!, Float32Array.from(l));
      });
    }
  };
  await prefill(seqs);
  let live = [...seqs];
  let step = 0;
  const picked = new Map<Sequence, number>();
  const decode = async (n: number): Promise<void> => {
    for (let i = 0; i < n; i++, step++) {
      const next = live.map((s) => picked.get(s) ?? argmaxOf(last.get(s)!));
      live.forEach((s, r) => tokens.get(s)!.push(next[r]!));
      if (greedy) {
        // The step's picks made by the engine (on the worker), fed to the next step.
        const ids = await e.decodeGreedy(live, next);
        live.forEach((s, r) => picked.set(s, ids[r]!));
      } else {
        const out = await e.decode(live, next);
        live.forEach((s, r) => last.set(s, Float32Array.from(out[r]!)));
      }
      if (between?.after === step) await between.run();
    }
  };
  await decode(3);
  // Release the middle row; a new sequence takes its place (and the executor a fresh cache).
  e.release(live[1]!);
  live = [live[0]!, live[2]!];
  const fresh = e.open('b', [1, 7, 8, 9, 10, 11, 12]);
  expect(await e.attach(fresh)).toBe(true);
  tokens.set(fresh, []);
  await prefill([fresh]);
  live.push(fresh);
  await decode(4);
  const out = [...tokens.values()];
  for (const s of live) e.release(s);
  return out;
}

describeWithTorch('resident KV on the torch worker (CPU torch)', () => {
  let executor: TorchExecutor;
  beforeAll(async () => {
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor.close();
  });

  it('gives the host-fed path\'s tokens over prefill, decode, release and reuse, mixed batches, in f32 and bf16', async () => {
    for (const dtype of ['f32', 'bf16'] as const) {
      const host = await load({ executor, dtype, residentKv: false });
      const resident = await load({ executor, dtype });
      try {
        expect(host.residentKv).toBe(false);
        expect(resident.residentKv).toBe(true);
        const want = await script(host);
        expect(await script(resident)).toEqual(want);
        // Prompt logits (the scoring program) take no cache: the same on both.
        const scored = await resident.promptLogits('a', PROMPTS[0]![1]);
        expect(Array.from(scored.data)).toEqual(Array.from((await host.promptLogits('a', PROMPTS[0]![1])).data));
        expect(resident.memory().executorKv).toBe(0); // every sequence released
      } finally {
        host.dispose();
        resident.dispose();
      }
    }
  }, 120_000);

  it('picks greedy tokens on the worker (decodeGreedy): the tokens of argmaxOf over the logits, one id per row in the reply', async () => {
    for (const dtype of ['f32', 'bf16'] as const) {
      const host = await load({ executor, dtype, residentKv: false });
      const resident = await load({ executor, dtype });
      try {
        const want = await script(host);
        expect(await script(resident, undefined, true)).toEqual(want);
        // Without resident caches the worker picks them as well.
        expect(await script(host, undefined, true)).toEqual(want);
        // A decode step's reply: the logits (rows × vocabulary f32) less one i64 per row.
        const seqs = [resident.open('a', PROMPTS[0]![1]), resident.open(undefined, PROMPTS[2]![1])];
        for (const q of seqs) await resident.attach(q);
        while (seqs.some((q) => !q.ready)) await resident.prefillMany(seqs.filter((q) => !q.ready));
        const received = async (f: () => Promise<unknown>): Promise<number> => {
          const before = executor.traffic().receivedBytes;
          await f();
          return executor.traffic().receivedBytes - before;
        };
        const full = await received(() => resident.decode(seqs, [5, 6]));
        const picks = await received(() => resident.decodeGreedy(seqs, [7, 8]));
        expect(full - picks).toBeGreaterThanOrEqual(2 * resident.config.vocabSize * 4 - 2 * 8 - 64);
        for (const q of seqs) resident.release(q);
      } finally {
        host.dispose();
        resident.dispose();
      }
    }
  }, 120_000);

  it('replays decode steps as CUDA graphs (emulated on the CPU: STAGEML_TORCH_GRAPHS=emulate) with the host-fed path\'s tokens', async () => {
    const lines: string[] = [];
    const graphs = await createTorchExecutor({ device: 'cpu', env: { STAGEML_TORCH_GRAPHS: 'emulate' }, log: (l) => lines.push(l) });
    try {
      for (const dtype of ['f32', 'bf16'] as const) {
        const host = await load({ executor, dtype, residentKv: false });
        const graphed = await load({ executor: graphs, dtype });
        try {
          // Three rows decode three steps (eager, captured, replayed), a release re-stages the
          // batch (a new key: eager, captured, replayed twice), at the staged capacity throughout.
          const want = await script(host);
          expect(await script(graphed)).toEqual(want);
          // Greedy picks on replayed graphs: the argmax must not replace the graph's own logits.
          expect(await script(graphed, undefined, true)).toEqual(want);
        } finally {
          host.dispose();
          graphed.dispose();
        }
      }
      expect(lines.filter((l) => l.includes('replay CUDA graphs (emulated)')).length).toBeGreaterThanOrEqual(2);
      expect(lines.filter((l) => l.includes('capture failed'))).toEqual([]);
    } finally {
      await graphs.close();
    }
  }, 120_000);

  it('sends the same tensor bytes per decode step at any context length (O(new tokens)); the host-fed path sends the context', async () => {
    const perStep = async (e: Engine, context: number): Promise<{ bytes: number; tensorBytes: number }> => {
      const prompt = [1, ...Array.from({ length: context - 1 }, (_, i) => 3 + ((i * 37) % 400))];
      const seqs = [e.open('a', prompt), e.open(undefined, prompt)];
      for (const s of seqs) await e.attach(s);
      while (seqs.some((s) => !s.ready)) await e.prefillMany(seqs.filter((s) => !s.ready), { maxChunk: 64 });
      await e.decode(seqs, [5, 6]);
      const before = executor.traffic();
      await e.decode(seqs, [7, 8]);
      const after = executor.traffic();
      for (const s of seqs) e.release(s);
      return { bytes: after.sentBytes - before.sentBytes, tensorBytes: after.sentTensorBytes - before.sentTensorBytes };
    };
    const resident = await load({ executor });
    const host = await load({ executor, residentKv: false });
    try {
      const short = await perStep(resident, 8);
      const long = await perStep(resident, 160);
      expect(long.tensorBytes).toBe(short.tensorBytes);
      // The header differs only by the digits of request and cache ids.
      expect(Math.abs(long.bytes - short.bytes)).toBeLessThan(16);
      // Two rows: ids, positions (i64) and the new key's mask (f32) in tensors: 2 · (8 + 8 + 4) bytes, plus the slot ids.
      expect(short.tensorBytes).toBeLessThan(200);
      const hostShort = await perStep(host, 8);
      const hostLong = await perStep(host, 160);
      // Keys and values of 2 layers × 2 kv heads × 16 dims, f32, per row and staged position (the
      // staging rounds to 64 positions: 64 at context 9, 192 at 161).
      expect(hostLong.tensorBytes - hostShort.tensorBytes).toBeGreaterThanOrEqual(2 * 128 * 2 * 2 * 2 * 16 * 4);
    } finally {
      resident.dispose();
      host.dispose();
    }
  }, 120_000);

  it('survives a killed worker: the next step starts a new worker, rebuilds every cache from the sequences\' tokens (or restores the host copy, hostKvCopy) and gives the same tokens', async () => {
    const reference = await load({ executor, residentKv: false });
    const want = await script(reference);
    reference.dispose();
    for (const hostKvCopy of [false, true]) {
      const own = await createTorchExecutor({ device: 'cpu' });
      try {
        const e = await load({ executor: own, hostKvCopy });
        const got = await script(e, {
          after: 1,
          run: async () => {
            const pid = own.pid!;
            process.kill(pid, 'SIGKILL');
            for (let i = 0; i < 200 && own.pid !== undefined; i++) await new Promise((r) => setTimeout(r, 10));
            expect(own.pid).toBeUndefined();
          },
        });
        expect(got).toEqual(want);
        expect(own.traffic().restarts).toBe(1);
        expect(own.pid).toBeDefined();
        // The three live sequences were rebuilt at the step after the kill (none with the host copy).
        expect(e.stats().cacheRebuilds).toBe(hostKvCopy ? 0 : 3);
        // A step in flight when the worker dies fails with RT_WORKER_FAILED and changes nothing: the next one succeeds.
        const seq = e.open('a', PROMPTS[0]![1]);
        await e.attach(seq);
        const first = (await e.prefill(seq, { maxChunk: 64 }))!;
        const t = argmaxOf(first);
        const length = seq.kv.length;
        const dying = e.decode([seq], [t]);
        process.kill(own.pid!, 'SIGKILL');
        const outcome = await dying.then(() => 'ok', (err: unknown) => (err as { code?: string }).code);
        expect(['ok', RuntimeCode.WORKER_FAILED]).toContain(outcome);
        if (outcome !== 'ok') {
          expect(seq.kv.length).toBe(length);
          await e.decode([seq], [t]);
        }
        expect(seq.kv.length).toBe(length + 1);
        // And the rebuilt cache reads as the lost one did: the next step's logits are the host-fed engine's.
        const next = await e.decode([seq], [5]);
        const host = await load({ executor, residentKv: false });
        const h = host.open('a', PROMPTS[0]![1]);
        await host.attach(h);
        await host.prefill(h, { maxChunk: 64 });
        await host.decode([h], [t]);
        const hostNext = await host.decode([h], [5]);
        expect(argmaxOf(next[0]!)).toBe(argmaxOf(hostNext[0]!));
        for (let i = 0; i < next[0]!.length; i++) expect(next[0]![i]).toBeCloseTo(hostNext[0]![i]!, 4);
        host.dispose();
        e.release(seq);
        e.dispose();
      } finally {
        await own.close();
      }
    }
  }, 180_000);

  it('keeps no host copy of the keys and values by default: the steps leave them on the worker (RunOptions.omit); hostKvCopy keeps and receives them', async () => {
    const lean = await load({ executor });
    const copy = await load({ executor, hostKvCopy: true });
    try {
      const received = async (e: Engine): Promise<{ bytes: number; seq: Sequence[] }> => {
        const seqs = [e.open('a', PROMPTS[0]![1]), e.open(undefined, PROMPTS[2]![1])];
        for (const q of seqs) await e.attach(q);
        while (seqs.some((q) => !q.ready)) await e.prefillMany(seqs.filter((q) => !q.ready));
        await e.decodeGreedy(seqs, [5, 6]);
        const before = executor.traffic().receivedBytes;
        await e.decodeGreedy(seqs, [7, 8]);
        return { bytes: executor.traffic().receivedBytes - before, seq: seqs };
      };
      const a = await received(lean);
      const b = await received(copy);
      // Two rows × 2 layers × keys and values × 2 kv heads × 16 dims, f32: what the copy also receives.
      expect(b.bytes - a.bytes).toBeGreaterThanOrEqual(2 * 2 * 2 * 32 * 4);
      // The lean reply: a header (the worker's ~30 counters included, ~540 bytes) and one i64 per
      // row — no KV (which alone would be 1,024 bytes more).
      expect(a.bytes).toBeLessThan(768);
      const [q] = a.seq;
      expect(q!.kv.holdsKv).toBe(false);
      expect(q!.kv.bytes).toBe(q!.kv.capacity * 4);
      expect(() => q!.kv.view(0, [2, 16])).toThrow(expect.objectContaining({ code: EngineCode.BAD_SEQUENCE }) as Error);
      expect(b.seq[0]!.kv.bytes).toBeGreaterThan(2 * 2 * q!.kv.capacity * 32 * 4);
      expect(lean.memory().kv).toBeLessThan(copy.memory().kv);
      for (const x of [...a.seq]) lean.release(x);
      for (const x of [...b.seq]) copy.release(x);
      await expect(Engine.load(`${root}base`, { executor, hostKvCopy: 'yes' as unknown as boolean })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS, message: expect.stringContaining('hostKvCopy') as unknown });
    } finally {
      lean.dispose();
      copy.dispose();
    }
  }, 120_000);

  it('refuses residentKv on an executor without caches, and keeps a sliding-window model host-fed', async () => {
    await expect(Engine.load(`${root}base`, { residentKv: true })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS, message: expect.stringContaining("'interpreter' does not") as unknown });
    const window = fileURLToPath(new URL('../../../fixtures/hf-v2/mistral-sw', import.meta.url));
    await expect(Engine.load(window, { executor, residentKv: true })).rejects.toMatchObject({ code: EngineCode.BAD_OPTIONS, message: expect.stringContaining('sliding-window') as unknown });
    const e = await Engine.load(window, { executor });
    expect(e.residentKv).toBe(false);
    e.dispose();
  }, 60_000);
});
