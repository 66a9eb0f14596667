import { fc, test } from '@fast-check/vitest';
import { type OpKey, bindDims, checkGraph, graphInputs, graphOps, graphParams, isFloatDType } from '@stageml/ir';
import { describe, expect, it } from 'vitest';

import { GRAPH_OPS, arbGraph, arbGraphWithData } from './arb-graph.js';
import { arbHostTensor, arbTensorType } from './arb-tensor.js';
import { Chooser } from './chooser.js';

describe('arbGraph', () => {
  test.prop([arbGraph({ maxNodes: 6 })])('builds graphs that verify, with at least one input and one output', (g) => {
    expect(checkGraph(g)).toEqual([]);
    expect(graphInputs(g).length).toBeGreaterThanOrEqual(1);
    expect(g.outputs.length).toBeGreaterThanOrEqual(1);
  });

  test.prop([fc.subarray([...GRAPH_OPS], { minLength: 1, maxLength: 4 })])('applies only the requested ops, plus the helpers it documents', (ops) => {
    const allowed = new Set<OpKey>([...ops, 'constant', 'iota', 'reshape', 'argmax', ...(ops.includes('loraBank') || ops.includes('quantizedLoraBank') ? (['linear'] as const) : [])]);
    for (const g of fc.sample(arbGraph({ maxNodes: 6, ops }), 5)) {
      for (const n of graphOps(g)) expect(allowed).toContain(n.op);
    }
  });

  it('covers every op it can generate within a few hundred graphs', () => {
    const seen = new Set<string>();
    for (const g of fc.sample(arbGraph({ maxNodes: 12 }), { numRuns: 400, seed: 1 })) for (const n of graphOps(g)) seen.add(n.op);
    expect([...GRAPH_OPS].filter((k) => !seen.has(k))).toEqual([]);
  });
});

describe('arbGraphWithData', () => {
  test.prop([arbGraphWithData({ maxNodes: 6 })])('supplies data for every input and weight that binds exactly the chosen sizes', ({ graph, bindings, inputs, weights }) => {
    const leaves = [...graphInputs(graph), ...graphParams(graph)];
    expect(Object.keys(inputs).length + Object.keys(weights).length).toBe(leaves.length);
    const entries = leaves.map((n) => ({
      name: n.name,
      type: graph.values[n.results[0]!]!.type,
      value: n.kind === 'input' ? inputs[n.name]! : weights[n.name]!,
    }));
    expect(bindDims(entries)).toEqual(bindings);
  });
});

describe('arbHostTensor', () => {
  test.prop([arbTensorType({ maxRank: 3 }).chain((t) => arbHostTensor(t, { maxAbs: 2 }).map((x) => [t, x] as const))])(
    'fills the type with finite values of bounded magnitude',
    ([t, x]) => {
      expect(x.dtype).toBe(t.dtype);
      expect(x.shape).toEqual(t.shape);
      for (const v of x.data) {
        expect(Number.isFinite(v)).toBe(true);
        if (isFloatDType(t.dtype)) expect(Math.abs(v)).toBeLessThanOrEqual(2);
      }
    },
  );
});

describe('Chooser', () => {
  it('reads decisions in order, modulo the range, and falls back to a fixed sequence', () => {
    const c = new Chooser([5, 7]);
    expect(c.int(3)).toBe(2);
    expect(c.range(10, 11)).toBe(11);
    const later = [c.int(1000), c.int(1000)];
    const again = new Chooser([5, 7]);
    again.int(3);
    again.int(2);
    expect([again.int(1000), again.int(1000)]).toEqual(later);
  });

  it('shuffles to the identity when every decision is 0', () => {
    expect(new Chooser(new Array<number>(10).fill(0)).shuffle([1, 2, 3, 4])).toEqual([1, 2, 3, 4]);
  });
});
