import { analyzeBindingTimes, annotate, TWO_STAGE } from '@stageml/annotations';
import { type Graph, GraphBuilder } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { describe, expect, test } from 'vitest';
import { RwCode, m, matchPattern, patternAnchors } from './index.js';
import { WorkGraph } from './work-graph.js';

function view(g: Graph): WorkGraph {
  return new WorkGraph(g, analyzeBindingTimes(g, annotate(g, TWO_STAGE)));
}

/** Matches `p` at the value named `root` of `g`; returns captures by name (as value names). */
function matchAt(g: Graph, p: Parameters<typeof matchPattern>[1], root: string, accept: (caps: Record<string, string>) => boolean = () => true): Record<string, string> | undefined {
  const wg = view(g);
  const names = (caps: ReadonlyMap<string, number>): Record<string, string> => Object.fromEntries([...caps].map(([k, v]) => [k, wg.names[v]!]));
  const r = matchPattern(wg, p, wg.names.indexOf(root), (mr) => accept(names(mr.captures)));
  return r === undefined ? undefined : names(r.captures);
}

describe('m (pattern constructors)', () => {
  test('rejects unknown ops, wrong operand counts and unknown attributes with RW_BAD_PATTERN', () => {
    expectCode(() => m.op('frobnicate' as never), RwCode.BAD_PATTERN);
    expectCode(() => m.op('add', m.any()), RwCode.BAD_PATTERN);
    expectCode(() => m.op('matmul', m.any(), m.any(), { attrs: { transposeC: true } }), RwCode.BAD_PATTERN);
    expectCode(() => m.oneOf(), RwCode.BAD_PATTERN);
  });

  test('m.commutative asks the registry: only ops with the commutative trait', () => {
    expect(m.commutative('mul', m.any(), m.any()).commutative).toBe(true);
    expectCode(() => m.commutative('sub', m.any(), m.any()), RwCode.BAD_PATTERN);
    expectCode(() => m.commutative('matmul', m.any(), m.any()), RwCode.BAD_PATTERN);
  });

  test('patterns are frozen data', () => {
    const p = m.op('neg', m.capture('x'));
    expect(Object.isFrozen(p)).toBe(true);
    expect(JSON.parse(JSON.stringify(p))).toEqual({ kind: 'op', op: 'neg', operands: [{ kind: 'capture', name: 'x' }], shared: false, commutative: false });
  });

  test('patternAnchors lists the ops a root can be', () => {
    expect([...patternAnchors(m.op('add', m.any(), m.any()))!]).toEqual(['add']);
    expect([...patternAnchors(m.oneOf(m.op('add', m.any(), m.any()), m.scalar()))!]).toEqual(['add', 'constant']);
    expect(patternAnchors(m.any())).toBeUndefined();
  });
});

describe('matchPattern', () => {
  const b = new GraphBuilder('g');
  const x = b.input('x', ['f32', [4]]);
  const w = b.param('w', ['f32', [4]]);
  const one = b.scalar(1);
  const xw = b.op('mul', [x, w], undefined, { name: 'xw' });
  const y = b.op('mul', [one, xw], undefined, { name: 'y' });
  const sq = b.op('mul', [x, x], undefined, { name: 'sq' });
  const n1 = b.op('neg', [x], undefined, { name: 'n1' });
  const n2 = b.op('neg', [n1], undefined, { name: 'n2' });
  b.output('y', y);
  b.output('sq', sq);
  b.output('n2', n2);
  b.output('n1', n1);
  const g = b.build();

  test('matches commutative operands in either order', () => {
    expect(matchAt(g, m.commutative('mul', m.capture('v'), m.scalar(1)), 'y')).toEqual({ v: 'xw' });
    expect(matchAt(g, m.op('mul', m.capture('v'), m.scalar(1)), 'y')).toBeUndefined();
  });

  test('backtracks into the other order when the guard rejects the first', () => {
    const p = m.commutative('mul', m.capture('a'), m.capture('b'));
    expect(matchAt(g, p, 'xw', (c) => c['a'] === 'w')).toEqual({ a: 'w', b: 'x' });
  });

  test('a name used twice must bind one value', () => {
    expect(matchAt(g, m.op('mul', m.capture('v'), m.capture('v')), 'sq')).toEqual({ v: 'x' });
    expect(matchAt(g, m.op('mul', m.capture('v'), m.capture('v')), 'xw')).toBeUndefined();
  });

  test('interior ops must be single-use unless the pattern says shared', () => {
    expect(matchAt(g, m.op('neg', m.op('neg', m.capture('v'))), 'n2')).toBeUndefined();
    expect(matchAt(g, m.op('neg', m.op('neg', m.capture('v'), { shared: true })), 'n2')).toEqual({ v: 'x' });
  });

  test('checks binding times, types, attributes and scalar values', () => {
    expect(matchAt(g, m.op('mul', m.capture('a', { stage: 'dynamic' }), m.capture('b', { stage: 'static' })), 'xw')).toEqual({ a: 'x', b: 'w' });
    expect(matchAt(g, m.op('mul', m.capture('a', { stage: 'static' }), m.any()), 'xw')).toBeUndefined();
    expect(matchAt(g, m.op('mul', m.capture('a', { type: (t) => t.shape.length === 2 }), m.any()), 'xw')).toBeUndefined();
    expect(matchAt(g, m.commutative('mul', m.any(), m.scalar(2)), 'y')).toBeUndefined();
    expect(matchAt(g, m.oneOf(m.op('neg', m.any()), m.op('mul', m.any({ as: 'l' }), m.any())), 'xw')).toEqual({ l: 'x' });
  });
});
