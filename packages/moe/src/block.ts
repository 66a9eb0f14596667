import type { GraphBuilder, Value } from '@stageml/ir';
import { MoeCode, MoeError } from './errors.js';

/** The expert projections of a fused MoE layer. */
export type ExpertProjection = 'gate_up_proj' | 'down_proj';

/** Low-rank factors of one expert projection for all experts, as graph values. */
export interface ExpertLoraValues {
  /** A of every expert [E, r, in] (with `tokenSlots`: [S·E, r, in], slot-major). */
  readonly A: Value;
  /** B of every expert [E, out, r] (with `tokenSlots`: [S·E, out, r]). */
  readonly B: Value;
  /** Scale s (1 when it is folded into B). */
  readonly scale: number;
  /**
   * Adapter slot of every token, i64[T] (serving engines: many adapters' expert factors in one
   * table). A routed row of token t on expert e then uses the factors at index slot[t]·E + e;
   * slot 0 conventionally holds zeros (base rows).
   */
  readonly tokenSlots?: Value;
}

/** Parameters of one MoE layer (HF Mixtral, fused layout). */
export interface MoeParams {
  /** Router weight [E, H] (unused when `routerLogits` is given). */
  readonly router?: Value;
  /**
   * The router's logits x·Rᵀ [T, E], computed by the caller instead of from `router` (a serving
   * engine adds each row's adapter update to them: router LoRA).
   */
  readonly routerLogits?: Value;
  /** Gate and up projections of every expert [E, 2I, H] (gate rows first, as HF chunks them). */
  readonly gateUp: Value;
  /** Down projection of every expert [E, H, I]. */
  readonly down: Value;
  /** Residual LoRA factors per projection (absent: base experts). */
  readonly lora?: Partial<Readonly<Record<ExpertProjection, ExpertLoraValues>>>;
}

/** Options of `moeBlock`. */
export interface MoeBlockOptions {
  /** Experts per token. */
  readonly topK: number;
  /** Renormalize the top-k routing weights to sum to 1 (Mixtral: true). */
  readonly normalize?: boolean;
}

/** y = x·W_gᵀ + s·(x·A_gᵀ)·B_gᵀ with per-row expert g (grouped). */
function expertLinear(b: GraphBuilder, x: Value, w: Value, experts: Value, token: Value, lora: ExpertLoraValues | undefined): Value {
  const base = b.op('groupedMatmul', [x, w, experts], { transposeW: true });
  if (lora === undefined) return base;
  let groups = experts;
  if (lora.tokenSlots !== undefined) {
    const E = w.type.shape[0]!;
    if (typeof E !== 'number') throw new MoeError(MoeCode.SHAPE_MISMATCH, 'slot-indexed expert factors need a static expert count');
    groups = b.add(b.mul(b.gather(lora.tokenSlots, token, 0), b.scalar(E, experts.type.dtype)), experts);
  }
  const shrink = b.op('groupedMatmul', [x, lora.A, groups], { transposeW: true });
  const expand = b.op('groupedMatmul', [shrink, lora.B, groups], { transposeW: true });
  return b.add(base, lora.scale === 1 ? expand : b.mul(expand, b.scalar(lora.scale, x.type.dtype)));
}

/**
 * A routed mixture-of-experts MLP (Mixtral) over token rows x [T, H]:
 *
 *   p = softmax(x·Rᵀ) (or softmax of the given `routerLogits`); (w, e) = topk(p, k); w ← w / Σw;
 *   y[t] = Σ_j w[t, j] · W2_{e[t,j]} (silu(W1_{e[t,j]} x[t]) ⊙ W3_{e[t,j]} x[t])
 *
 * Execution is grouped, not per token: the T·k (token, slot) rows are gathered once, each expert
 * projection is one `groupedMatmul` (rows grouped by expert), and results are weighted and added
 * back to their tokens with `scatterAdd`. Experts that receive no rows cost nothing.
 */
export function moeBlock(b: GraphBuilder, x: Value, p: MoeParams, opts: MoeBlockOptions): Value {
  const T = x.type.shape[0]!;
  const H = x.type.shape[1]!;
  const k = opts.topK;
  const logits = p.routerLogits ?? (p.router === undefined ? undefined : b.linear(x, p.router));
  if (logits === undefined) throw new MoeError(MoeCode.SHAPE_MISMATCH, 'moeBlock needs a router weight or the router logits');
  const probs = b.softmax(logits, -1);
  const [topW, topE] = b.topk(probs, k, -1);
  const weights = opts.normalize === false ? topW : b.div(topW, b.sum(topW, [-1], true));
  const experts = b.reshape(topE, [-1]);
  const token = b.reshape(b.iota([T, k], 0), [-1]);
  const rows = b.gather(x, token, 0);
  const gateUp = expertLinear(b, rows, p.gateUp, experts, token, p.lora?.gate_up_proj);
  const I = (p.gateUp.type.shape[1] as number) / 2;
  const gate = b.slice(gateUp, 1, 0, I);
  const up = b.slice(gateUp, 1, I);
  const hidden = b.mul(b.silu(gate), up);
  const out = expertLinear(b, hidden, p.down, experts, token, p.lora?.down_proj);
  const weighted = b.mul(out, b.reshape(weights, [-1, 1]));
  const zeros = b.broadcastTo(b.scalar(0, x.type.dtype), [T, H]);
  return b.scatterAdd(zeros, token, weighted, 0);
}
