import { type Dim, type GraphBuilder, type Value, dimEquals, dimToString, shapeToString } from '@stageml/ir';
import type { ExpertProjection, MoeBlockOptions } from './block.js';
import { MoeCode, MoeError } from './errors.js';
import { EXPERT_PROJECTIONS, type LayerPlan, type MoePlanChoice } from './plan.js';

/** A pair of stacked per-expert factors: A [E, r, in], B [E, out, r]. */
export interface ExpertFactorValues {
  /** A of every expert [E, r, in]. */
  readonly A: Value;
  /** B of every expert [E, out, r]. */
  readonly B: Value;
}

/** One projection's LoRA for a planned block, split by binding time. */
export interface PlannedExpertLora {
  /** Scale s. */
  readonly scale: number;
  /** Factors bound at the `adapter` stage; required when any expert is `materialize` or `residual`. */
  readonly factors?: ExpertFactorValues;
  /** Factors bound late (request time); required when any expert is `fallback`. */
  readonly late?: ExpertFactorValues;
}

/** Parameters of a planned MoE layer (HF Mixtral fused layout). */
export interface MoePlanParams {
  /** Router weight [E, H]; required unless the routing is given. */
  readonly router?: Value;
  /** Gate and up projections of every expert [E, 2I, H] (gate rows first). */
  readonly gateUp: Value;
  /** Down projection of every expert [E, H, I]. */
  readonly down: Value;
  /** Per-projection LoRA; a projection has factors exactly when the layer plan has choices for it. */
  readonly lora?: Partial<Readonly<Record<ExpertProjection, PlannedExpertLora>>>;
}

/** Routing decisions of T tokens over k slots. */
export interface MoeRouting {
  /** Expert of each (token, slot), integer [T, k]. */
  readonly experts: Value;
  /** Weight of each (token, slot) [T, k]. */
  readonly weights: Value;
}

/** Options of `moeBlockWithPlan`. */
export interface MoePlanBlockOptions extends MoeBlockOptions {
  /** Routing decisions computed elsewhere (e.g. bound at the `routing` stage); `normalize` then does not apply. */
  readonly routing?: MoeRouting;
}

/** The router of `moeBlock`: p = softmax(x·Rᵀ), (w, e) = topk(p, k), w ← w / Σw unless `normalize` is false. */
export function routeTokens(b: GraphBuilder, x: Value, router: Value, opts: MoeBlockOptions): MoeRouting {
  const probs = b.softmax(b.linear(x, router), -1);
  const [topW, experts] = b.topk(probs, opts.topK, -1);
  return { experts, weights: opts.normalize === false ? topW : b.div(topW, b.sum(topW, [-1], true)) };
}

function indicesOf(choices: readonly MoePlanChoice[], choice: MoePlanChoice): number[] {
  return choices.flatMap((c, e) => (c === choice ? [e] : []));
}

/** A with every expert outside `keep` zeroed, so the low-rank path adds nothing for them. */
function keepExperts(b: GraphBuilder, A: Value, keep: readonly number[], E: number, name: string): Value {
  if (keep.length === E) return A;
  const mask = Array.from({ length: E }, (_, e) => (keep.includes(e) ? 1 : 0));
  return b.op('mul', [A, b.constant(mask, A.type.dtype, [E, 1, 1])], undefined, { name });
}

function checkFactors(f: ExpertFactorValues | undefined, need: boolean, E: number, outDim: Dim, inDim: Dim, what: string): ExpertFactorValues | undefined {
  if (!need) return undefined;
  if (f === undefined) throw new MoeError(MoeCode.BAD_PLAN, `the layer plan needs ${what} factors, but none were given`);
  const a = f.A.type.shape;
  const bs = f.B.type.shape;
  const ok = a.length === 3 && bs.length === 3 && dimEquals(a[0]!, E) && dimEquals(bs[0]!, E) && dimEquals(a[2]!, inDim) && dimEquals(bs[1]!, outDim) && dimEquals(bs[2]!, a[1]!);
  if (!ok) {
    throw new MoeError(MoeCode.SHAPE_MISMATCH, `${what}: A ${shapeToString(a)} and B ${shapeToString(bs)} are not [${String(E)}, r, ${dimToString(inDim)}] and [${String(E)}, ${dimToString(outDim)}, r]`);
  }
  return f;
}

/**
 * y = x·W_gᵀ for rows grouped by expert g, with each expert's delta applied as the plan says:
 * merged into W (materialize), or added as s·(x·A_gᵀ)·B_gᵀ from adapter-stage factors (residual)
 * or late factors (fallback), each factor stack zeroed outside its experts so no delta counts twice.
 */
function plannedLinear(b: GraphBuilder, x: Value, w: Value, groups: Value, projection: ExpertProjection, choices: readonly MoePlanChoice[] | undefined, lora: PlannedExpertLora | undefined): Value {
  const E = w.type.shape[0] as number;
  if (choices === undefined && lora === undefined) return b.op('groupedMatmul', [x, w, groups], { transposeW: true });
  if (choices === undefined) throw new MoeError(MoeCode.BAD_PLAN, `${projection} has LoRA factors but the layer plan has no choices for it`);
  if (lora === undefined) throw new MoeError(MoeCode.BAD_PLAN, `the layer plan has choices for ${projection} but no LoRA factors were given`);
  if (choices.length !== E) throw new MoeError(MoeCode.BAD_PLAN, `the layer plan has ${String(choices.length)} choices for ${projection} but the layer has ${String(E)} experts`);
  const mat = indicesOf(choices, 'materialize');
  const res = indicesOf(choices, 'residual');
  const fb = indicesOf(choices, 'fallback');
  const outDim = w.type.shape[1]!;
  const inDim = w.type.shape[2]!;
  const early = checkFactors(lora.factors, mat.length + res.length > 0, E, outDim, inDim, `${projection} adapter-stage`);
  const late = checkFactors(lora.late, fb.length > 0, E, outDim, inDim, `${projection} late (fallback)`);
  const s = b.scalar(lora.scale, w.type.dtype);
  let weight = w;
  if (early !== undefined && mat.length > 0) {
    // W + s·B·A over the materialized experts only, scattered into the base stack: known at the
    // adapter stage, so specialization folds it once.
    const name = `${projection}.merged`;
    if (mat.length === E) weight = b.op('add', [w, b.mul(b.matmul(early.B, early.A), s)], undefined, { name });
    else {
      const idx = b.constant(mat, 'i64', [mat.length]);
      const delta = b.mul(b.matmul(b.gather(early.B, idx, 0), b.gather(early.A, idx, 0)), s);
      weight = b.op('scatterAdd', [w, idx, delta], { axis: 0 }, { name });
    }
  }
  let y = b.op('groupedMatmul', [x, weight, groups], { transposeW: true });
  const lowRank = (f: ExpertFactorValues, keep: readonly number[], kind: string): void => {
    const A = keepExperts(b, f.A, keep, E, `${projection}.${kind}.lora_A`);
    const shrink = b.op('groupedMatmul', [x, A, groups], { transposeW: true });
    y = b.add(y, b.mul(b.op('groupedMatmul', [shrink, f.B, groups], { transposeW: true }), s));
  };
  if (early !== undefined && res.length > 0) lowRank(early, res, 'residual');
  if (late !== undefined) lowRank(late, fb, 'fallback');
  return y;
}

/**
 * A routed MoE MLP (as `moeBlock`) whose per-expert LoRA runs exactly as the layer plan says, for
 * each projection and expert: `materialize` folds W_e + s·B_e·A_e into the expert stack,
 * `residual` keeps s·B_e·(A_e·x) for that expert from adapter-stage factors, `fallback` applies
 * the late factors. Every expert projection is a `groupedMatmul` over the T·k (token, slot) rows —
 * one for the (possibly merged) weights, two per low-rank path present — never a loop over tokens.
 * With `opts.routing`, expert assignment and weights are inputs rather than the router's output.
 *
 * Throws `MOE_BAD_PLAN` when plan and factors disagree (choices without factors, factors without
 * choices, a choice count other than E) and `MOE_SHAPE_MISMATCH` for mis-shaped factors or routing.
 */
export function moeBlockWithPlan(b: GraphBuilder, x: Value, p: MoePlanParams, plan: LayerPlan, opts: MoePlanBlockOptions): Value {
  const T = x.type.shape[0]!;
  const H = x.type.shape[1]!;
  const k = opts.topK;
  let routing = opts.routing;
  if (routing === undefined) {
    if (p.router === undefined) throw new MoeError(MoeCode.SHAPE_MISMATCH, 'moeBlockWithPlan needs a router weight or the routing');
    routing = routeTokens(b, x, p.router, opts);
  }
  for (const [what, v] of [['experts', routing.experts], ['weights', routing.weights]] as const) {
    if (v.type.shape.length !== 2 || !dimEquals(v.type.shape[0]!, T) || !dimEquals(v.type.shape[1]!, k)) {
      throw new MoeError(MoeCode.SHAPE_MISMATCH, `routing ${what} must be [${dimToString(T)}, ${String(k)}], got ${shapeToString(v.type.shape)}`);
    }
  }
  const experts = b.reshape(routing.experts, [-1]);
  const token = b.reshape(b.iota([T, k], 0), [-1]);
  const rows = b.gather(x, token, 0);
  for (const key of Object.keys(plan)) {
    if (!EXPERT_PROJECTIONS.includes(key as ExpertProjection)) throw new MoeError(MoeCode.BAD_PLAN, `the layer plan names an unknown projection '${key}'`);
  }
  const gateUp = plannedLinear(b, rows, p.gateUp, experts, 'gate_up_proj', plan.gate_up_proj, p.lora?.gate_up_proj);
  const I = (p.gateUp.type.shape[1] as number) / 2;
  const hidden = b.mul(b.silu(b.slice(gateUp, 1, 0, I)), b.slice(gateUp, 1, I));
  const out = plannedLinear(b, hidden, p.down, experts, 'down_proj', plan.down_proj, p.lora?.down_proj);
  const weighted = b.mul(out, b.reshape(routing.weights, [-1, 1]));
  return b.scatterAdd(b.broadcastTo(b.scalar(0, x.type.dtype), [T, H]), token, weighted, 0);
}
