import { type HostTensor, hostTensor } from '@stageml/ir';
import { EngineCode, EngineError } from './errors.js';
import { MASKED, type Staging } from './kv.js';
import { windowKeys, windowedQueries } from './masks.js';
import type { Sequence } from './sequence.js';

/** A prefill run's inputs (without `past_*` and slot inputs) and what appending its results needs. */
export interface PrefillInputs {
  readonly inputs: Record<string, HostTensor>;
  /** Positions per row (the longest chunk; shorter rows are left-padded). */
  readonly C: number;
  /** Cached positions per row in the run (the longest row's; shorter rows are padded, masked). */
  readonly past: number;
  /** Per row, the additive key mask of its own chunk positions. */
  readonly chunkMasks: number[][];
  /** Per row, its next rotary position after the chunk. */
  readonly nexts: number[];
}

/**
 * One row of a chunk run: the sequence and the tokens it takes this run with their 0/1 attention
 * mask — the next part of its prompt (a prefill chunk), or one decoded token (a decode row run
 * beside prefill chunks, `Engine.step`).
 */
export interface ChunkRow {
  readonly seq: Sequence;
  readonly ids: readonly number[];
  readonly mask01: readonly number[];
}

/**
 * The inputs of one prefill run over `seqs`, row r taking the next `counts[r]` prompt tokens:
 * ids and positions left-padded to the longest chunk (padding masked, so every row's last position
 * is its own last token), and the key mask over [cached prefix | staging padding | chunk padding |
 * chunk] (per query with a sliding window). With `tailOnly` (resident KV: the executor builds the
 * cached part) the mask is the chunk's [rows, C] alone: nothing is built per cached position.
 */
export function prefillInputs(seqs: readonly Sequence[], counts: readonly number[], window: number | undefined, tailOnly = false): PrefillInputs {
  return chunkInputs(
    seqs.map((s, r) => ({ seq: s, ids: s.prompt.slice(s.prefilled, s.prefilled + counts[r]!), mask01: s.promptMask.slice(s.prefilled, s.prefilled + counts[r]!) })),
    window,
    tailOnly,
  );
}

/** `prefillInputs` over chunk rows of any origin (prompt chunks, decoded tokens). */
export function chunkInputs(chunks: readonly ChunkRow[], window: number | undefined, tailOnly = false): PrefillInputs {
  const rows = chunks.length;
  const C = Math.max(...chunks.map((c) => c.ids.length));
  const past = Math.max(...chunks.map((c) => c.seq.kv.length));
  // With `tailOnly` the executor holds the cached part: only the chunk's own keys are sent.
  const before = tailOnly ? 0 : past;
  const keys = before + C;
  const ids = new Array<number>(rows * C).fill(0);
  const positions = new Array<number>(rows * C).fill(1);
  const keyMask = new Float32Array(rows * keys).fill(MASKED);
  const chunkMasks: number[][] = [];
  const nexts: number[] = [];
  chunks.forEach(({ seq: s, ids: tokens, mask01 }, r) => {
    const c = tokens.length;
    const pad = C - c;
    let next = s.nextPosition;
    tokens.forEach((t, i) => {
      ids[r * C + pad + i] = t;
      positions[r * C + pad + i] = mask01[i] === 1 ? next++ : 1;
    });
    nexts.push(next);
    const chunkMask = mask01.map((v) => (v === 1 ? 0 : MASKED));
    chunkMasks.push(chunkMask);
    // Keys: the row's cached prefix, staging padding up to `past` (masked), the chunk's left
    // padding (masked), then its own positions.
    if (!tailOnly) keyMask.set(s.kv.maskView(), r * keys);
    keyMask.set(chunkMask, r * keys + before + pad);
  });
  let attention: HostTensor;
  if (window === undefined) attention = { dtype: 'f32', shape: [rows, keys], data: keyMask };
  else {
    if (tailOnly) throw new EngineError(EngineCode.BAD_OPTIONS, 'a sliding window needs the whole key mask on the host (no tail-only chunk inputs)');
    const perQuery = new Float32Array(rows * C * keys);
    for (let r = 0; r < rows; r++) perQuery.set(windowedQueries(keyMask.subarray(r * keys, (r + 1) * keys), past, C, window), r * C * keys);
    attention = { dtype: 'f32', shape: [rows, C, keys], data: perQuery };
  }
  const inputs: Record<string, HostTensor> = {
    input_ids: hostTensor('i64', [rows, C], ids),
    position_ids: hostTensor('i64', [rows, C], positions),
    attention_mask: attention,
  };
  return { inputs, C, past, chunkMasks, nexts };
}

/**
 * The `past_*` inputs of a step over `seqs`: one row's cached prefix as zero-copy views; several
 * rows' copied into the reusable staging buffers [rows, past, kv_heads, head_dim] (a row shorter
 * than `past` is padded, and its key mask must mask the padding).
 */
export function stagePast(inputs: Record<string, HostTensor>, seqs: readonly Sequence[], past: number, kvShape: readonly [number, number], staging: Staging): void {
  const rows = seqs.length;
  const layers = seqs[0]!.kv.layers;
  if (rows === 1) {
    for (let l = 0; l < layers; l++) {
      const view = seqs[0]!.kv.view(l, kvShape);
      inputs[`past_key.${String(l)}`] = view.k;
      inputs[`past_value.${String(l)}`] = view.v;
    }
    return;
  }
  const width = kvShape[0] * kvShape[1];
  const dtype = seqs[0]!.kv.dtype;
  const buf = staging.reserve(rows * past * width, 0);
  for (let l = 0; l < layers; l++) {
    const k = buf.k[l]!;
    const v = buf.v[l]!;
    seqs.forEach((s, r) => {
      s.kv.copyTo(l, k, v, r * past * width);
    });
    inputs[`past_key.${String(l)}`] = { dtype, shape: [rows, past, ...kvShape], data: k.subarray(0, rows * past * width) };
    inputs[`past_value.${String(l)}`] = { dtype, shape: [rows, past, ...kvShape], data: v.subarray(0, rows * past * width) };
  }
}

/**
 * A decode step's key mask [rows, past + 1] (with a sliding window [rows, 1, past + 1]): each row's
 * cached positions, its positions past its own length masked, the new token attended. One row
 * gets a fresh array; several use the staging mask buffer.
 */
export function decodeAttention(seqs: readonly Sequence[], past: number, window: number | undefined, staging: Staging): HostTensor {
  const rows = seqs.length;
  const mask = rows === 1 ? new Float32Array(past + 1) : staging.reserve(0, rows * (past + 1)).mask.subarray(0, rows * (past + 1));
  seqs.forEach((s, r) => {
    mask.set(s.kv.maskView(), r * (past + 1));
    mask.fill(MASKED, r * (past + 1) + s.kv.length, r * (past + 1) + past);
    mask[r * (past + 1) + past] = 0;
    if (window !== undefined) windowKeys(mask.subarray(r * (past + 1), (r + 1) * (past + 1)), s.kv.length, window);
  });
  return { dtype: 'f32', shape: window === undefined ? [rows, past + 1] : [rows, 1, past + 1], data: mask };
}
