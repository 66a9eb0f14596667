// Multi-row steps on cpu-native read each sequence's own KV buffer in place (`RunOptions.rows`)
// instead of copying the rows' prefixes into the staging buffers: the staged copy's logits (an
// executor hiding `rowInputs` keeps the copy) — bit for bit where both batches have the same
// length (prefill), to float rounding in decode steps (the staged batch pads to a multiple of 64
// positions, which moves the new key's place in the sums) — and staging holds only the key mask.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Executor, type PreparedGraph, createCpuNativeExecutor } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { Engine, type Sequence } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, Record<string, { input_ids: number[] }>>;

/** `executor` with its programs' per-row inputs hidden: the engine stages multi-row steps as before. */
function staged(executor: Executor): Executor {
  return {
    ...executor,
    prepare: async (graph, weights) => {
      const p = await executor.prepare(graph, weights);
      const hidden: PreparedGraph = { executor: p.executor, run: (inputs, opts) => p.run(inputs, opts), dispose: () => { p.dispose(); } };
      return hidden;
    },
  };
}

/**
 * Prompts of different lengths on two adapters and the base, prefilled together in chunks of 8,
 * then 5 decode steps of all rows at once (each fed its greedy token); every step's logits and
 * the staging bytes after each step.
 */
async function run(engine: Engine): Promise<{ logits: number[][]; prefillRows: number; staging: number[]; longest: number }> {
  await engine.loadAdapter(`${root}llama/adapters/qv-r8`);
  await engine.loadAdapter(`${root}llama/adapters/all-r16`);
  const seqs: Sequence[] = [];
  for (const [i, m] of ['base', 'qv-r8', 'all-r16', 'qv-r8'].entries()) {
    const ids = golden[`llama.${m}`]![`prompt${String(i)}`]!.input_ids;
    // Different lengths: a prompt repeated 1–3 times.
    const prompt = Array.from({ length: 1 + (i % 3) }, () => ids).flat();
    const seq = engine.open(m === 'base' ? undefined : m, prompt, prompt.map((t) => (t === 0 ? 0 : 1)));
    expect(await engine.attach(seq)).toBe(true);
    seqs.push(seq);
  }
  const logits: number[][] = [];
  const staging: number[] = [];
  const last: number[] = seqs.map(() => 0);
  const take = (values: readonly (number | Float32Array | undefined)[], rows: readonly number[]): void => {
    values.forEach((v, i) => {
      if (v === undefined || typeof v === 'number') return;
      logits.push(Array.from(v));
      last[rows[i]!] = v.indexOf(Math.max(...v));
    });
  };
  while (seqs.some((s) => !s.ready)) {
    const rows = seqs.flatMap((s, i) => (s.ready ? [] : [i]));
    const r = await engine.step({ prefill: { seqs: rows.map((i) => seqs[i]!) } });
    take(r.prefill!.values!, rows);
    staging.push(engine.memory().staging);
  }
  const prefillRows = logits.length;
  for (let t = 0; t < 5; t++) {
    const r = await engine.step({ decode: { seqs, tokens: [...last] } });
    take(r.decode!.values!, seqs.map((_, i) => i));
    staging.push(engine.memory().staging);
  }
  const longest = Math.max(...seqs.map((s) => s.kv.length));
  for (const s of seqs) engine.release(s);
  return { logits, prefillRows, staging, longest };
}

describe('multi-row steps over per-row KV', () => {
  it('give the staged copy’s logits, and staging holds only the key mask', async () => {
    const inPlace = await Engine.load(`${root}llama/base`, { executor: createCpuNativeExecutor({ threads: 2 }), prefillChunk: 8 });
    const copied = await Engine.load(`${root}llama/base`, { executor: staged(createCpuNativeExecutor({ threads: 2 })), prefillChunk: 8 });
    const a = await run(inPlace);
    const b = await run(copied);
    expect(a.logits.length).toBe(b.logits.length);
    expect(a.logits.length).toBeGreaterThan(20);
    // Prefill runs: the same batch [rows, past] either way.
    expect(a.logits.slice(0, a.prefillRows)).toEqual(b.logits.slice(0, b.prefillRows));
    a.logits.forEach((row, i) => {
      const want = b.logits[i]!;
      const scale = Math.max(...want.map(Math.abs));
      expect(Math.max(...row.map((x, j) => Math.abs(x - want[j]!)))).toBeLessThanOrEqual(1e-5 * scale);
      expect(row.indexOf(Math.max(...row))).toBe(want.indexOf(Math.max(...want)));
    });
    const cfg = inPlace.config;
    const width = cfg.numKvHeads * cfg.headDim;
    // In place: a [rows, past + 1] f32 mask at most, grown by doubling (under 2× its need).
    const maskBound = 2 * 4 * (a.longest + 1) * 4;
    expect(Math.max(...a.staging)).toBeLessThanOrEqual(maskBound);
    // Copied: every layer's keys and values of the 4 rows, at least the longest row's positions each.
    expect(Math.max(...b.staging)).toBeGreaterThanOrEqual(2 * cfg.numLayers * 4 * a.longest * width * 4);
  }, 120_000);
});
