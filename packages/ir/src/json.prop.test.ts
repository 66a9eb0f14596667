import { fc, test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';

import { arbGraph } from '../../testkit/src/index.js';
import { IrError } from './errors.js';
import { deserializeGraph, graphToJson, serializeGraph } from './json.js';

const graphs = arbGraph({ maxNodes: 10 });

describe('deserializeGraph', () => {
  test.prop([graphs])('inverts serializeGraph exactly', (g) => {
    expect(deserializeGraph(serializeGraph(g))).toEqual(g);
  });

  test.prop([graphs])('reads the parsed document as well as the string', (g) => {
    expect(deserializeGraph(JSON.parse(serializeGraph(g)))).toEqual(g);
  });

  test.prop([graphs, fc.nat(), fc.jsonValue({ maxDepth: 2 })])(
    'only ever throws coded IrErrors when one JSON node is replaced by junk',
    (g, at, junk) => {
      const doc = JSON.parse(serializeGraph(g)) as unknown;
      const slots: [Record<string | number, unknown>, string | number][] = [];
      const visit = (x: unknown): void => {
        if (typeof x !== 'object' || x === null) return;
        for (const k of Array.isArray(x) ? x.map((_, i) => i) : Object.keys(x)) {
          slots.push([x as Record<string | number, unknown>, k]);
          visit((x as Record<string | number, unknown>)[k]);
        }
      };
      visit(doc);
      const [container, key] = slots[at % slots.length]!;
      container[key] = junk;
      try {
        deserializeGraph(JSON.stringify(doc));
      } catch (e) {
        expect(e, `deserializeGraph threw ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`).toBeInstanceOf(IrError);
      }
    },
  );
});

describe('serializeGraph', () => {
  test.prop([graphs])('is stable through a round trip (serialize ∘ deserialize ∘ serialize = serialize)', (g) => {
    const s = serializeGraph(g);
    expect(serializeGraph(deserializeGraph(s))).toBe(s);
  });

  test.prop([graphs])('writes plain JSON data equal to graphToJson', (g) => {
    expect(JSON.parse(serializeGraph(g))).toEqual(graphToJson(g));
  });
});
