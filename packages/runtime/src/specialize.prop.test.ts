import { test } from '@fast-check/vitest';
import { SERVING_STAGES } from '@stageml/annotations';
import { type Graph, type HostTensor, graphInputs, graphParams, interpret, printGraph } from '@stageml/ir';
import { arbStagedGraph } from '@stageml/testkit';
import fc from 'fast-check';
import { describe, expect } from 'vitest';
import { specialize } from './index.js';

// Random ops are left out (arbStagedGraph); BTA keeps them late (tested in @stageml/annotations).
const arbCase = fc
  .tuple(arbStagedGraph({ maxNodes: 10, top: SERVING_STAGES.top }), fc.nat(SERVING_STAGES.top), fc.nat(SERVING_STAGES.top))
  .map(([staged, cut1, cut2]) => ({ ...staged, cut1, cut2 }));

type Case = typeof arbCase extends fc.Arbitrary<infer C> ? C : never;

function setup(c: Case) {
  const g = c.data.graph;
  const leaves = [...graphInputs(g), ...graphParams(g)];
  const inputs: Record<string, string> = {};
  const params: Record<string, string> = {};
  const all: Record<string, HostTensor> = { ...c.data.inputs, ...c.data.weights };
  const stageOf = new Map<string, number>();
  leaves.forEach((n, i) => {
    (n.kind === 'input' ? inputs : params)[n.name] = SERVING_STAGES.name(c.stages[i]!);
    stageOf.set(n.name, c.stages[i]!);
  });
  const early = (cut: number) => Object.fromEntries(Object.entries(all).filter(([k]) => stageOf.get(k)! <= cut));
  const late = (cut: number) => Object.fromEntries(Object.entries(all).filter(([k]) => stageOf.get(k)! > cut));
  return { g, spec: { inputs, params }, all, early, late };
}

function runResidual(residual: Graph, constants: Record<string, HostTensor>, lateValues: Record<string, HostTensor>) {
  const inputNames = new Set(graphInputs(residual).map((n) => n.name));
  const inputs = Object.fromEntries(Object.entries(lateValues).filter(([k]) => inputNames.has(k)));
  return interpret(residual, { inputs, weights: { ...lateValues, ...constants } });
}

describe('specialize (staging soundness)', () => {
  test.prop([arbCase])('the residual on the late inputs equals the original on all inputs', (c) => {
    const { g, spec, all, early, late } = setup(c);
    const expected = interpret(g, { inputs: c.data.inputs, weights: c.data.weights });
    const r = specialize(g, { lattice: SERVING_STAGES, annotations: spec, cutoff: SERVING_STAGES.name(c.cut1), values: early(c.cut1) });
    const got = runResidual(r.residual, { ...r.constants }, late(c.cut1));
    for (const o of g.outputs) expect(got[o.name]).toBeAllclose(expected[o.name]!, { rtol: 1e-5, atol: 1e-6 });
    expect(Object.keys(all).length).toBeGreaterThan(0);
  });

  test.prop([arbCase])('the residual has no input at or before the cutoff', (c) => {
    const { g, spec, early } = setup(c);
    const r = specialize(g, { lattice: SERVING_STAGES, annotations: spec, cutoff: SERVING_STAGES.name(c.cut1), values: early(c.cut1) });
    for (const n of graphInputs(r.residual)) expect(r.annotations.stages.get(n.name)).toBeGreaterThan(c.cut1);
  });

  test.prop([arbCase])('specializing at a then at b equals specializing once at b', (c) => {
    const [a, b] = c.cut1 <= c.cut2 ? [c.cut1, c.cut2] : [c.cut2, c.cut1];
    const { g, spec, early } = setup(c);
    const once = specialize(g, { lattice: SERVING_STAGES, annotations: spec, cutoff: SERVING_STAGES.name(b), values: early(b) });
    const first = specialize(g, { lattice: SERVING_STAGES, annotations: spec, cutoff: SERVING_STAGES.name(a), values: early(a) });
    const second = specialize(first.residual, {
      annotations: first.annotations,
      cutoff: SERVING_STAGES.name(b),
      values: { ...early(b), ...first.constants },
    });
    expect(printGraph(second.residual)).toBe(printGraph(once.residual));
    expect(Object.keys(second.constants).sort()).toEqual(Object.keys(once.constants).sort());
    for (const [k, v] of Object.entries(once.constants)) expect(second.constants[k]).toBeAllclose(v, { rtol: 0, atol: 0 });
  });

  test.prop([arbCase])('never modifies its input graph', (c) => {
    const { g, spec, early } = setup(c);
    const before = JSON.stringify(g);
    specialize(g, { lattice: SERVING_STAGES, annotations: spec, cutoff: SERVING_STAGES.name(c.cut1), values: early(c.cut1) });
    expect(JSON.stringify(g)).toBe(before);
  });
});
