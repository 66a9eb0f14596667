// The torch worker's persistent batch (native/stageml_torch/worker.py `Staged`): sequences joining
// and leaving every few steps write or free only their own row, so the batch is re-staged only as
// it grows (its rows a power of two), the emulated CUDA graphs of its decode steps keep replaying,
// and every token equals the host-fed engine's.
import { fileURLToPath } from 'node:url';
import { type TorchExecutor, createTorchExecutor } from '@stageml/runtime';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Engine, type Sequence } from './index.js';
import { describeWithTorch } from './test-support.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/', import.meta.url));
const GREEDY = { temperature: 0, topK: 0, topP: 1, u: 0 } as const;
const PROMPTS: readonly number[][] = [
  [1, 52, 317, 335, 262, 438, 309, 487],
  [1, 54, 264, 479, 455],
  [1, 500, 72, 283, 10, 90, 11, 4, 77, 21, 5],
  [1, 7, 9],
];

/**
 * Ten sequences (base and two adapters), one arriving per step, each leaving after 3 to 9 new
 * tokens, driven through `Engine.step`; returns every sequence's greedy tokens.
 */
async function churn(e: Engine): Promise<number[][]> {
  const all: { seq: Sequence; got: number[]; want: number }[] = [];
  let live: typeof all = [];
  for (let i = 0; all.length < 10 || live.length > 0; i++) {
    if (all.length < 10) {
      const n = all.length;
      const seq = e.open([undefined, 'a', 'b'][n % 3], PROMPTS[n % 4]!.map((t) => (t + n) % 500));
      expect(await e.attach(seq)).toBe(true);
      const row = { seq, got: [] as number[], want: 3 + ((n * 5) % 7) };
      all.push(row);
      live.push(row);
    }
    const dec = live.filter((r) => r.seq.ready);
    const pre = live.filter((r) => !r.seq.ready);
    const out = await e.step({
      ...(dec.length === 0 ? {} : { decode: { seqs: dec.map((r) => r.seq), tokens: dec.map((r) => r.got.at(-1)!), rows: dec.map(() => GREEDY) } }),
      ...(pre.length === 0 ? {} : { prefill: { seqs: pre.map((r) => r.seq), rows: pre.map(() => GREEDY), maxChunk: 4 } }),
    });
    dec.forEach((r, j) => r.got.push(out.decode!.values![j] as number));
    pre.forEach((r, j) => {
      const id = out.prefill!.values![j];
      if (id !== undefined) r.got.push(id as number);
    });
    for (const r of live) if (r.got.length >= r.want) e.release(r.seq);
    live = live.filter((r) => r.got.length < r.want);
  }
  return all.map((r) => r.got);
}

describeWithTorch('the torch worker\'s persistent batch (CPU torch)', () => {
  let executor: TorchExecutor;
  let graphs: TorchExecutor;
  beforeAll(async () => {
    executor = await createTorchExecutor({ device: 'cpu' });
    graphs = await createTorchExecutor({ device: 'cpu', env: { STAGEML_TORCH_GRAPHS: 'emulate' } });
  }, 120_000);
  afterAll(async () => {
    await executor.close();
    await graphs.close();
  });

  it('joins and frees single rows as sequences come and go: few re-stagings, graphs replayed, the host-fed tokens', async () => {
    const load = async (x: TorchExecutor, residentKv: boolean): Promise<Engine> => {
      const e = await Engine.load(`${root}base`, { executor: x, maxLoras: 4, maxLoraRank: 16, residentKv, stepMergeWaste: 0 });
      await e.loadAdapter(`${root}adapters/all-r16`, 'a');
      await e.loadAdapter(`${root}adapters/qv-r8`, 'b');
      return e;
    };
    const host = await load(executor, false);
    const want = await churn(host);
    host.dispose();
    for (const x of [executor, graphs]) {
      const before = x.caches.stats!();
      const e = await load(x, true);
      expect(await churn(e)).toEqual(want);
      const st = e.stats().executor;
      const d = (k: string): number => (st[k] ?? 0) - (before[k] ?? 0);
      // Rows 1 → 2 → 4 → 8 at most (and no more than once for a capacity of positions): the other
      // arrivals joined a free row; departures moved nothing.
      expect(d('restages')).toBeLessThanOrEqual(5);
      expect(d('joins')).toBeGreaterThanOrEqual(5);
      if (x === graphs) {
        // Decode steps over a batch of fixed shape: most replayed, few captured.
        expect(d('graphReplays')).toBeGreaterThan(3 * d('graphCaptures'));
        expect(d('dummyRows')).toBeGreaterThan(0);
      }
      e.dispose();
    }
  }, 240_000);

  it('sizes the batch for the rows\' expected lengths (Sequence.reserve): one staging instead of one per growth, the same tokens', async () => {
    const decode = async (reserve: boolean, graphed = true): Promise<{ tokens: number[][]; restages: number }> => {
      // A worker of its own: a batch left staged by an earlier engine would take these rows as joins.
      const x = await createTorchExecutor({ device: 'cpu', env: { STAGEML_TORCH_GRAPHS: graphed ? 'emulate' : '0' } });
      const e = await Engine.load(`${root}base`, { executor: x, maxLoras: 2, maxLoraRank: 16, residentKv: true });
      const seqs = PROMPTS.map((p) => e.open(undefined, p));
      for (const s of seqs) {
        if (reserve) s.reserve = s.prompt.length + 70;
        expect(await e.attach(s)).toBe(true);
      }
      const got: number[][] = seqs.map(() => []);
      const first = await e.step({ prefill: { seqs, rows: seqs.map(() => GREEDY) } });
      first.prefill!.values!.forEach((t, i) => got[i]!.push(t as number));
      // Past the first capacity (64 positions): without the hint the batch grows (every row copied).
      for (let i = 0; i < 69; i++) {
        const out = await e.step({ decode: { seqs, tokens: got.map((g) => g.at(-1)!), rows: seqs.map(() => GREEDY) } });
        out.decode!.values!.forEach((t, j) => got[j]!.push(t as number));
      }
      const restages = e.stats().executor['restages'] ?? 0;
      if (graphed) ahead.push([e.stats().executor['ahead'] ?? 0, e.stats().executor['aheadHits'] ?? 0]);
      for (const s of seqs) e.release(s);
      e.dispose();
      await x.close();
      return { tokens: got, restages };
    };
    const ahead: [number, number][] = [];
    const plain = await decode(false);
    const hinted = await decode(true);
    expect(hinted.tokens).toEqual(plain.tokens);
    // Without graphs nothing runs ahead: the same tokens.
    expect((await decode(true, false)).tokens).toEqual(plain.tokens);
    // Greedy decode steps of an unchanging batch: each replayed step launched the next one ahead
    // (native/stageml_torch/ahead.py), and the requests took them — with the tokens the host-fed
    // steps give (the churn test above).
    for (const [launched, hits] of ahead) {
      expect(hits).toBeGreaterThan(50);
      expect(launched - hits).toBeLessThanOrEqual(4);
    }
    expect(plain.restages).toBeGreaterThanOrEqual(2);
    expect(hinted.restages).toBe(1);
  }, 240_000);
});
