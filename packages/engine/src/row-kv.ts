import type { PreparedGraph, RowsInput } from '@stageml/runtime';
import type { Sequence } from './sequence.js';

/**
 * Multi-row steps fed each row's own KV in place (`RunOptions.rows`): on an executor whose
 * programs read the caches of cached attention per row (cpu-native), a step over several
 * sequences passes each sequence's filled prefix, per layer, as it lies in its `SequenceKv`,
 * instead of copying every row's prefix into one contiguous batch (the staging buffers: a second
 * copy of the batch's KV, kept across steps). Other executors keep the staging copy.
 */

/** The `past_*` input names of layer `l`. */
export function pastInputNames(l: number): readonly [string, string] {
  return [`past_key.${String(l)}`, `past_value.${String(l)}`];
}

/** Whether every one of `programs` takes every layer's past keys and values per row (`PreparedGraph.rowInputs`). */
export function takesRowKv(programs: readonly (PreparedGraph | undefined)[], layers: number): boolean {
  const present = programs.filter((p) => p !== undefined);
  if (present.length === 0) return false;
  return present.every((p) => {
    const rows = p.rowInputs;
    if (rows === undefined) return false;
    for (let l = 0; l < layers; l++) if (!pastInputNames(l).every((n) => rows.has(n))) return false;
    return true;
  });
}

/**
 * The `past_*` inputs of a step over `seqs` as rows [rows, past, kv_heads, head_dim]: per layer,
 * each row's filled prefix as a zero-copy view of its own buffer. A row shorter than `past` is
 * shorter in its buffer too (its missing positions read as zeros), so the step's key mask must
 * mask them — as it masks a staged row's padding.
 */
export function pastRows(seqs: readonly Sequence[], past: number, kvShape: readonly [number, number]): Record<string, RowsInput> {
  const layers = seqs[0]!.kv.layers;
  const dtype = seqs[0]!.kv.dtype;
  const shape = [seqs.length, past, ...kvShape];
  const out: Record<string, RowsInput> = {};
  for (let l = 0; l < layers; l++) {
    const views = seqs.map((s) => s.kv.view(l, kvShape));
    const [k, v] = pastInputNames(l);
    out[k] = { dtype, shape, rows: views.map((x) => x.k.data as Float32Array) };
    out[v] = { dtype, shape, rows: views.map((x) => x.v.data as Float32Array) };
  }
  return out;
}
