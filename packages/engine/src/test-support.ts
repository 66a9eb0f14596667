// Test-only helpers for the engine suites: the torch executor (CPU torch; Debian's python3-torch in
// CI, where a missing torch fails the suite with a clear message; elsewhere the suite is skipped),
// the golden check of a mixed batch against transformers, and the staged single-adapter reference.
import { type HostTensor, hostTensor, zeros } from '@stageml/ir';
import { argmaxOf, stagedModelGraph } from '@stageml/models';
import { type Executor, RuntimeCode, RuntimeError, type TorchExecutor, type WeightQuantSpec, createTorchExecutor, interpreterExecutor, isTorchAvailable, quantizeLinears, specialize } from '@stageml/runtime';
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

/** Additive mask value of an ignored key: float32's lowest, as HF uses. */
const MASKED = -3.4028234663852886e38;

/** A model specialized for at most one adapter, run as one full forward per call (`stagedReference`). */
export interface StagedReference {
  /** Logits f32[T·vocab] of `ids` from an empty cache; `mask` 0 marks a padding token (keys ignored, rotary position 1, as HF). */
  logits(ids: readonly number[], mask?: readonly number[]): Promise<Float32Array>;
  /** The last position's logits of `ids`: what a decode step after `ids[:-1]` must give. */
  last(ids: readonly number[], mask?: readonly number[]): Promise<Float32Array>;
  dispose(): void;
}

/**
 * The oracle the engine's rows are checked against, built from what the engine is built on and
 * independent of its slot programs: `stagedModelGraph` (the graph `stageml stage` specializes: the
 * adapter's own linears, no slots), `specialize` at the `adapter` stage, `quantizeLinears` when
 * asked, prepared on `executor` (default: the interpreter) and run over the whole sequence with an
 * empty KV cache. Llama-style families without sliding windows.
 */
export async function stagedReference(dir: string, opts: { readonly adapter?: string | undefined; readonly executor?: Executor; readonly quantize?: WeightQuantSpec } = {}): Promise<StagedReference> {
  const m = await stagedModelGraph(dir, opts.adapter === undefined ? {} : { adapter: opts.adapter });
  const values = m.values;
  const result = specialize(m.graph, { lattice: m.lattice, annotations: m.annotations, cutoff: 'adapter', values: { get: (n) => values.get(n) } });
  const staged = opts.quantize === undefined ? { graph: result.residual, constants: result.constants } : quantizeLinears(result.residual, result.constants, { spec: opts.quantize });
  const prepared = await (opts.executor ?? interpreterExecutor).prepare(staged.graph, staged.constants);
  const { numLayers, numKvHeads, headDim, vocabSize } = m.config;
  const logits = async (ids: readonly number[], mask: readonly number[] = ids.map(() => 1)): Promise<Float32Array> => {
    let next = 0;
    const inputs: Record<string, HostTensor> = {
      input_ids: hostTensor('i64', [1, ids.length], [...ids]),
      position_ids: hostTensor('i64', [1, ids.length], mask.map((v) => (v === 1 ? next++ : 1))),
      attention_mask: hostTensor('f32', [1, ids.length], mask.map((v) => (v === 1 ? 0 : MASKED))),
    };
    for (let l = 0; l < numLayers; l++) {
      inputs[`past_key.${String(l)}`] = zeros('f32', [1, numKvHeads, 0, headDim]);
      inputs[`past_value.${String(l)}`] = zeros('f32', [1, numKvHeads, 0, headDim]);
    }
    return Float32Array.from((await prepared.run(inputs))['logits']!.data);
  };
  return {
    logits,
    last: async (ids, mask) => (await logits(ids, mask)).slice((ids.length - 1) * vocabSize),
    dispose: () => {
      prepared.dispose();
    },
  };
}
