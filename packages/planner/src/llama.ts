import type { DType } from '@stageml/ir';
import { LLAMA_PROJECTIONS, type LlamaConfig } from '@stageml/models';
import { EXPERT_PROJECTIONS, expertLoraFor } from '@stageml/moe';
import { type LoraAdapter, scalingFor } from '@stageml/peft';
import { PlanCode, PlanError } from './errors.js';
import type { AdapterWorkload, PlanKind, UnitGroup, Workload } from './workload.js';

/** Request shape and element type of a workload built from a model. */
export interface ModelWorkloadOptions {
  /** Element type of weights and factors (default f32, the dtype `@stageml/models` builds graphs in). */
  readonly dtype?: DType;
  /** Requests per step (default 8). */
  readonly batch?: number;
  /** Rows per request per step (default 128). */
  readonly seq?: number;
  /** Free-text model label. */
  readonly model?: string;
  /** Restricts the kinds of some units (e.g. the quantization gate); called once per group, returning undefined for all kinds. */
  readonly allowed?: (adapter: string, group: Omit<UnitGroup, 'allowed'>) => readonly PlanKind[] | undefined;
}

/** Kinds a MoE expert unit can take: the `stageml.moe-plan` choices (experts have no bank form). */
export const MOE_UNIT_KINDS: readonly PlanKind[] = ['materialize', 'residual', 'fallback'];

const MODULE = /^model\.layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)$/;

function group(base: Omit<UnitGroup, 'layers' | 'allowed'>, layers: number[], allowed: readonly PlanKind[] | undefined): UnitGroup {
  return allowed === undefined ? { ...base, layers } : { ...base, layers, allowed };
}

/** The projections an adapter may target: Llama's seven and Phi-3's fused `qkv_proj` / `gate_up_proj`. */
const PROJECTIONS: readonly string[] = [...LLAMA_PROJECTIONS, 'qkv_proj', 'gate_up_proj'];

/**
 * The planning workload of a Llama-family model (Mixtral included) and its PEFT adapters: one unit
 * per (adapter, layer, projection) the adapter targets, in/out and rank read from the factors
 * (so `rank_pattern` is honoured), grouped by (projection, shape, rank) across layers; for MoE
 * layers one unit per expert of `gate_up_proj`/`down_proj`, with row share top-k / E. Modules
 * other than the decoder projections (Llama's seven, Phi-3's fused two) are `PLAN_BAD_WORKLOAD`.
 */
export function llamaWorkload(config: LlamaConfig, adapters: readonly LoraAdapter[], opts: ModelWorkloadOptions = {}): Workload {
  const out: AdapterWorkload[] = [];
  for (const adapter of adapters) {
    const byKey = new Map<string, { base: Omit<UnitGroup, 'layers' | 'allowed'>; layers: number[] }>();
    const add = (base: Omit<UnitGroup, 'layers' | 'allowed'>, layer: number): void => {
      const key = `${base.projection}|${String(base.inFeatures)}|${String(base.outFeatures)}|${String(base.rank)}`;
      const e = byKey.get(key) ?? { base, layers: [] };
      e.layers.push(layer);
      byKey.set(key, e);
    };
    for (const m of adapter.modules.values()) {
      const match = MODULE.exec(m.module);
      const projection = match?.[2];
      if (match === null || projection === undefined || !PROJECTIONS.includes(projection)) {
        throw new PlanError(
          PlanCode.BAD_WORKLOAD,
          `adapter '${adapter.name}': module '${m.module}' is not a decoder projection (model.layers.N.{self_attn,mlp}.{${PROJECTIONS.join(',')}})`,
        );
      }
      add(
        {
          projection,
          inFeatures: m.A.shape[1]!,
          outFeatures: m.B.shape[0]!,
          rank: m.rank,
        },
        Number(match[1]),
      );
    }
    if (config.moe !== undefined) {
      const shapes = {
        numExperts: config.moe.numExperts,
        hidden: config.hiddenSize,
        intermediate: config.moe.intermediateSize ?? config.intermediateSize,
      };
      for (let l = 0; l < config.numLayers; l++) {
        const path = `model.layers.${String(l)}.mlp.experts`;
        for (const e of expertLoraFor(adapter, path, shapes, scalingFor(adapter.config, path))) {
          add(
            {
              projection: e.projection,
              inFeatures: e.A.shape[2]!,
              outFeatures: e.B.shape[1]!,
              rank: e.rank,
              experts: shapes.numExperts,
              rowShare: config.moe.topK / shapes.numExperts,
            },
            l,
          );
        }
      }
    }
    const order = (g: Omit<UnitGroup, 'layers' | 'allowed'>): number =>
      (g.experts === undefined ? PROJECTIONS : (EXPERT_PROJECTIONS as readonly string[])).indexOf(g.projection);
    const entries = [...byKey.values()].sort((a, b) => (a.base.experts ?? 0) - (b.base.experts ?? 0) || order(a.base) - order(b.base) || a.base.rank - b.base.rank);
    const groups = entries.map(({ base, layers }) => {
      const sorted = layers.sort((a, b) => a - b);
      const custom = opts.allowed?.(adapter.name, { ...base, layers: sorted });
      const moe = base.experts === undefined ? undefined : MOE_UNIT_KINDS;
      return group(base, sorted, moe === undefined ? custom : custom === undefined ? moe : custom.filter((k) => moe.includes(k)));
    });
    out.push({ name: adapter.name, groups });
  }
  return {
    ...(opts.model === undefined ? {} : { model: opts.model }),
    dtype: opts.dtype ?? 'f32',
    batch: opts.batch ?? 8,
    seq: opts.seq ?? 128,
    adapters: out,
  };
}
