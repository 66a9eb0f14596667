import { fc, test } from '@fast-check/vitest';
import { analyzeBindingTimes, annotate } from '@stageml/annotations';
import { type Graph, type HostTensor, graphInputs, graphOps, interpret } from '@stageml/ir';
import { specialize } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { type ExpertProjection, type LayerPlan, MOE_PLAN_CHOICES, type MoePlanChoice, buildStagedMoeLayer, referenceMoe } from './index.js';
import { type MoeCase, moeCaseData, stagedValues } from './test-fixtures.js';

const TOL = { rtol: 1e-4, atol: 1e-5 };
const CASE: MoeCase = { T: 5, H: 6, I: 4, E: 4, k: 2, ranks: { gate_up_proj: 2, down_proj: 3 }, scale: 1.5, mode: 'router', favourite: 0, seed: 11 };
const MIXED: LayerPlan = { gate_up_proj: ['materialize', 'residual', 'fallback', 'materialize'], down_proj: ['residual', 'materialize', 'residual', 'fallback'] };

function layerOf(c: MoeCase, plan: LayerPlan) {
  const lora = Object.fromEntries(Object.entries(c.ranks).map(([p, rank]) => [p, { rank, scale: c.scale }]));
  return buildStagedMoeLayer({ tokens: c.T, hidden: c.H, intermediate: c.I, numExperts: c.E, topK: c.k, lora, routingInputs: c.mode === 'inputs' }, plan);
}

/** Stage name of the value called `name`. */
function stageOf(g: Graph, stages: Int32Array, lattice: { name(i: number): string }, name: string): string {
  const id = g.values.findIndex((v) => v.name === name);
  expect(id, `no value named ${name}`).toBeGreaterThanOrEqual(0);
  return lattice.name(stages[id]!);
}

/** Values of the ops of `key` in g, with their stage names. */
function opStages(g: Graph, stages: Int32Array, lattice: { name(i: number): string }, key: string): string[] {
  return graphOps(g)
    .filter((n) => n.op === key)
    .map((n) => lattice.name(stages[n.results[0]!]!));
}

/** W_e + s·B_e·A_e on `experts`, W_e elsewhere, as a flat array. */
function merged(W: HostTensor, A: HostTensor, B: HostTensor, s: number, experts: readonly number[]): number[] {
  const [, out, inDim] = W.shape as [number, number, number];
  const r = A.shape[1]!;
  const y = Array.from(W.data);
  for (const e of experts) for (let o = 0; o < out; o++) for (let i = 0; i < inDim; i++) {
    let acc = 0;
    for (let j = 0; j < r; j++) acc += B.data[(e * out + o) * r + j]! * A.data[(e * r + j) * inDim + i]!;
    y[(e * out + o) * inDim + i]! += s * acc;
  }
  return y;
}

describe('buildStagedMoeLayer: binding times on base < adapter < tenant < request < routing < token', () => {
  it('puts merged experts and residual factors at adapter, fallback at request, routing and experts at token', () => {
    const { graph, lattice, annotations } = layerOf(CASE, MIXED);
    const bt = analyzeBindingTimes(graph, annotate(graph, lattice, annotations));
    const at = (name: string) => stageOf(graph, bt.valueStage, lattice, name);
    expect(at('gate_up_proj.merged')).toBe('adapter');
    expect(at('down_proj.merged')).toBe('adapter');
    expect(at('gate_up_proj.residual.lora_A')).toBe('adapter');
    expect(at('gate_up_proj.fallback.lora_A')).toBe('request');
    expect(at('experts.gate_up_proj')).toBe('base');
    // The router runs on the tokens, so routing and every grouped GEMM are token-time work.
    expect(opStages(graph, bt.valueStage, lattice, 'topk')).toEqual(['token']);
    expect(new Set(opStages(graph, bt.valueStage, lattice, 'groupedMatmul'))).toEqual(new Set(['token']));
  });

  it('with routing inputs, puts routing-only work at routing and expert work at token', () => {
    const { graph, lattice, annotations } = layerOf({ ...CASE, mode: 'inputs' }, MIXED);
    expect(annotations.inputs).toMatchObject({ 'routing.experts': 'routing', 'routing.weights': 'routing', x: 'token' });
    const bt = analyzeBindingTimes(graph, annotate(graph, lattice, annotations));
    const reshapes = graphOps(graph).filter((n) => n.op === 'reshape' && graph.values[n.operands[0]!]!.name.startsWith('routing.'));
    expect(reshapes).toHaveLength(2);
    for (const n of reshapes) expect(lattice.name(bt.valueStage[n.results[0]!]!)).toBe('routing');
    expect(new Set(opStages(graph, bt.valueStage, lattice, 'groupedMatmul'))).toEqual(new Set(['token']));
    expect(opStages(graph, bt.valueStage, lattice, 'topk')).toEqual([]);
  });
});

describe('specialize at adapter', () => {
  const d = moeCaseData(CASE);
  const { weights, inputs } = stagedValues(d);
  const layer = layerOf(CASE, MIXED);
  const r = specialize(layer.graph, { lattice: layer.lattice, annotations: layer.annotations, cutoff: 'adapter', values: weights });

  it('folds materialized experts into constant stacks once', () => {
    expect(graphOps(r.residual).filter((n) => n.op === 'matmul')).toEqual([]);
    const gu = d.params.lora!.gate_up_proj!;
    const want = merged(d.params.gateUp, gu.A, gu.B, 1.5, [0, 3]);
    expect(r.constants['gate_up_proj.merged']!).toBeAllclose({ dtype: 'f32', shape: [4, 8, 6], data: Float32Array.from(want) }, { rtol: 1e-6, atol: 1e-6 });
    // Experts 1 and 2 are not materialized: their base weights pass through bit for bit.
    const base = d.params.gateUp.data;
    for (const e of [1, 2]) expect(r.constants['gate_up_proj.merged']!.data.subarray(e * 48, (e + 1) * 48)).toEqual(base.subarray(e * 48, (e + 1) * 48));
    expect(r.constants['experts.gate_up_proj']).toBeUndefined();
  });

  it('keeps residual experts low-rank, with the other experts zeroed', () => {
    const A = r.constants['down_proj.residual.lora_A']!;
    expect(A.shape).toEqual([4, 3, 4]);
    const per = 3 * 4;
    for (let e = 0; e < 4; e++) {
      // + 0 turns the −0 of a zeroed negative entry into 0.
      const slice = Array.from(A.data.subarray(e * per, (e + 1) * per), (v) => v + 0);
      const want = e === 0 || e === 2 ? Array.from(d.params.lora!.down_proj!.A.data.subarray(e * per, (e + 1) * per)) : new Array<number>(per).fill(0);
      expect(slice).toEqual(want);
    }
    const lowRank = graphOps(r.residual).filter((n) => n.op === 'groupedMatmul' && r.residual.values[n.operands[1]!]!.type.shape[1] === 3);
    expect(lowRank.length).toBeGreaterThan(0);
  });

  it('leaves fallback factors as late inputs and tokens as inputs', () => {
    expect(graphInputs(r.residual).map((n) => n.name).sort()).toEqual(['late.down_proj.lora_A', 'late.down_proj.lora_B', 'late.gate_up_proj.lora_A', 'late.gate_up_proj.lora_B', 'x']);
  });

  it('runs to the per-token reference', () => {
    const y = interpret(r.residual, { weights: r.constants, inputs })['y']!;
    expect(y).toBeAllclose(referenceMoe(d.x, d.params, { topK: 2 }), TOL);
  });

  it('folds the routing-only work too when cut at routing with the routing known', () => {
    const c = { ...CASE, mode: 'inputs' as const };
    const data = moeCaseData(c);
    const v = stagedValues(data);
    const l = layerOf(c, MIXED);
    const late = Object.fromEntries(Object.entries(v.inputs).filter(([k]) => k !== 'x'));
    const s = specialize(l.graph, { lattice: l.lattice, annotations: l.annotations, cutoff: 'routing', values: { ...v.weights, ...late } });
    expect(graphInputs(s.residual).map((n) => n.name)).toEqual(['x']);
    expect(graphOps(s.residual).filter((n) => n.op === 'reshape')).toEqual([]);
    const y = interpret(s.residual, { weights: s.constants, inputs: { x: data.x } })['y']!;
    expect(y).toBeAllclose(referenceMoe(data.x, data.params, { topK: 2, routes: data.routes! }), TOL);
  });
});

describe('specialized layers equal the per-token reference', () => {
  const arb = fc
    .record({ T: fc.integer({ min: 1, max: 4 }), E: fc.integer({ min: 1, max: 4 }), H: fc.integer({ min: 1, max: 5 }), I: fc.integer({ min: 1, max: 3 }), seed: fc.nat(), inputs: fc.boolean() })
    .chain((c) => {
      const row = fc.array(fc.constantFrom(...MOE_PLAN_CHOICES), { minLength: c.E, maxLength: c.E });
      return fc.record({ k: fc.integer({ min: 1, max: c.E }), gu: row, dn: row, rg: fc.integer({ min: 1, max: 3 }), rd: fc.integer({ min: 1, max: 3 }) }).map((p) => ({ c, ...p }));
    });
  test.prop([arb], { numRuns: 40 })('for any plan, cut at adapter', ({ c, k, gu, dn, rg, rd }) => {
    const mc: MoeCase = { T: c.T, H: c.H, I: c.I, E: c.E, k, ranks: { gate_up_proj: rg, down_proj: rd }, scale: 2, mode: c.inputs ? 'inputs' : 'router', favourite: 0, seed: c.seed };
    const plan: Partial<Record<ExpertProjection, MoePlanChoice[]>> = { gate_up_proj: gu, down_proj: dn };
    const data = moeCaseData(mc);
    const { weights, inputs } = stagedValues(data);
    const l = layerOf(mc, plan);
    const s = specialize(l.graph, { lattice: l.lattice, annotations: l.annotations, cutoff: 'adapter', values: weights });
    const y = interpret(s.residual, { weights: s.constants, inputs })['y']!;
    expect(y).toBeAllclose(referenceMoe(data.x, data.params, { topK: k, ...(data.routes === undefined ? {} : { routes: data.routes }) }), TOL);
    expect(graphOps(s.residual).some((n) => n.op === 'matmul')).toBe(false);
  });
});
