import { test } from '@fast-check/vitest';
import { SERVING_STAGES } from '@stageml/annotations';
import { graphInputs, graphParams } from '@stageml/ir';
import { GRAPH_OPS, arbGraphWithData } from '@stageml/testkit';
import fc from 'fast-check';
import { describe } from 'vitest';
import { checkRewrite } from '../test/harness.js';
import { defaultRules } from './index.js';

// Random ops draw from a stream, so equal outputs are not meaningful across graphs that call them
// a different number of times; every other op of the registry is in play.
const OPS = GRAPH_OPS.filter((k) => k !== 'randomUniform');

const arbCase = arbGraphWithData({ maxNodes: 10, ops: OPS }).chain((data) => {
  const leaves = [...graphInputs(data.graph), ...graphParams(data.graph)];
  return fc.record({
    data: fc.constant(data),
    stages: fc.array(fc.nat(SERVING_STAGES.top), { minLength: leaves.length, maxLength: leaves.length }),
    cutoff: fc.nat(SERVING_STAGES.top),
    budget: fc.constantFrom(Number.POSITIVE_INFINITY, 0, 1024),
  });
});

describe('the full rule library on random graphs', () => {
  test.prop([arbCase])('keeps semantics, verifies, never slows the residual and is idempotent, at any cutoff and budget', (c) => {
    const g = c.data.graph;
    const inputs: Record<string, string> = {};
    const params: Record<string, string> = {};
    [...graphInputs(g), ...graphParams(g)].forEach((n, i) => {
      (n.kind === 'input' ? inputs : params)[n.name] = SERVING_STAGES.name(c.stages[i]!);
    });
    checkRewrite(
      { graph: g, inputs: c.data.inputs, weights: c.data.weights, bindings: c.data.bindings },
      [defaultRules],
      {
        context: { lattice: SERVING_STAGES, annotations: { inputs, params }, cutoff: SERVING_STAGES.name(c.cutoff), memoryBudget: c.budget },
      },
    );
  });
});
