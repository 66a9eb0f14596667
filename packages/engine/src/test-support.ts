// Test-only helpers for the engine suites: the torch executor (CPU torch; Debian's python3-torch in
// CI, where a missing torch fails the suite with a clear message; elsewhere the suite is skipped) and
// the golden check of a mixed batch against transformers.
import { RuntimeCode, RuntimeError, type TorchExecutor, createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { argmaxOf } from '@stageml/models';
import type { SafetensorsFile } from '@stageml/safetensors';
import { describeNeeding } from '@stageml/testkit';
import { afterAll, beforeAll, expect } from 'vitest';
import type { Engine, Sequence } from './index.js';

/** A `describe` that needs Python 3 with torch: failing in CI when torch is missing, skipped elsewhere. */
export function describeWithTorch(name: string, fn: () => void): void {
  describeNeeding(name, isTorchAvailable(), () => new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)'), fn);
}

/**
 * Inside a `describeWithTorch`: starts a CPU torch executor before the suite's tests and closes it
 * after them; the returned function gives the running executor.
 */
export function useCpuTorchExecutor(): () => TorchExecutor {
  let executor: TorchExecutor | undefined;
  beforeAll(async () => {
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor?.close();
  });
  return () => {
    if (executor === undefined) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor has not started (use it inside a test)');
    return executor;
  };
}

/** One row of a golden check: the model (`base` or an adapter name), its prompt and what transformers gave. */
export interface GoldenRow {
  readonly model: string;
  readonly ids: readonly number[];
  /** Tensor of `goldens` whose last vocabulary-sized values are the prompt's last logits. */
  readonly logits: string;
  /** transformers' greedy tokens: the prefill's pick, then one per decode step. */
  readonly greedy: readonly number[];
}

/**
 * Every row of `rows` opened on `engine` and prefilled, its last logits within 1e-4 of the golden,
 * then all rows decoded together in one mixed batch: each row's greedy tokens equal transformers'.
 * With `alone`, each row is then decoded by itself too and must give the same tokens.
 */
export async function checkMixedBatch(engine: Engine, goldens: SafetensorsFile, rows: readonly GoldenRow[], opts: { readonly alone?: boolean } = {}): Promise<void> {
  const V = engine.config.vocabSize;
  const adapterOf = (m: string): string | undefined => (m === 'base' ? undefined : m);
  const prefilled = async (s: Sequence): Promise<Float32Array> => {
    expect(await engine.attach(s)).toBe(true);
    let logits: Float32Array | undefined;
    while (!s.ready) logits = await engine.prefill(s);
    return logits!;
  };
  const seqs = rows.map((r) => engine.open(adapterOf(r.model), r.ids));
  const out: number[][] = [];
  for (const [i, s] of seqs.entries()) {
    const logits = await prefilled(s);
    const want = (await goldens.readTensor(rows[i]!.logits)).data;
    let d = 0;
    for (let v = 0; v < V; v++) d = Math.max(d, Math.abs(logits[v]! - want[want.length - V + v]!));
    expect(d, `${rows[i]!.logits}: last logits`).toBeLessThanOrEqual(1e-4);
    out.push([argmaxOf(logits)]);
  }
  const steps = Math.max(...rows.map((r) => r.greedy.length)) - 1;
  for (let k = 0; k < steps; k++) (await engine.decode(seqs, out.map((o) => o[o.length - 1]!))).forEach((l, i) => out[i]!.push(argmaxOf(l)));
  rows.forEach((r, i) => {
    expect(out[i], `${r.logits}: mixed`).toEqual(r.greedy);
  });
  for (const s of seqs) engine.release(s);
  if (opts.alone !== true) return;
  for (const r of rows) {
    const s = engine.open(adapterOf(r.model), r.ids);
    const alone = [argmaxOf(await prefilled(s))];
    for (let k = 0; k < steps; k++) alone.push(argmaxOf((await engine.decode([s], [alone[alone.length - 1]!]))[0]!));
    expect(alone, `${r.logits}: alone`).toEqual(r.greedy);
    engine.release(s);
  }
}
