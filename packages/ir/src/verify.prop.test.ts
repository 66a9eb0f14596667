import { fc, test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';

import { arbGraph, arbTensorType } from '../../testkit/src/index.js';
import type { AttrSpec } from './attrs.js';
import { GraphBuilder } from './builder.js';
import { parseDim, sym } from './dim.js';
import { DTYPES } from './dtype.js';
import { IrError } from './errors.js';
import type { Graph } from './graph.js';
import { deserializeGraph, serializeGraph } from './json.js';
import { operandArity } from './op-def.js';
import { OP_KEYS, opDef } from './ops/index.js';
import { parseGraph, stripSpans } from './parse.js';
import { printGraph } from './print.js';
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
  } else if (m.kind === 'delete') Reflect.deleteProperty(container, key);
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
      expect(e, `verifyGraph threw ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`).toBeInstanceOf(IrError);
      expect((e as IrError).code).toMatch(/^IR_[A-Z_]+$/);
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
    else expect((thrown as IrError).code).toBe(errors[0]!.code);
  });
});

/** A random value for an attribute of kind `spec.kind`, valid or not. */
function arbAttrValue(spec: AttrSpec): fc.Arbitrary<unknown> {
  const dimArb = fc.oneof(fc.integer({ min: -3, max: 5 }), fc.constantFrom(sym('seq'), parseDim('seq - 1'), parseDim('2*seq'), parseDim('-seq')));
  switch (spec.kind) {
    case 'bool':
      return fc.boolean();
    case 'int':
      return fc.integer({ min: -3, max: 5 });
    case 'float':
      return fc.constantFrom(0, 1e-5, -1, 0.5, Number.NaN, Number.POSITIVE_INFINITY, -0);
    case 'enum':
      return fc.constantFrom(...spec.values);
    case 'ints':
      return fc.array(fc.integer({ min: -3, max: 3 }), { maxLength: 4 });
    case 'floats':
      return fc.array(fc.constantFrom(0, 1, -2.5, Number.NaN), { maxLength: 6 });
    case 'dim':
      return dimArb;
    case 'dims':
      return fc.array(dimArb, { maxLength: 3 });
    case 'dtype':
      return fc.constantFrom(...DTYPES);
  }
}

/** A random application of any op: operand types and attributes drawn from its schema. */
const arbApplication = fc.constantFrom(...OP_KEYS).chain((key) => {
  const def = opDef(key);
  const { min, max } = operandArity(def.operands);
  const attrs = fc.record(
    Object.fromEntries(
      Object.entries(def.attrs).map(([name, spec]) => [
        name,
        spec.default !== undefined || spec.optional === true ? fc.option(arbAttrValue(spec), { nil: undefined }) : arbAttrValue(spec),
      ]),
    ),
  );
  const type = arbTensorType({ maxRank: 4, allowZero: true, symbols: ['seq', 'batch'] });
  const operands = fc.oneof(
    fc.array(type, { minLength: min, maxLength: Math.min(max, min + 2) }),
    fc.tuple(type, fc.integer({ min, max: Math.min(max, min + 2) })).map(([t, n]) => Array.from({ length: n }, () => t)),
  );
  return fc.record({ key: fc.constant(key), operands, attrs });
});

describe('GraphBuilder', () => {
  test.prop([arbApplication])('builds only graphs that verify and round-trip; everything else is a coded IrError', ({ key, operands, attrs }) => {
    const b = new GraphBuilder('fuzz');
    const xs = operands.map((t, i) => b.input(`x${String(i)}`, t));
    const clean = Object.fromEntries(Object.entries(attrs).filter(([, v]) => v !== undefined));
    let results;
    try {
      results = b.apply(key, xs, clean);
    } catch (e) {
      expect(e, `${key} threw ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`).toBeInstanceOf(IrError);
      return;
    }
    results.forEach((v, i) => {
      b.output(`r${String(i)}`, v);
    });
    const g = b.build();
    expect(checkGraph(g)).toEqual([]);
    expect(stripSpans(parseGraph(printGraph(g)))).toEqual(g);
    expect(deserializeGraph(serializeGraph(g))).toEqual(g);
  });
});
