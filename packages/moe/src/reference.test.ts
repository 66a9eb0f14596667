import { GraphBuilder, hostTensor, interpret } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { describe, expect, it } from 'vitest';
import { MoeCode, type MoePlanChoice, buildStagedMoeLayer, moeBlock, referenceMoe, referenceRoute } from './index.js';
import { moeCaseData, stagedValues } from './test-fixtures.js';

const silu = (v: number) => v / (1 + Math.exp(-v));

describe('referenceRoute', () => {
  it('breaks ties toward the lower expert index, as the topk op', () => {
    const x = hostTensor('f32', [2, 3], [1, 2, 3, -1, 0, 4]);
    const router = hostTensor('f32', [4, 3], new Array<number>(12).fill(0));
    const routes = referenceRoute(x, router, 3);
    expect(routes.map((r) => r.experts)).toEqual([[0, 1, 2], [0, 1, 2]]);
    for (const r of routes) for (const w of r.weights) expect(w).toBeCloseTo(1 / 3, 7);
  });

  it('renormalizes the top-k probabilities only when asked', () => {
    const x = hostTensor('f32', [1, 1], [1]);
    const router = hostTensor('f32', [3, 1], [0, Math.log(2), Math.log(4)]);
    const [raw] = referenceRoute(x, router, 2, false);
    expect(raw!.experts).toEqual([2, 1]);
    expect(raw!.weights[0]).toBeCloseTo(4 / 7, 6);
    expect(raw!.weights[1]).toBeCloseTo(2 / 7, 6);
    const [norm] = referenceRoute(x, router, 2);
    expect(norm!.weights[0]).toBeCloseTo(2 / 3, 6);
    expect(norm!.weights[1]).toBeCloseTo(1 / 3, 6);
  });

  it('rejects k outside [1, E] with MOE_SHAPE_MISMATCH', () => {
    const x = hostTensor('f32', [1, 1], [1]);
    expectCode(() => referenceRoute(x, hostTensor('f32', [2, 1], [0, 0]), 3), MoeCode.SHAPE_MISMATCH);
    expectCode(() => referenceRoute(x, hostTensor('f32', [2, 1], [0, 0]), 0), MoeCode.SHAPE_MISMATCH);
  });
});

describe('referenceMoe', () => {
  it('computes Σ_j w_j · W2_e(silu(W1_e x) ⊙ W3_e x) with the LoRA delta, by hand on one token', () => {
    // E = 2, H = 1, I = 1, k = 1; the router prefers expert 1.
    const x = hostTensor('f32', [1, 1], [2]);
    const router = hostTensor('f32', [2, 1], [0, 1]);
    const gateUp = hostTensor('f32', [2, 2, 1], [9, 9, 0.5, -1.5]);
    const down = hostTensor('f32', [2, 1, 1], [9, 3]);
    const A = hostTensor('f32', [2, 1, 1], [9, 0.25]);
    const B = hostTensor('f32', [2, 2, 1], [9, 9, 2, 1]);
    const y = referenceMoe(x, { router, gateUp, down, lora: { gate_up_proj: { A, B, scale: 2 } } }, { topK: 1 });
    // Expert 1: gate = 0.5·2 + 2·(2·(0.25·2)) = 3, up = −1.5·2 + 2·(1·(0.25·2)) = −2.
    expect(y.data[0]).toBeCloseTo(3 * silu(3) * -2, 5);
  });

  it('matches the original materialized-vs-dynamic case (E=4, k=2, T=7, ranks 2 and 3, routes [t%4, (t+1)%4] at 0.5/0.5)', () => {
    const c = { T: 7, H: 8, I: 3, E: 4, k: 2, ranks: { gate_up_proj: 2, down_proj: 3 }, scale: 1.5, mode: 'router' as const, favourite: 0, seed: 0 };
    const d = moeCaseData(c);
    const routes = Array.from({ length: 7 }, (_, t) => ({ experts: [t % 4, (t + 1) % 4], weights: [0.5, 0.5] }));
    const all = new Array<MoePlanChoice>(4).fill('materialize');
    const plan = { gate_up_proj: all, down_proj: all };
    const layer = buildStagedMoeLayer({ tokens: 7, hidden: 8, intermediate: 3, numExperts: 4, topK: 2, lora: { gate_up_proj: { rank: 2, scale: 1.5 }, down_proj: { rank: 3, scale: 1.5 } }, routingInputs: true }, plan);
    const { weights, inputs } = stagedValues({ ...d, routes });
    const got = interpret(layer.graph, { weights, inputs })['y']!;
    expect(got).toBeAllclose(referenceMoe(d.x, d.params, { topK: 2, routes }), { rtol: 1e-5, atol: 1e-5 });
  });

  it('agrees with moeBlock at T = 1', () => {
    const c = { T: 1, H: 5, I: 4, E: 3, k: 2, ranks: { gate_up_proj: 2 }, scale: 2, mode: 'router' as const, favourite: 0, seed: 7 };
    const d = moeCaseData(c);
    const l = d.params.lora!.gate_up_proj!;
    const b = new GraphBuilder('t1');
    const x = b.input('x', ['f32', [1, 5]]);
    const y = moeBlock(b, x, { router: b.param('r', ['f32', [3, 5]]), gateUp: b.param('gu', ['f32', [3, 8, 5]]), down: b.param('dn', ['f32', [3, 5, 4]]), lora: { gate_up_proj: { A: b.param('A', ['f32', [3, 2, 5]]), B: b.param('B', ['f32', [3, 8, 2]]), scale: 2 } } }, { topK: 2 });
    b.output('y', y);
    const got = interpret(b.build(), { inputs: { x: d.x }, weights: { r: d.params.router, gu: d.params.gateUp, dn: d.params.down, A: l.A, B: l.B } })['y']!;
    expect(got).toBeAllclose(referenceMoe(d.x, d.params, { topK: 2 }), { rtol: 1e-4, atol: 1e-5 });
  });

  it('rejects mis-shaped tensors and out-of-range routes with MOE_SHAPE_MISMATCH', () => {
    const d = moeCaseData({ T: 2, H: 3, I: 2, E: 2, k: 1, ranks: { down_proj: 1 }, scale: 1, mode: 'router', favourite: 0, seed: 1 });
    expectCode(() => referenceMoe(hostTensor('f32', [2, 4], new Array<number>(8).fill(0)), d.params, { topK: 1 }), MoeCode.SHAPE_MISMATCH);
    expectCode(() => referenceMoe(d.x, { ...d.params, down: d.params.gateUp }, { topK: 1 }), MoeCode.SHAPE_MISMATCH);
    const badLora = { down_proj: { A: d.params.lora!.down_proj!.A, B: d.params.lora!.down_proj!.A, scale: 1 } };
    expectCode(() => referenceMoe(d.x, { ...d.params, lora: badLora }, { topK: 1 }), MoeCode.SHAPE_MISMATCH);
    expectCode(() => referenceMoe(d.x, d.params, { topK: 1, routes: [{ experts: [0], weights: [1] }] }), MoeCode.SHAPE_MISMATCH);
    const far = [{ experts: [0], weights: [1] }, { experts: [2], weights: [1] }];
    expectCode(() => referenceMoe(d.x, d.params, { topK: 1, routes: far }), MoeCode.SHAPE_MISMATCH);
  });
});
