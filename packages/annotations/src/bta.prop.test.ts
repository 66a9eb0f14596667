import { test } from '@fast-check/vitest';
import { GraphBuilder, graphInputs, graphParams } from '@stageml/ir';
import { arbGraph } from '@stageml/testkit';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { SERVING_STAGES, TWO_STAGE, analyzeBindingTimes, annotate, stageReport } from './index.js';

const arbStagedGraph = arbGraph({ maxNodes: 10 }).chain((graph) => {
  const leaves = [...graphInputs(graph), ...graphParams(graph)];
  return fc.tuple(fc.constant(graph), fc.array(fc.nat(SERVING_STAGES.top), { minLength: leaves.length, maxLength: leaves.length }), fc.nat(Math.max(0, leaves.length - 1)));
});

function specOf(graph: ReturnType<typeof arbGraph> extends fc.Arbitrary<infer G> ? G : never, stages: readonly number[]) {
  const leaves = [...graphInputs(graph), ...graphParams(graph)];
  const inputs: Record<string, string> = {};
  const params: Record<string, string> = {};
  leaves.forEach((n, i) => {
    (n.kind === 'input' ? inputs : params)[n.name] = SERVING_STAGES.name(stages[i]!);
  });
  return { inputs, params };
}

describe('analyzeBindingTimes', () => {
  test.prop([arbStagedGraph])('puts every node at or after each of its operands', ([graph, stages]) => {
    const bt = analyzeBindingTimes(graph, annotate(graph, SERVING_STAGES, specOf(graph, stages)));
    graph.nodes.forEach((n, i) => {
      for (const v of n.operands) expect(bt.nodeStage[i]).toBeGreaterThanOrEqual(bt.valueStage[v]!);
    });
  });

  test.prop([arbStagedGraph])('is monotone: making one leaf later never makes a node earlier', ([graph, stages, which]) => {
    const before = analyzeBindingTimes(graph, annotate(graph, SERVING_STAGES, specOf(graph, stages)));
    const later = [...stages];
    later[which] = SERVING_STAGES.top;
    const after = analyzeBindingTimes(graph, annotate(graph, SERVING_STAGES, specOf(graph, later)));
    graph.nodes.forEach((_, i) => {
      expect(after.nodeStage[i]).toBeGreaterThanOrEqual(before.nodeStage[i]!);
    });
  });

  it('keeps random ops at the top stage even when their operands are static', () => {
    const b = new GraphBuilder('r');
    const w = b.param('w', ['f32', [4]]);
    const r = b.op('randomUniform', [], { shape: [4] });
    b.output('y', b.add(w, r));
    const g = b.build();
    const bt = analyzeBindingTimes(g, annotate(g, TWO_STAGE));
    expect(bt.nodeStage[1]).toBe(TWO_STAGE.top);
    expect(bt.nodeStage[2]).toBe(TWO_STAGE.top);
  });

  it('stages shape-dependent ops at the stage that binds their symbols', () => {
    const b = new GraphBuilder('iota');
    const x = b.input('x', ['f32', ['seq', 4]]);
    const pos = b.cast(b.iota(['seq', 1], 0), 'f32');
    b.output('y', b.add(x, pos));
    const g = b.build();
    const bt = analyzeBindingTimes(g, annotate(g, SERVING_STAGES, { inputs: { x: 'token' } }));
    expect(SERVING_STAGES.name(bt.nodeStage[1]!)).toBe('token');
    expect(bt.symbolStage.get('seq')).toBe(SERVING_STAGES.index('token'));
  });

  it('counts every operand position, including variadic concat operands', () => {
    const b = new GraphBuilder('cat');
    const w = b.param('w', ['f32', [2, 4]]);
    const x = b.input('x', ['f32', [3, 4]]);
    b.output('y', b.concat([w, w, x], 0));
    const g = b.build();
    const bt = analyzeBindingTimes(g, annotate(g, TWO_STAGE));
    expect(bt.nodeStage[2]).toBe(TWO_STAGE.index('dynamic'));
  });
});

describe('stageReport', () => {
  it('reports ops, leaves, FLOPs and bytes per stage', () => {
    const b = new GraphBuilder('lora');
    const x = b.input('x', ['f32', ['batch', 8]]);
    const w = b.param('w', ['f32', [4, 8]]);
    const a = b.param('a', ['f32', [2, 8]]);
    const bb = b.param('b', ['f32', [4, 2]]);
    b.output('y', b.linear(x, b.add(w, b.matmul(bb, a))));
    const g = b.build();
    const bt = analyzeBindingTimes(g, annotate(g, SERVING_STAGES, { inputs: { x: 'request' }, params: { a: 'adapter', b: 'adapter' } }));
    const rep = stageReport(g, bt, { batch: 4 });
    const byStage = Object.fromEntries(rep.map((r) => [r.stage, r]));
    expect(byStage['base']).toMatchObject({ ops: 0, leaves: 1 });
    expect(byStage['adapter']).toMatchObject({ ops: 2, leaves: 2, flops: '160' });
    expect(byStage['request']).toMatchObject({ ops: 1, leaves: 1, flops: '64*batch' });
    expect(byStage['request']!.at!.flops).toBe(256);
  });
});
