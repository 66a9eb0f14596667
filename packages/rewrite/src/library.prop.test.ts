import { test } from '@fast-check/vitest';
import { SERVING_STAGES } from '@stageml/annotations';
import { graphInputs, graphParams } from '@stageml/ir';
import { arbStagedGraph } from '@stageml/testkit';
import fc from 'fast-check';
import { describe } from 'vitest';
import { checkRewrite } from '../test/harness.js';
import { defaultRules } from './index.js';

// Every op of the registry but randomUniform is in play (arbStagedGraph says why).
const arbCase = fc
  .tuple(arbStagedGraph({ maxNodes: 10, top: SERVING_STAGES.top }), fc.nat(SERVING_STAGES.top), fc.constantFrom(Number.POSITIVE_INFINITY, 0, 1024))
  .map(([staged, cutoff, budget]) => ({ ...staged, cutoff, budget }));

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
