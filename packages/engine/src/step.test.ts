import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Executor, createCpuNativeExecutor, interpreterExecutor } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { Engine, type Sequence } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, Record<string, { input_ids: number[]; greedy_new_ids: number[] }>>;
const GREEDY = { temperature: 0, topK: 0, topP: 1, u: 0 } as const;

interface Live {
  readonly seq: Sequence;
  readonly want: readonly number[];
  readonly got: number[];
}

/**
 * Generates the golden greedy tokens of `models` × prompts through `Engine.step` only, the
 * arrivals staggered (one per step) so that most steps hold decode rows and prefill chunks
 * together; returns every row's tokens and the engine's counters.
 */
async function stepwise(engine: Engine, models: readonly string[], tokens: number, logits = false): Promise<{ got: number[][]; want: number[][] }> {
  const waiting = models.flatMap((m) => [0, 1, 2, 3].map((p) => ({ m, p })));
  const all: Live[] = [];
  const running: Live[] = [];
  while (waiting.length > 0 || running.length > 0) {
    const next = waiting.shift();
    if (next !== undefined) {
      const g = golden[`llama.${next.m}`]![`prompt${String(next.p)}`]!;
      const seq = engine.open(next.m === 'base' ? undefined : next.m, g.input_ids, g.input_ids.map((t) => (t === 0 ? 0 : 1)));
      expect(await engine.attach(seq)).toBe(true);
      const live = { seq, want: g.greedy_new_ids.slice(0, tokens), got: [] };
      all.push(live);
      running.push(live);
    }
    const decoding = running.filter((l) => l.seq.ready);
    const prefilling = running.filter((l) => !l.seq.ready);
    const r = await engine.step({
      ...(decoding.length === 0 ? {} : { decode: { seqs: decoding.map((l) => l.seq), tokens: decoding.map((l) => l.got.at(-1)!), ...(logits ? {} : { rows: decoding.map(() => GREEDY) }) } }),
      ...(prefilling.length === 0 ? {} : { prefill: { seqs: prefilling.map((l) => l.seq), ...(logits ? {} : { rows: prefilling.map(() => GREEDY) }) } }),
    });
    const pick = (v: number | Float32Array | undefined): number | undefined => (v === undefined ? undefined : typeof v === 'number' ? v : v.indexOf(Math.max(...v)));
    decoding.forEach((l, i) => l.got.push(pick(r.decode!.values![i])!));
    prefilling.forEach((l, i) => {
      const id = pick(r.prefill!.values![i]);
      if (id !== undefined) l.got.push(id);
    });
    for (let i = running.length - 1; i >= 0; i--) {
      if (running[i]!.got.length < tokens) continue;
      engine.release(running[i]!.seq);
      running.splice(i, 1);
    }
  }
  return { got: all.map((l) => l.got), want: all.map((l) => [...l.want]) };
}

const EXECUTORS: readonly [string, () => Executor][] = [
  ['interpreter', () => interpreterExecutor],
  ['cpu-native', () => createCpuNativeExecutor({ threads: 1 })],
];

describe('Engine.step', () => {
  for (const [name, make] of EXECUTORS) {
    it(`${name}: decode rows and prefill chunks in one program run give the golden tokens (merged, and apart)`, async () => {
      const merged = await Engine.load(`${root}llama/base`, { executor: make(), prefillChunk: 8, stepMergeWaste: 1000 });
      await merged.loadAdapter(`${root}llama/adapters/qv-r8`);
      const a = await stepwise(merged, ['base', 'qv-r8'], 6);
      expect(a.got).toEqual(a.want);
      const s = merged.stats();
      // Every step with both kinds was merged: one run per step.
      expect(s.mergedSteps).toBeGreaterThan(5);
      expect(s.runs).toBe(s.steps);
      const apart = await Engine.load(`${root}llama/base`, { executor: make(), prefillChunk: 8, stepMergeWaste: 0 });
      await apart.loadAdapter(`${root}llama/adapters/qv-r8`);
      const b = await stepwise(apart, ['base', 'qv-r8'], 6);
      expect(b.got).toEqual(b.want);
      expect(apart.stats().mergedSteps).toBe(0);
      expect(apart.stats().runs).toBeGreaterThan(apart.stats().steps);
    }, 120_000);
  }

  it('merged steps return logits per row where no rows are given, each row the logits its decode or prefill run gives', async () => {
    const engine = await Engine.load(`${root}llama/base`, { prefillChunk: 8, stepMergeWaste: 1000 });
    const a = await stepwise(engine, ['base'], 5, true);
    expect(a.got).toEqual(a.want);
    expect(engine.stats().mergedSteps).toBeGreaterThan(0);
  });

  it('bounds the padding: many decode rows beside a long chunk run apart, few beside it run together', async () => {
    const engine = await Engine.load(`${root}llama/base`, { prefillChunk: 16 });
    const prompts = [0, 1, 2, 3].map((p) => golden['llama.base']![`prompt${String(p)}`]!.input_ids);
    const open = async (ids: readonly number[]): Promise<Sequence> => {
      const s = engine.open(undefined, ids);
      await engine.attach(s);
      return s;
    };
    const dec = await Promise.all(prompts.slice(0, 3).map(open));
    for (const s of dec) while (!s.ready) await engine.prefill(s);
    const late = await open(prompts[3]!);
    // 3 decode rows beside a 16-token chunk: 45 padded token rows against 19 apart: not merged.
    const r1 = await engine.step({ decode: { seqs: dec, tokens: [1, 2, 3], rows: dec.map(() => GREEDY) }, prefill: { seqs: [late], rows: [GREEDY] } });
    expect(r1).toMatchObject({ merged: false, runs: 2 });
    // One decode row beside a 5-token tail of the prompt (21 = 16 + 5): 4 padded against 6 apart — within 1.0.
    const merged = await Engine.load(`${root}llama/base`, { prefillChunk: 16, stepMergeWaste: 1 });
    const d1 = merged.open(undefined, prompts[0]!);
    await merged.attach(d1);
    while (!d1.ready) await merged.prefill(d1);
    const p1 = merged.open(undefined, prompts[3]!);
    await merged.attach(p1);
    await merged.prefill(p1);
    const r2 = await merged.step({ decode: { seqs: [d1], tokens: [5], rows: [GREEDY] }, prefill: { seqs: [p1], rows: [GREEDY] } });
    expect(r2).toMatchObject({ merged: true, runs: 1 });
    expect(p1.ready).toBe(true);
    expect(typeof r2.prefill!.values![0]).toBe('number');
  });

  it('fails each part on its own apart, both parts together merged, and refuses an empty step or a bad option', async () => {
    const engine = await Engine.load(`${root}llama/base`, { prefillChunk: 8, stepMergeWaste: 0 });
    const ids = golden['llama.base']!['prompt0']!.input_ids;
    const d = engine.open(undefined, ids);
    await engine.attach(d);
    while (!d.ready) await engine.prefill(d);
    const p = engine.open(undefined, ids);
    await engine.attach(p);
    const length = d.kv.length;
    const r = await engine.step({ decode: { seqs: [d], tokens: [99999], rows: [GREEDY] }, prefill: { seqs: [p], rows: [GREEDY] } });
    expect(r.decode!.error).toMatchObject({ code: 'MODEL_BAD_TOKEN' });
    expect(r.prefill!.values).toEqual([undefined]);
    expect(d.kv.length).toBe(length);
    const both = await Engine.load(`${root}llama/base`, { prefillChunk: 8, stepMergeWaste: 1000 });
    const d2 = both.open(undefined, ids);
    await both.attach(d2);
    while (!d2.ready) await both.prefill(d2);
    const p2 = both.open(undefined, ids);
    await both.attach(p2);
    const r2 = await both.step({ decode: { seqs: [d2], tokens: [99999], rows: [GREEDY] }, prefill: { seqs: [p2], rows: [GREEDY] } });
    expect(r2.merged).toBe(true);
    expect(r2.decode!.error).toMatchObject({ code: 'MODEL_BAD_TOKEN' });
    expect(r2.prefill!.error).toBe(r2.decode!.error);
    expect(p2.prefilled).toBe(0);
    await expect(engine.step({})).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS' });
    await expect(Engine.load(`${root}llama/base`, { stepMergeWaste: -1 })).rejects.toMatchObject({ code: 'ENGINE_BAD_OPTIONS' });
  });
});
