import { type fc, test } from '@fast-check/vitest';
import { describe, expect, it } from 'vitest';

import { type OpSample, arbGraphWithData, opSamples } from '../../../testkit/src/index.js';
import { normalizeAttrs } from '../attrs.js';
import { GraphBuilder } from '../builder.js';
import { evalCost, graphCost } from '../cost.js';
import { dimToString, isStaticDim } from '../dim.js';
import type { Graph } from '../graph.js';
import { interpret } from '../interpret.js';
import { deserializeGraph, serializeGraph } from '../json.js';
import { parseGraph, stripSpans } from '../parse.js';
import { printGraph } from '../print.js';
import type { HostTensor } from '../tensor.js';
import { verifyGraph } from '../verify.js';
import { OPS, OP_KEYS, type OpKey, opDef, opKeyByName } from './index.js';

/** camelCase → snake_case, written independently of the registry's own helper. */
const snake = (key: string): string =>
  key
    .split(/(?=[A-Z])/)
    .map((w) => w.toLowerCase())
    .join('_');

/** Every op's sampler, typed loosely for iteration. */
const samplerOf = (key: OpKey): fc.Arbitrary<OpSample<OpKey>> => opSamples[key] as fc.Arbitrary<OpSample<OpKey>>;

/** A one-node graph applying `key` to inputs `a0…` holding the sample's operands. */
function graphOf(key: OpKey, s: OpSample<OpKey>): { graph: Graph; inputs: Record<string, HostTensor> } {
  const b = new GraphBuilder(`conformance.${key}`);
  const inputs: Record<string, HostTensor> = {};
  const vals = s.operands.map((t, i) => {
    inputs[`a${String(i)}`] = t;
    return b.input(`a${String(i)}`, { dtype: t.dtype, shape: t.shape });
  });
  b.apply(key, vals, s.attrs).forEach((v, i) => {
    b.output(`r${String(i)}`, v);
  });
  return { graph: b.build(), inputs };
}

describe('OPS', () => {
  it('has a sampler for exactly the registry keys', () => {
    expect(Object.keys(opSamples).sort()).toEqual([...OP_KEYS].sort());
  });

  it('prints each op under a distinct name (the key → name map is one-to-one)', () => {
    const names = OP_KEYS.map((k) => OPS[k].name);
    expect(new Set(names).size).toBe(OP_KEYS.length);
  });

  describe.each(OP_KEYS.map((k) => [k] as const))('%s', (key) => {
    const def = opDef(key);

    it('is documented with a one-sentence summary and its semantics', () => {
      expect(def.summary.trim().length).toBeGreaterThan(10);
      expect(def.summary.trim()).toMatch(/[.)]$/);
      expect(def.semantics.trim().length).toBeGreaterThan(3);
    });

    it('is registered under its own key and printed as sml.<snake_case key>', () => {
      expect(def.key).toBe(key);
      expect(def.name).toBe(`sml.${snake(key)}`);
      expect(opKeyByName(def.name)).toBe(key);
    });

    it('declares at least one result and a known effect', () => {
      expect(def.results).toBeGreaterThanOrEqual(1);
      expect(['pure', 'random', 'stateful']).toContain(def.effect);
    });

    test.prop([samplerOf(key)])(
      def.effect === 'pure' ? 'infer agrees with the dtypes and shapes evaluate returns, deterministically' : 'infer agrees with the dtypes and shapes evaluate returns',
      (s) => {
        const { graph, inputs } = graphOf(key, s);
        verifyGraph(graph);
        const out = interpret(graph, { inputs, seed: 1 });
        const results = graph.nodes[graph.nodes.length - 1]!.results;
        expect(results.length).toBe(def.results);
        results.forEach((id, i) => {
          const want = graph.values[id]!.type;
          const got = out[`r${String(i)}`]!;
          expect(got.dtype).toBe(want.dtype);
          expect(want.shape.every(isStaticDim)).toBe(true);
          expect(got.shape).toEqual(want.shape);
          expect(got.data.length).toBe(got.shape.reduce((a, d) => a * d, 1));
        });
        // The same through the registry record directly, bypassing builder and interpreter.
        const attrs = normalizeAttrs(def.name, def.attrs, s.attrs);
        const inferred = def.infer(
          s.operands.map((t) => ({ dtype: t.dtype, shape: t.shape })),
          attrs,
        );
        const evaluated = def.evaluate(s.operands, attrs, { random: () => 0.5 });
        expect(evaluated.map((t) => ({ dtype: t.dtype, shape: [...t.shape] }))).toEqual(inferred.map((t) => ({ dtype: t.dtype, shape: [...t.shape] })));
        if (def.effect === 'pure') {
          const again = interpret(graph, { inputs, seed: 2 });
          for (const name of Object.keys(out)) expect(again[name]!).toBeAllclose(out[name]!, { rtol: 0, atol: 0 });
        }
      },
    );

    test.prop([samplerOf(key)])('round-trips through the text and JSON forms and costs non-negative integer FLOPs and bytes', (s) => {
      const { graph } = graphOf(key, s);
      expect(stripSpans(parseGraph(printGraph(graph)))).toEqual(graph);
      expect(deserializeGraph(serializeGraph(graph))).toEqual(graph);
      const attrs = normalizeAttrs(def.name, def.attrs, s.attrs);
      const operands = s.operands.map((t) => ({ dtype: t.dtype, shape: t.shape }));
      const c = def.cost(operands, def.infer(operands, attrs), attrs);
      for (const v of [c.flops, c.bytes]) {
        expect(typeof v).toBe('number');
        expect(Number.isSafeInteger(v) && (v as number) >= 0, `cost ${dimToString(v)}`).toBe(true);
      }
    });
  });
});

describe('graphCost', () => {
  test.prop([arbGraphWithData({ maxNodes: 8 })])('is a non-negative integer at every binding of a random graph', ({ graph, bindings }) => {
    const c = evalCost(graphCost(graph), bindings);
    expect(Number.isSafeInteger(c.flops) && c.flops >= 0).toBe(true);
    expect(Number.isSafeInteger(c.bytes) && c.bytes >= 0).toBe(true);
  });
});
