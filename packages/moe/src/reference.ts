import { type HostTensor, allocData, rounderFor } from '@stageml/ir';
import type { ExpertProjection } from './block.js';
import { MoeCode, MoeError } from './errors.js';

/** Per-expert LoRA factors of one projection as host tensors: delta_e = s·B_e·A_e. */
export interface ReferenceExpertLora {
  /** A of every expert [E, r, in]. */
  readonly A: HostTensor;
  /** B of every expert [E, out, r]. */
  readonly B: HostTensor;
  /** Scale s. */
  readonly scale: number;
}

/** Host tensors of one MoE layer (HF Mixtral fused layout), for the per-token reference. */
export interface ReferenceMoeParams {
  /** Router weight [E, H]. */
  readonly router: HostTensor;
  /** Gate and up projections of every expert [E, 2I, H] (gate rows first). */
  readonly gateUp: HostTensor;
  /** Down projection of every expert [E, H, I]. */
  readonly down: HostTensor;
  /** Per-expert LoRA factors per projection (absent: base experts). */
  readonly lora?: Partial<Readonly<Record<ExpertProjection, ReferenceExpertLora>>>;
}

/** The routing decision of one token: its experts, slot by slot, and their weights. */
export interface TokenRoute {
  /** Expert of each slot. */
  readonly experts: readonly number[];
  /** Weight of each slot. */
  readonly weights: readonly number[];
}

/** Options of `referenceMoe`. */
export interface ReferenceMoeOptions {
  /** Experts per token. */
  readonly topK: number;
  /** Renormalize the top-k weights to sum to 1 (default true, as `moeBlock`). */
  readonly normalize?: boolean;
  /** Routing decisions supplied from outside, one per token (the router is then not run). */
  readonly routes?: readonly TokenRoute[];
}

function dims(t: HostTensor, rank: number, what: string): number[] {
  if (t.shape.length !== rank) throw new MoeError(MoeCode.SHAPE_MISMATCH, `${what} must have rank ${String(rank)}, got [${t.shape.join(', ')}]`);
  return [...t.shape];
}

function expectShape(t: HostTensor, want: readonly number[], what: string): void {
  if (t.shape.length !== want.length || t.shape.some((d, i) => d !== want[i])) {
    throw new MoeError(MoeCode.SHAPE_MISMATCH, `${what} must be [${want.join(', ')}], got [${t.shape.join(', ')}]`);
  }
}

/**
 * Router decisions token by token: logits = x·Rᵀ, p = softmax(logits), the k largest p (ties:
 * lower expert index first, as the `topk` op), renormalized to sum to 1 unless `normalize` is false.
 *
 * NOTE: logits and probabilities are rounded to x's dtype with the same summation order as the
 * `linear` and `softmax` reference kernels, so the oracle picks exactly the experts an fp32 model
 * picks; comparing choices made on f64 probabilities would flip near-ties and test nothing.
 */
export function referenceRoute(x: HostTensor, router: HostTensor, topK: number, normalize = true): TokenRoute[] {
  const [T, H] = dims(x, 2, 'x') as [number, number];
  const [E] = dims(router, 2, 'router') as [number];
  expectShape(router, [E, H], 'router');
  if (!Number.isInteger(topK) || topK < 1 || topK > E) throw new MoeError(MoeCode.SHAPE_MISMATCH, `topK ${String(topK)} must be in [1, ${String(E)}]`);
  const round = rounderFor(x.dtype);
  const routes: TokenRoute[] = [];
  const probs = new Float64Array(E);
  for (let t = 0; t < T; t++) {
    let max = Number.NEGATIVE_INFINITY;
    for (let e = 0; e < E; e++) {
      let acc = 0;
      for (let h = 0; h < H; h++) acc += x.data[t * H + h]! * router.data[e * H + h]!;
      const logit = round(acc);
      probs[e] = logit;
      max = Math.max(max, logit);
    }
    let total = 0;
    for (let e = 0; e < E; e++) {
      const ex = Math.exp(probs[e]! - max);
      probs[e] = ex;
      total += ex;
    }
    for (let e = 0; e < E; e++) probs[e] = round(probs[e]! / total);
    const order = Array.from({ length: E }, (_, e) => e).sort((a, b) => probs[b]! - probs[a]! || a - b);
    const experts = order.slice(0, topK);
    let weights = experts.map((e) => probs[e]!);
    if (normalize) {
      const sum = weights.reduce((a, w) => a + w, 0);
      weights = weights.map((w) => w / sum);
    }
    routes.push({ experts, weights });
  }
  return routes;
}

/** out = W_e·v + s·B_e·(A_e·v) for one expert, accumulated in f64. */
function expertApply(v: Float64Array, w: HostTensor, e: number, lora: ReferenceExpertLora | undefined, out: Float64Array): void {
  const [, outDim, inDim] = w.shape as [number, number, number];
  const base = e * outDim * inDim;
  for (let o = 0; o < outDim; o++) {
    let acc = 0;
    for (let i = 0; i < inDim; i++) acc += w.data[base + o * inDim + i]! * v[i]!;
    out[o] = acc;
  }
  if (lora === undefined) return;
  const r = lora.A.shape[1]!;
  const shrink = new Float64Array(r);
  for (let j = 0; j < r; j++) {
    let acc = 0;
    for (let i = 0; i < inDim; i++) acc += lora.A.data[(e * r + j) * inDim + i]! * v[i]!;
    shrink[j] = acc;
  }
  for (let o = 0; o < outDim; o++) {
    let acc = 0;
    for (let j = 0; j < r; j++) acc += lora.B.data[(e * outDim + o) * r + j]! * shrink[j]!;
    out[o] = out[o]! + lora.scale * acc;
  }
}

function checkLora(lora: ReferenceExpertLora | undefined, E: number, outDim: number, inDim: number, what: string): void {
  if (lora === undefined) return;
  const r = lora.A.shape[1] ?? 0;
  expectShape(lora.A, [E, r, inDim], `${what} lora A`);
  expectShape(lora.B, [E, outDim, r], `${what} lora B`);
}

/**
 * The per-token MoE oracle: for each token separately, route (`referenceRoute`, or the given
 * `routes`), then add w_j · W2_e(silu(W1_e x) ⊙ W3_e x) over its slots j, every expert projection
 * carrying its LoRA delta s·B_e·A_e in low-rank form. Plain loops over host tensors with f64
 * accumulation; the result is rounded to x's dtype once. The grouped IR blocks are tested
 * against it, whatever their plan.
 */
export function referenceMoe(x: HostTensor, p: ReferenceMoeParams, opts: ReferenceMoeOptions): HostTensor {
  const [T, H] = dims(x, 2, 'x') as [number, number];
  const [E, twoI] = dims(p.gateUp, 3, 'gateUp') as [number, number];
  const I = twoI / 2;
  expectShape(p.gateUp, [E, 2 * I, H], 'gateUp');
  expectShape(p.down, [E, H, I], 'down');
  checkLora(p.lora?.gate_up_proj, E, 2 * I, H, 'gate_up_proj');
  checkLora(p.lora?.down_proj, E, H, I, 'down_proj');
  const routes = opts.routes ?? referenceRoute(x, p.router, opts.topK, opts.normalize ?? true);
  if (routes.length !== T) throw new MoeError(MoeCode.SHAPE_MISMATCH, `${String(routes.length)} routes for ${String(T)} tokens`);
  const xt = new Float64Array(H);
  const gu = new Float64Array(2 * I);
  const hidden = new Float64Array(I);
  const out = new Float64Array(H);
  const acc = new Float64Array(T * H);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) xt[h] = x.data[t * H + h]!;
    const { experts, weights } = routes[t]!;
    experts.forEach((e, j) => {
      if (!Number.isInteger(e) || e < 0 || e >= E) throw new MoeError(MoeCode.SHAPE_MISMATCH, `token ${String(t)} slot ${String(j)} routes to expert ${String(e)}, outside [0, ${String(E)})`);
      expertApply(xt, p.gateUp, e, p.lora?.gate_up_proj, gu);
      for (let i = 0; i < I; i++) {
        const g = gu[i]!;
        hidden[i] = (g / (1 + Math.exp(-g))) * gu[I + i]!;
      }
      expertApply(hidden, p.down, e, p.lora?.down_proj, out);
      const w = weights[j]!;
      for (let h = 0; h < H; h++) acc[t * H + h] = acc[t * H + h]! + w * out[h]!;
    });
  }
  const y = allocData(x.dtype, T * H);
  const round = rounderFor(x.dtype);
  for (let i = 0; i < y.length; i++) y[i] = round(acc[i]!);
  return { dtype: x.dtype, shape: [T, H], data: y };
}
