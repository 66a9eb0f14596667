import { fc, test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';

import { arbGraph } from '../../testkit/src/index.js';
import { sym } from './dim.js';
import { StageError } from './errors.js';
import type { Graph } from './graph.js';
import { checkGraph, verifyGraph } from './verify.js';

const graphs = arbGraph({ maxNodes: 10 });

/** Values a mutation may plant anywhere in a graph's plain data. */
const junk: fc.Arbitrary<unknown> = fc.oneof(
  fc.integer({ min: -2, max: 12 }),
  fc.constantFrom(0.5, Number.NaN, Number.POSITIVE_INFINITY, -0, 2 ** 53),
  fc.constantFrom('', 'x', 'f32', 'bool', 'sml.add', 'add', 'op', 'input', 'param', 'a b', 'matmul', 'constructor', '__proto__'),
  fc.constantFrom(null, undefined, true, false),
  fc.constantFrom([], [0], [0, 1], [-1], {}, { terms: [], constant: 1 }, sym('seq'), { dtype: 'f32', shape: [] }),
);

/** Every (container, key) pair reachable in plain data, the root excluded. */
function slots(root: unknown): [Record<string | number, unknown>, string | number][] {
  const out: [Record<string | number, unknown>, string | number][] = [];
  const visit = (x: unknown): void => {
    if (typeof x !== 'object' || x === null) return;
    const rec = x as Record<string | number, unknown>;
    const keys: (string | number)[] = Array.isArray(x) ? x.map((_, i) => i) : Object.keys(x);
    for (const k of keys) {
      out.push([rec, k]);
      visit(rec[k]);
    }
  };
  visit(root);
  return out;
}

type Mutation = { kind: 'set'; slot: number; value: unknown } | { kind: 'delete'; slot: number } | { kind: 'duplicate'; slot: number };

const arbMutation: fc.Arbitrary<Mutation> = fc.oneof(
  { arbitrary: fc.record({ kind: fc.constant('set' as const), slot: fc.nat(), value: junk }), weight: 4 },
  { arbitrary: fc.record({ kind: fc.constant('delete' as const), slot: fc.nat() }), weight: 1 },
  { arbitrary: fc.record({ kind: fc.constant('duplicate' as const), slot: fc.nat() }), weight: 1 },
);

/** A deep copy of `g` with one mutation applied somewhere in its data. */
function mutate(g: Graph, m: Mutation): Graph {
  const copy = structuredClone(g);
  const all = slots(copy);
  const [container, key] = all[m.slot % all.length]!;
  if (m.kind === 'set') container[key] = m.value;
  else if (Array.isArray(container) && typeof key === 'number') {
    if (m.kind === 'delete') container.splice(key, 1);
    else container.splice(key, 0, structuredClone(container[key]));
  } else if (m.kind === 'delete') delete container[key];
  else container[key] = structuredClone(container[key]);
  return copy;
}

describe('verifyGraph', () => {
  test.prop([graphs])('accepts every graph GraphBuilder builds', (g) => {
    expect(checkGraph(g)).toEqual([]);
    verifyGraph(g);
  });

  test.prop([graphs, arbMutation])('on a randomly mutated graph, either passes or throws a coded IrError (never a TypeError)', (g, m) => {
    const bad = mutate(g, m);
    try {
      verifyGraph(bad);
    } catch (e) {
      expect(e, `verifyGraph threw ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`).toBeInstanceOf(StageError);
      expect((e as StageError).code).toMatch(/^IR_[A-Z_]+$/);
    }
  });

  test.prop([graphs, arbMutation])('checkGraph returns coded errors exactly when verifyGraph throws the first of them', (g, m) => {
    const bad = mutate(g, m);
    const errors = checkGraph(bad);
    let thrown: unknown;
    try {
      verifyGraph(bad);
    } catch (e) {
      thrown = e;
    }
    if (errors.length === 0) expect(thrown).toBeUndefined();
    else expect((thrown as StageError).code).toBe(errors[0]!.code);
  });
});
