// Test support for this package's suites (not exported from the package): seeded MoE layers with
// adversarial routings, and their values under the leaf names of `buildStagedMoeLayer`.
import { type HostTensor, hostTensor, seededRandom } from '@stageml/ir';
import type { ExpertProjection } from './block.js';
import type { ReferenceMoeParams, TokenRoute } from './reference.js';
import { moeLeafName } from './staging.js';

/**
 * How a test case routes its tokens: `router` (random router), `forced` (the router strongly
 * prefers one expert for every token), `ties` (an all-zero router: uniform probabilities, so the
 * lowest k experts win every tie), `inputs` (random expert assignments, repeats allowed, given as
 * routing inputs).
 */
export type RoutingMode = 'router' | 'forced' | 'ties' | 'inputs';

/** Sizes, ranks and routing of one MoE test case. */
export interface MoeCase {
  /** Tokens. */
  readonly T: number;
  /** Hidden size. */
  readonly H: number;
  /** Expert intermediate size. */
  readonly I: number;
  /** Experts. */
  readonly E: number;
  /** Experts per token. */
  readonly k: number;
  /** LoRA rank per projection (absent: no LoRA on it). */
  readonly ranks: Partial<Readonly<Record<ExpertProjection, number>>>;
  /** LoRA scale. */
  readonly scale: number;
  /** Routing mode. */
  readonly mode: RoutingMode;
  /** The expert `forced` routing prefers. */
  readonly favourite: number;
  /** Data seed. */
  readonly seed: number;
}

/** Host data of a test case. */
export interface MoeCaseData {
  /** Tokens [T, H]. */
  readonly x: HostTensor;
  /** Layer parameters and factors. */
  readonly params: ReferenceMoeParams;
  /** Routing decisions (mode `inputs` only). */
  readonly routes?: readonly TokenRoute[];
}

/** Seeded data for `c`, uniform in [−1, 1] unless the routing mode shapes it. */
export function moeCaseData(c: MoeCase): MoeCaseData {
  const rnd = seededRandom(c.seed);
  const uniform = (shape: readonly number[], amp = 1): HostTensor => hostTensor('f32', shape, Array.from({ length: shape.reduce((a, d) => a * d, 1) }, () => (2 * rnd() - 1) * amp));
  const x = uniform([c.T, c.H]);
  let router = uniform([c.E, c.H]);
  if (c.mode === 'ties') router = hostTensor('f32', [c.E, c.H], new Array<number>(c.E * c.H).fill(0));
  if (c.mode === 'forced') {
    // Feature 0 of every token is 1 and only the favourite reads it with weight 40, while all
    // other router terms sum to at most H/2: the favourite wins every token by a wide margin.
    for (let t = 0; t < c.T; t++) x.data[t * c.H] = 1;
    router = uniform([c.E, c.H], 0.5);
    for (let e = 0; e < c.E; e++) router.data[e * c.H] = e === c.favourite ? 40 : 0;
  }
  const lora: Partial<Record<ExpertProjection, { A: HostTensor; B: HostTensor; scale: number }>> = {};
  const dims: Record<ExpertProjection, [number, number]> = { gate_up_proj: [2 * c.I, c.H], down_proj: [c.H, c.I] };
  for (const p of ['gate_up_proj', 'down_proj'] as const) {
    const r = c.ranks[p];
    if (r === undefined) continue;
    const [outDim, inDim] = dims[p];
    lora[p] = { A: uniform([c.E, r, inDim]), B: uniform([c.E, outDim, r]), scale: c.scale };
  }
  const params: ReferenceMoeParams = { router, gateUp: uniform([c.E, 2 * c.I, c.H]), down: uniform([c.E, c.H, c.I]), lora };
  if (c.mode !== 'inputs') return { x, params };
  const routes = Array.from({ length: c.T }, () => ({
    experts: Array.from({ length: c.k }, () => Math.floor(rnd() * c.E)),
    weights: Array.from({ length: c.k }, () => Math.fround(rnd())),
  }));
  return { x, params, routes };
}

/** Values of a case under `buildStagedMoeLayer`'s leaf names: weights (base, adapter) and inputs (request, routing, token). */
export function stagedValues(d: MoeCaseData): { weights: Record<string, HostTensor>; inputs: Record<string, HostTensor> } {
  const weights: Record<string, HostTensor> = { 'experts.router': d.params.router, 'experts.gate_up_proj': d.params.gateUp, 'experts.down_proj': d.params.down };
  const inputs: Record<string, HostTensor> = { x: d.x };
  for (const p of ['gate_up_proj', 'down_proj'] as const) {
    const l = d.params.lora?.[p];
    if (l === undefined) continue;
    weights[moeLeafName('adapter', p, 'lora_A')] = l.A;
    weights[moeLeafName('adapter', p, 'lora_B')] = l.B;
    inputs[moeLeafName('late', p, 'lora_A')] = l.A;
    inputs[moeLeafName('late', p, 'lora_B')] = l.B;
  }
  if (d.routes !== undefined) {
    const T = d.routes.length;
    const k = d.routes[0]?.experts.length ?? 0;
    inputs['routing.experts'] = hostTensor('i64', [T, k], d.routes.flatMap((r) => r.experts));
    inputs['routing.weights'] = hostTensor('f32', [T, k], d.routes.flatMap((r) => r.weights));
  }
  return { weights, inputs };
}
