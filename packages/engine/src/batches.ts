import { type HostTensor, hostTensor } from '@stageml/ir';
import { type LlamaConfig, ModelCode, ModelError } from '@stageml/models';
import { type CacheRun, type RowSample, type RowsInput, argmaxRows } from '@stageml/runtime';
import { EngineCode, EngineError } from './errors.js';
import { type Lane, type Outputs, type ProgramRunner, type StepPick, pickRows } from './runner.js';
import type { Sequence } from './sequence.js';
import type { SequenceStore } from './sequence-store.js';
import { type ChunkRow, chunkInputs, decodeAttention, prefillInputs } from './steps.js';

/**
 * One program run of a batch and its bookkeeping: the inputs of a decode batch, a prefill batch or
 * a mixed batch (decode rows beside prefill chunks), fed from the host's KV (each row's buffers in
 * place where the programs take rows, else staged) or the executor's caches, and each row's result appended to its sequence (keys and values, positions,
 * prefilled prompt, decoded tokens). Grouping rows into batches, plans and retries are the step
 * runner's (`step-runner.ts`).
 */

/** What a batch runs with: the model, the program runner and the sequences' KV. */
export interface BatchContext {
  readonly config: LlamaConfig;
  readonly runner: ProgramRunner;
  readonly seqs: SequenceStore;
}

/** `MODEL_BAD_TOKEN` for a decode row's token outside the vocabulary. */
export function checkTokens(config: LlamaConfig, tokens: readonly number[]): void {
  tokens.forEach((t, i) => {
    if (!Number.isInteger(t) || t < 0 || t >= config.vocabSize) throw new ModelError(ModelCode.BAD_TOKEN, `token id ${String(t)} at row ${String(i)} is outside the vocabulary [0, ${String(config.vocabSize)})`);
  });
}

/**
 * One decode run over `seqs` (prefilled, attached; all in `lane` if given), feeding `tokens[i]`
 * to row i; appends each row's new key and value and resolves to each row's logits or pick.
 */
export async function decodeBatch(ctx: BatchContext, seqs: readonly Sequence[], tokens: readonly number[], lane: Lane | undefined, produced: Outputs, pick: StepPick): Promise<(Float32Array | number)[]> {
  const { config, runner, seqs: store } = ctx;
  const rows = seqs.length;
  const slots = seqs.map((s) => {
    const slot = store.check(s);
    if (!s.ready) throw new EngineError(EngineCode.BAD_SEQUENCE, 'a sequence in the decode batch is not prefilled yet');
    return slot;
  });
  checkTokens(config, tokens);
  const kvShape = store.kvShape;
  const width = kvShape[0] * kvShape[1];
  const inputs: Record<string, HostTensor> = {
    input_ids: hostTensor('i64', [rows, 1], tokens),
    position_ids: hostTensor('i64', [rows, 1], seqs.map((s) => s.nextPosition)),
  };
  // One row: its buffers as zero-copy views. Several: each row's own buffers read in place where
  // the programs take rows (`rowKv`), else the decode staging kept across steps (only positions
  // appended since the last step are copied); either way each row's positions beyond its own
  // length masked.
  let past: number;
  let caches: CacheRun | undefined;
  let pastRows: Record<string, RowsInput> | undefined;
  if (store.caches !== undefined) {
    // Resident KV: the executor holds every row's keys, values and key mask; the new token is attended.
    inputs['attention_mask'] = { dtype: 'f32', shape: [rows, 1], data: new Float32Array(rows) };
    caches = store.cacheRun(seqs, seqs.map(() => [0, 1] as const));
    past = 0;
  } else if (rows === 1 || store.rowKv) {
    past = Math.max(...seqs.map((s) => s.kv.length));
    pastRows = store.stagePast(inputs, seqs, past);
  } else {
    const staged = store.decodeStaging.stage(seqs.map((s) => s.kv));
    past = staged.cap;
    for (let l = 0; l < config.numLayers; l++) {
      inputs[`past_key.${String(l)}`] = { dtype: store.dtype, shape: [rows, past, ...kvShape], data: staged.k[l]! };
      inputs[`past_value.${String(l)}`] = { dtype: store.dtype, shape: [rows, past, ...kvShape], data: staged.v[l]! };
    }
  }
  if (caches === undefined) inputs['attention_mask'] = decodeAttention(seqs, past, config.slidingWindow, store.staging);
  const out = await runner.run(inputs, slots, lane, caches, produced, pick, pastRows);
  const { k, v } = store.outputs(out);
  const picks = pick === 'greedy' ? argmaxRows(out['logits']!) : typeof pick === 'object' ? pickRows(out['logits']!, pick) : undefined;
  const logits = out['logits']!.data as Float32Array;
  const V = config.vocabSize;
  const result = seqs.map((s, r) => {
    if (!s.released) {
      s.kv.append(k, v, r * width, [0]);
      s.nextPosition++;
      if (!store.hostKv) store.historyOf(s).push(tokens[r]!);
      store.appended(s, tokens[r]);
    }
    return picks !== undefined ? picks[r]! : logits.subarray(r * V, (r + 1) * V);
  });
  store.fitPrefix();
  return result;
}

/**
 * One prefill run over `seqs` (attached at `slots`; all in `lane` if given), row r taking the next
 * `counts[r]` prompt tokens, left-padded to the longest chunk; appends each row's own positions.
 * Per row its last position's logits or pick when its prompt is done, else undefined.
 */
export async function prefillBatch(ctx: BatchContext, seqs: readonly Sequence[], slots: readonly number[], counts: readonly number[], lane: Lane | undefined, produced: Outputs, pick: 'logits' | readonly RowSample[]): Promise<(Float32Array | number | undefined)[]> {
  const { config, runner, seqs: store } = ctx;
  // Resident KV: the executor builds the cached part of the key mask; the run sends the chunk's [rows, C].
  const { inputs, C, past, chunkMasks, nexts } = prefillInputs(seqs, counts, config.slidingWindow, store.caches !== undefined);
  let caches: CacheRun | undefined;
  let pastRows: Record<string, RowsInput> | undefined;
  if (store.caches !== undefined) caches = store.cacheRun(seqs, counts.map((c) => [C - c, c] as const));
  else pastRows = store.stagePast(inputs, seqs, past);
  const out = await runner.run(inputs, slots, lane, caches, produced, pick, pastRows);
  const { k, v } = store.outputs(out);
  const width = store.kvShape[0] * store.kvShape[1];
  const V = config.vocabSize;
  const logits = out['logits']!.data as Float32Array;
  const picks = typeof pick === 'object' ? pickRows(out['logits']!, pick) : undefined;
  const result = seqs.map((s, r) => {
    if (s.released) return undefined;
    s.kv.append(k, v, (r * C + C - counts[r]!) * width, chunkMasks[r]!);
    s.prefilled += counts[r]!;
    s.nextPosition = nexts[r]!;
    store.appended(s);
    // NOTE: `ready` is a getter; it changed with `prefilled` above.
    if (!s.ready) return undefined;
    return picks !== undefined ? picks[r]! : logits.subarray(r * V, (r + 1) * V);
  });
  store.fitPrefix();
  return result;
}

/**
 * One run over decode rows (each its one token) and prefill chunks (`counts[r]` prompt tokens),
 * every row left-padded to the longest chunk; appends each row's own positions. Per decode row
 * its pick or logits; per prefill row the same when its prompt is done, else undefined.
 */
export async function mixedBatch(ctx: BatchContext, dseqs: readonly Sequence[], tokens: readonly number[], pseqs: readonly Sequence[], counts: readonly number[], produced: Outputs, pick: 'logits' | readonly RowSample[]): Promise<(Float32Array | number | undefined)[]> {
  const { config, runner, seqs: store } = ctx;
  const chunks: ChunkRow[] = [
    ...dseqs.map((s, i) => ({ seq: s, ids: [tokens[i]!], mask01: [1] })),
    ...pseqs.map((s, r) => ({ seq: s, ids: s.prompt.slice(s.prefilled, s.prefilled + counts[r]!), mask01: s.promptMask.slice(s.prefilled, s.prefilled + counts[r]!) })),
  ];
  const seqs = chunks.map((c) => c.seq);
  const slots = seqs.map((s) => store.check(s));
  const { inputs, C, past, chunkMasks, nexts } = chunkInputs(chunks, config.slidingWindow, store.caches !== undefined);
  let caches: CacheRun | undefined;
  let pastRows: Record<string, RowsInput> | undefined;
  if (store.caches !== undefined) caches = store.cacheRun(seqs, chunks.map((c) => [C - c.ids.length, c.ids.length] as const));
  else pastRows = store.stagePast(inputs, seqs, past);
  const out = await runner.run(inputs, slots, undefined, caches, produced, pick, pastRows);
  const { k, v } = store.outputs(out);
  const width = store.kvShape[0] * store.kvShape[1];
  const V = config.vocabSize;
  const logits = out['logits']!.data as Float32Array;
  const picks = typeof pick === 'object' ? pickRows(out['logits']!, pick) : undefined;
  const nd = dseqs.length;
  const result = seqs.map((s, r) => {
    const value = picks !== undefined ? picks[r]! : logits.subarray(r * V, (r + 1) * V);
    if (s.released) return r < nd ? value : undefined;
    s.kv.append(k, v, (r * C + C - chunks[r]!.ids.length) * width, chunkMasks[r]!);
    s.nextPosition = nexts[r]!;
    if (r < nd) {
      if (!store.hostKv) store.historyOf(s).push(tokens[r]!);
      store.appended(s, tokens[r]);
      return value;
    }
    s.prefilled += counts[r - nd]!;
    store.appended(s);
    // NOTE: `ready` is a getter; it changed with `prefilled` above.
    return s.ready ? value : undefined;
  });
  store.fitPrefix();
  return result;
}
