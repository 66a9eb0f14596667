import { type Graph, GraphBuilder, graphStats, verifyGraph } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { describe, expect, it } from 'vitest';
import { type LayerPlan, MoeCode, type MoePlanChoice, type PlannedExpertLora, buildStagedMoeLayer, moeBlockWithPlan } from './index.js';

const fill = (n: number, c: MoePlanChoice): MoePlanChoice[] => new Array<MoePlanChoice>(n).fill(c);
const spec = (tokens: number) => ({ tokens, hidden: 6, intermediate: 4, numExperts: 4, topK: 2, lora: { gate_up_proj: { rank: 2, scale: 2 }, down_proj: { rank: 3, scale: 2 } } });
const grouped = (g: Graph) => graphStats(g).byOp['groupedMatmul'] ?? 0;

describe('moeBlockWithPlan', () => {
  it('runs one grouped GEMM per projection when every expert is materialized', () => {
    const { graph } = buildStagedMoeLayer(spec(5), { gate_up_proj: fill(4, 'materialize'), down_proj: fill(4, 'materialize') });
    verifyGraph(graph);
    expect(grouped(graph)).toBe(2);
    expect(graphStats(graph).byOp['scatterAdd']).toBe(1); // only the token scatter: all-expert merges are adds
  });

  it('adds two grouped GEMMs per low-rank path the plan keeps', () => {
    const residual = buildStagedMoeLayer(spec(5), { gate_up_proj: fill(4, 'residual'), down_proj: fill(4, 'residual') }).graph;
    expect(grouped(residual)).toBe(2 + 4);
    const mixed: LayerPlan = { gate_up_proj: ['materialize', 'residual', 'fallback', 'materialize'], down_proj: ['fallback', 'fallback', 'fallback', 'fallback'] };
    const g = buildStagedMoeLayer(spec(5), mixed).graph;
    expect(grouped(g)).toBe(1 + 2 + 2 + 1 + 2);
    const names = g.values.map((v) => v.name);
    expect(names).toEqual(expect.arrayContaining(['gate_up_proj.merged', 'gate_up_proj.residual.lora_A', 'gate_up_proj.fallback.lora_A']));
    // down_proj is all fallback: its late factors are used unmasked and no adapter-stage factors exist.
    expect(names).not.toContain('down_proj.fallback.lora_A');
    expect(names).not.toContain('adapter.down_proj.lora_A');
  });

  it('builds the same graph for every T: no per-token work', () => {
    const plan: LayerPlan = { gate_up_proj: ['materialize', 'residual', 'fallback', 'residual'], down_proj: ['residual', 'materialize', 'materialize', 'fallback'] };
    const one = buildStagedMoeLayer(spec(1), plan).graph;
    const many = buildStagedMoeLayer(spec(64), plan).graph;
    const ops = (g: Graph) => g.nodes.map((n) => (n.kind === 'op' ? n.op : n.kind));
    expect(ops(many)).toEqual(ops(one));
  });

  describe('errors', () => {
    const build = (plan: LayerPlan, lora: Partial<Record<'gate_up_proj' | 'down_proj', PlannedExpertLora>>, routing?: 'bad') => {
      const b = new GraphBuilder('e');
      const x = b.input('x', ['f32', [3, 6]]);
      const A = b.param('A', ['f32', [4, 2, 6]]);
      const B = b.param('B', ['f32', [4, 8, 2]]);
      const params = { router: b.param('r', ['f32', [4, 6]]), gateUp: b.param('gu', ['f32', [4, 8, 6]]), down: b.param('dn', ['f32', [4, 6, 4]]), lora: Object.fromEntries(Object.entries(lora).map(([p, l]) => [p, { ...l, ...(l.factors === undefined ? {} : { factors: { A, B } }) }])) };
      const r = routing === undefined ? {} : { routing: { experts: b.input('e', ['i64', [3, 1]]), weights: b.input('w', ['f32', [3, 2]]) } };
      return () => moeBlockWithPlan(b, x, params, plan, { topK: 2, ...r });
    };
    const factors = { scale: 1, factors: {} as never };

    it('refuses choices without factors and factors without choices', () => {
      expectCode(build({ gate_up_proj: fill(4, 'residual') }, {}), MoeCode.BAD_PLAN);
      expectCode(build({}, { gate_up_proj: factors }), MoeCode.BAD_PLAN);
    });

    it('refuses a choice count other than E and an unknown projection', () => {
      expectCode(build({ gate_up_proj: fill(3, 'residual') }, { gate_up_proj: factors }), MoeCode.BAD_PLAN);
      expectCode(build({ up_proj: fill(4, 'residual') } as LayerPlan, {}), MoeCode.BAD_PLAN);
    });

    it('refuses fallback experts without late factors', () => {
      expectCode(build({ gate_up_proj: ['residual', 'fallback', 'residual', 'residual'] }, { gate_up_proj: factors }), MoeCode.BAD_PLAN);
    });

    it('refuses factors of the wrong shape and mis-shaped routing', () => {
      expectCode(build({ down_proj: fill(4, 'materialize') }, { down_proj: factors }), MoeCode.SHAPE_MISMATCH);
      expectCode(build({}, {}, 'bad'), MoeCode.SHAPE_MISMATCH);
    });

    it('needs a router when no routing is given', () => {
      const b = new GraphBuilder('n');
      const x = b.input('x', ['f32', [3, 6]]);
      const f = () => moeBlockWithPlan(b, x, { gateUp: b.param('gu', ['f32', [4, 8, 6]]), down: b.param('dn', ['f32', [4, 6, 4]]) }, {}, { topK: 2 });
      expectCode(f, MoeCode.SHAPE_MISMATCH);
    });
  });
});
