import { test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';

import { arbGraphWithData } from '../../testkit/src/index.js';
import { interpret } from './interpret.js';
import { deserializeGraph, serializeGraph } from './json.js';
import { parseGraph } from './parse.js';
import { printGraph } from './print.js';
import { concreteShape } from './types.js';

const cases = arbGraphWithData({ maxNodes: 10 });

describe('interpret', () => {
  test.prop([cases])('returns every output with its declared dtype and shape under the bindings', ({ graph, bindings, inputs, weights }) => {
    const out = interpret(graph, { inputs, weights });
    expect(Object.keys(out).sort()).toEqual(graph.outputs.map((o) => o.name).sort());
    for (const o of graph.outputs) {
      const t = graph.values[o.value]!.type;
      expect(out[o.name]!.dtype).toBe(t.dtype);
      expect(out[o.name]!.shape).toEqual(concreteShape(t, bindings));
    }
  });

  test.prop([cases])('computes the same outputs after a text or JSON round trip of the graph', ({ graph, inputs, weights }) => {
    const want = interpret(graph, { inputs, weights, seed: 3 });
    for (const g of [parseGraph(printGraph(graph)), deserializeGraph(serializeGraph(graph))]) {
      const got = interpret(g, { inputs, weights, seed: 3 });
      for (const name of Object.keys(want)) expect(got[name]!).toBeAllclose(want[name]!, { rtol: 0, atol: 0 });
    }
  });

  test.prop([cases])('leaves its inputs and weights untouched', ({ graph, inputs, weights }) => {
    const before = [...Object.values(inputs), ...Object.values(weights)].map((t) => Array.from(t.data));
    interpret(graph, { inputs, weights });
    expect([...Object.values(inputs), ...Object.values(weights)].map((t) => Array.from(t.data))).toEqual(before);
  });
});
