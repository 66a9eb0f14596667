import type { Graph } from '@stageml/ir';
import { type LlamaConfig, buildLlamaGraph, familyGraphOptions } from '@stageml/models';
import { type SlotForm, type SlotModule, slotExperts, slotLinear } from './slot-linear.js';

/**
 * The engine's program graph: the decoder of any supported family (`SUPPORTED_MODEL_TYPES`) with
 * slot linears on every projection (Phi-3's fused `qkv_proj` / `gate_up_proj` included),
 * position-major resident KV inputs, only this step's keys/values as outputs, last-position
 * logits, and an additive key mask; MoE layers take expert LoRA factors from slot tables too.
 * `modules` receives every projection (and expert projection) with slot tables. Form `base` is the
 * same decoder without slot tables: what a batch of base rows only runs.
 */
export function engineGraph(config: LlamaConfig, form: SlotForm | 'base', slots: number, rank: number, modules: SlotModule[], opts: { readonly allLogits?: boolean; readonly separateHead?: boolean; readonly outTables?: boolean; readonly int8Factors?: boolean } = {}): Graph {
  // One slot linear for the whole graph: its row-slot inputs are shared by every projection.
  const linear = form === 'base' ? undefined : slotLinear(form, slots, rank, modules, { outTables: opts.outTables ?? true, int8Factors: opts.int8Factors === true });
  return buildLlamaGraph(config, {
    // MoE layers: expert LoRA factors in slot tables too (token_slot picks each routed row's), the
    // router a slot linear like the attention projections.
    ...(config.moe === undefined || linear === undefined ? {} : { experts: slotExperts(slots, rank, modules, linear) }),
    name: config.modelType,
    residentKv: true,
    attentionMask: true,
    // Sliding-window attention (Mistral) needs a mask per query; a decode step's one query makes it
    // f32[rows, 1, keys], the same data as a key mask.
    ...(config.slidingWindow === undefined ? {} : { perQueryMask: true }),
    lastLogitsOnly: opts.allLogits !== true,
    // A tied model's head as a parameter of its own (fed the embedding's tensor), so a lane can
    // replace it alone (`modules_to_save: ["lm_head"]`).
    ...(opts.separateHead === true ? { separateHead: true } : {}),
    // The base form: plain linears and experts, no slot inputs (batches whose every row is base).
    ...(linear === undefined ? {} : { linear }),
    // Rotary tables (longrope, per-layer-type bases), the window table's length and Qwen2's q/k/v
    // bias; the families' own structure (norms, fused projections, windows, soft-capping) comes with
    // the config.
    ...familyGraphOptions(config),
  });
}

/** The same graph with parameters (those `which` selects; default all) turned into inputs of the same name (weights fed per run). */
export function paramsToInputs(g: Graph, which: (name: string) => boolean = () => true): Graph {
  return { ...g, nodes: g.nodes.map((n) => (n.kind === 'param' && which(n.name) ? { kind: 'input' as const, name: n.name, operands: n.operands, results: n.results } : n)) };
}
