import { fc, test } from '@fast-check/vitest';
import { GraphBuilder, interpret, verifyGraph } from '@stageml/ir';
import { describe, expect } from 'vitest';
import { type ExpertProjection, type LayerPlan, MOE_PLAN_CHOICES, type MoePlanChoice, type TokenRoute, buildStagedMoeLayer, moeBlock, referenceMoe, referenceRoute } from './index.js';
import { type MoeCase, type RoutingMode, moeCaseData, stagedValues } from './test-fixtures.js';

const TOL = { rtol: 1e-4, atol: 1e-5 };

/** A random case: sizes (T and E from 1), k ≤ E, ranks per projection (or none), routing mode. */
const arbCase = (modes: readonly RoutingMode[]): fc.Arbitrary<MoeCase> =>
  fc
    .record({
      T: fc.integer({ min: 1, max: 6 }),
      H: fc.integer({ min: 1, max: 6 }),
      I: fc.integer({ min: 1, max: 4 }),
      E: fc.integer({ min: 1, max: 5 }),
      gateUpRank: fc.option(fc.integer({ min: 1, max: 3 }), { nil: undefined }),
      downRank: fc.option(fc.integer({ min: 1, max: 3 }), { nil: undefined }),
      scale: fc.constantFrom(0.5, 1, 2),
      mode: fc.constantFrom(...modes),
      seed: fc.integer({ min: 0, max: 2 ** 31 - 1 }),
    })
    .chain((c) =>
      fc.record({ k: fc.integer({ min: 1, max: c.E }), favourite: fc.integer({ min: 0, max: c.E - 1 }) }).map(({ k, favourite }) => {
        const ranks: Partial<Record<ExpertProjection, number>> = {};
        if (c.gateUpRank !== undefined) ranks.gate_up_proj = c.gateUpRank;
        if (c.downRank !== undefined) ranks.down_proj = c.downRank;
        return { T: c.T, H: c.H, I: c.I, E: c.E, k, ranks, scale: c.scale, mode: c.mode, favourite, seed: c.seed };
      }),
    );

/** A case with a random mix of plan choices for every (expert, projection) unit it has. */
const arbPlanned = (modes: readonly RoutingMode[]): fc.Arbitrary<{ c: MoeCase; plan: LayerPlan }> =>
  arbCase(modes).chain((c) => {
    const row = fc.array(fc.constantFrom(...MOE_PLAN_CHOICES), { minLength: c.E, maxLength: c.E });
    return fc.record({ gate_up_proj: row, down_proj: row }).map((rows) => {
      const plan: Partial<Record<ExpertProjection, MoePlanChoice[]>> = {};
      if (c.ranks.gate_up_proj !== undefined) plan.gate_up_proj = rows.gate_up_proj;
      if (c.ranks.down_proj !== undefined) plan.down_proj = rows.down_proj;
      return { c, plan };
    });
  });

function runPlanned(c: MoeCase, plan: LayerPlan, routes?: readonly TokenRoute[]) {
  const d = routes === undefined ? moeCaseData(c) : { ...moeCaseData(c), routes };
  const layer = buildStagedMoeLayer({ tokens: c.T, hidden: c.H, intermediate: c.I, numExperts: c.E, topK: c.k, lora: Object.fromEntries(Object.entries(c.ranks).map(([p, rank]) => [p, { rank, scale: c.scale }])), routingInputs: c.mode === 'inputs' }, plan);
  verifyGraph(layer.graph);
  const { weights, inputs } = stagedValues(d);
  const got = interpret(layer.graph, { weights, inputs })['y']!;
  const want = referenceMoe(d.x, d.params, { topK: c.k, ...(d.routes === undefined ? {} : { routes: d.routes }) });
  return { got, want, layer, d };
}

describe('moeBlockWithPlan equals the per-token reference', () => {
  test.prop([arbPlanned(['router', 'forced', 'ties', 'inputs'])])('on random routings, for every mix of plan choices', ({ c, plan }) => {
    const { got, want } = runPlanned(c, plan);
    expect(got).toBeAllclose(want, TOL);
  });

  test.prop([arbPlanned(['forced'])])('when the router sends every token to one expert first', ({ c, plan }) => {
    const { got, want, d } = runPlanned(c, plan);
    expect(referenceRoute(d.x, d.params.router, c.k).every((r) => r.experts[0] === c.favourite)).toBe(true);
    expect(got).toBeAllclose(want, TOL);
  });

  test.prop([arbPlanned(['inputs']), fc.boolean()])('when routing inputs send all tokens to one expert or leave most experts idle', ({ c, plan }, all) => {
    // all: every (token, slot) row on the favourite; otherwise only the favourite and expert 0.
    const routes = Array.from({ length: c.T }, (_, t) => ({
      experts: Array.from({ length: c.k }, (_, j) => (all || (t + j) % 2 === 0 ? c.favourite : 0)),
      weights: Array.from({ length: c.k }, (_, j) => 1 / (j + 1)),
    }));
    const { got, want } = runPlanned(c, plan, routes);
    expect(got).toBeAllclose(want, TOL);
  });

  test.prop([fc.constantFrom(...MOE_PLAN_CHOICES), arbCase(['router', 'ties'])])('uniform plans agree with each other and with moeBlock', (choice, c) => {
    const plan: Partial<Record<ExpertProjection, MoePlanChoice[]>> = {};
    for (const p of Object.keys(c.ranks) as ExpertProjection[]) plan[p] = new Array<MoePlanChoice>(c.E).fill(choice);
    const { got, d } = runPlanned(c, plan);
    const b = new GraphBuilder('plain');
    const x = b.input('x', ['f32', [c.T, c.H]]);
    const lora = Object.fromEntries(
      Object.entries(d.params.lora ?? {}).map(([p, l]) => [p, { A: b.param(`${p}.A`, ['f32', l.A.shape]), B: b.param(`${p}.B`, ['f32', l.B.shape]), scale: l.scale }]),
    );
    const y = moeBlock(b, x, { router: b.param('router', ['f32', [c.E, c.H]]), gateUp: b.param('gateUp', ['f32', d.params.gateUp.shape]), down: b.param('down', ['f32', d.params.down.shape]), lora }, { topK: c.k, normalize: true });
    b.output('y', y);
    const weights = { router: d.params.router, gateUp: d.params.gateUp, down: d.params.down, ...Object.fromEntries(Object.entries(d.params.lora ?? {}).flatMap(([p, l]) => [[`${p}.A`, l.A], [`${p}.B`, l.B]])) };
    const plain = interpret(b.build(), { weights, inputs: { x: d.x } })['y']!;
    expect(got).toBeAllclose(plain, TOL);
  });
});
