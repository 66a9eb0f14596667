import { type AnnotationSpec, SERVING_STAGES, type StageLattice } from '@stageml/annotations';
import { type Graph, GraphBuilder, type Value } from '@stageml/ir';
import type { ExpertProjection } from './block.js';
import { EXPERT_PROJECTIONS, type LayerPlan } from './plan.js';
import { type MoeRouting, type PlannedExpertLora, moeBlockWithPlan } from './plan-block.js';

/** Sizes and adapter ranks of one staged MoE layer. */
export interface StagedMoeLayerSpec {
  /** Token rows T. */
  readonly tokens: number;
  /** Hidden size H. */
  readonly hidden: number;
  /** Expert intermediate size I. */
  readonly intermediate: number;
  /** Experts E. */
  readonly numExperts: number;
  /** Experts per token k. */
  readonly topK: number;
  /** Renormalize the top-k weights (default true). */
  readonly normalize?: boolean;
  /** Rank and scale of the adapter's factors per projection (absent: no LoRA on it). */
  readonly lora?: Partial<Readonly<Record<ExpertProjection, { readonly rank: number; readonly scale: number }>>>;
  /** Take the routing decisions as inputs bound at `routing` instead of running the router on x. */
  readonly routingInputs?: boolean;
}

/** A MoE layer graph with the stage of each of its leaves on the serving chain. */
export interface StagedMoeLayer {
  /** The layer: output `y` [T, H]. */
  readonly graph: Graph;
  /** The serving chain `base < adapter < tenant < request < routing < token`. */
  readonly lattice: StageLattice;
  /** Exact stage of every input and parameter (see `moeLeafName`). */
  readonly annotations: AnnotationSpec;
}

/**
 * Names of a staged layer's leaves, with their stage:
 * `x` (token); `routing.experts` i64 [T, k] and `routing.weights` [T, k] (routing);
 * `experts.router` [E, H], `experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]
 * (base); `adapter.<projection>.lora_A|lora_B` (adapter); `late.<projection>.lora_A|lora_B`
 * (request: fallback factors).
 */
export function moeLeafName(kind: 'adapter' | 'late', projection: ExpertProjection, tensor: 'lora_A' | 'lora_B'): string {
  return `${kind}.${projection}.${tensor}`;
}

/**
 * Builds one MoE layer as `moeBlockWithPlan` under `plan` and annotates it on the six-stage
 * serving chain: expert and router weights at `base`, the adapter's factors at `adapter` (only
 * declared when some expert is materialized or residual), fallback factors as late inputs at
 * `request`, routing decisions at `routing` (with `routingInputs`), tokens at `token`.
 * Specializing at `adapter` then folds merged expert stacks into constants and keeps residual
 * experts low-rank.
 */
export function buildStagedMoeLayer(spec: StagedMoeLayerSpec, plan: LayerPlan, name = 'moe_layer'): StagedMoeLayer {
  const { tokens: T, hidden: H, intermediate: I, numExperts: E, topK: k } = spec;
  const b = new GraphBuilder(name);
  const inputs: Record<string, string> = {};
  const params: Record<string, string> = {};
  const input = (n: string, dtype: 'f32' | 'i64', shape: number[], stage: string): Value => {
    inputs[n] = stage;
    return b.input(n, [dtype, shape]);
  };
  const param = (n: string, shape: number[], stage: string): Value => {
    params[n] = stage;
    return b.param(n, ['f32', shape]);
  };
  const x = input('x', 'f32', [T, H], 'token');
  let routing: MoeRouting | undefined;
  if (spec.routingInputs === true) {
    routing = { experts: input('routing.experts', 'i64', [T, k], 'routing'), weights: input('routing.weights', 'f32', [T, k], 'routing') };
  }
  const router = routing === undefined ? param('experts.router', [E, H], 'base') : undefined;
  const gateUp = param('experts.gate_up_proj', [E, 2 * I, H], 'base');
  const down = param('experts.down_proj', [E, H, I], 'base');
  const dims: Record<ExpertProjection, [number, number]> = { gate_up_proj: [2 * I, H], down_proj: [H, I] };
  const lora: Partial<Record<ExpertProjection, PlannedExpertLora>> = {};
  for (const projection of EXPERT_PROJECTIONS) {
    const l = spec.lora?.[projection];
    if (l === undefined) continue;
    // NOTE: factors without choices reach moeBlockWithPlan as `{ scale }`, which it rejects
    // (MOE_BAD_PLAN) rather than silently dropping the adapter's delta.
    const choices = plan[projection] ?? [];
    const [outDim, inDim] = dims[projection];
    const needEarly = choices.some((c) => c !== 'fallback');
    const needLate = choices.includes('fallback');
    lora[projection] = {
      scale: l.scale,
      ...(needEarly
        ? { factors: { A: param(moeLeafName('adapter', projection, 'lora_A'), [E, l.rank, inDim], 'adapter'), B: param(moeLeafName('adapter', projection, 'lora_B'), [E, outDim, l.rank], 'adapter') } }
        : {}),
      ...(needLate
        ? {
            late: {
              A: input(moeLeafName('late', projection, 'lora_A'), 'f32', [E, l.rank, inDim], 'request'),
              B: input(moeLeafName('late', projection, 'lora_B'), 'f32', [E, outDim, l.rank], 'request'),
            },
          }
        : {}),
    };
  }
  const y = moeBlockWithPlan(b, x, { ...(router === undefined ? {} : { router }), gateUp, down, lora }, plan, {
    topK: k,
    normalize: spec.normalize ?? true,
    ...(routing === undefined ? {} : { routing }),
  });
  b.output('y', y);
  return { graph: b.build(), lattice: SERVING_STAGES, annotations: { inputs, params } };
}
