import { fc, test as propTest } from '@fast-check/vitest';
import { describe, expect, test } from 'vitest';

import { arbGraph, expectCode } from '../../testkit/src/index.js';
import { traceGraph } from './builder.js';
import { IrCode, IrError, StageError } from './errors.js';
import { parseGraph, stripSpans } from './parse.js';
import { type Pass, PassManager } from './pass.js';
import { printGraph } from './print.js';

const g = traceGraph('g', (b) => b.softmax(b.add(b.input('x', ['f32', [2, 3]]), b.param('w', ['f32', [3]]))));

/** Freezes plain data recursively, so any mutation throws in strict mode. */
function deepFreeze<T>(x: T): T {
  if (typeof x === 'object' && x !== null && !Object.isFrozen(x)) {
    Object.freeze(x);
    for (const v of Object.values(x)) deepFreeze(v);
  }
  return x;
}

/** A pass that rebuilds the graph with every op's result renamed `<name>.r` (a new graph). */
const rename: Pass = {
  name: 'rename',
  run: (graph) => ({ ...graph, values: graph.values.map((v, i) => (graph.nodes[v.node]!.kind === 'op' ? { ...v, name: `${v.name}.r${String(i)}` } : v)) }),
};

/** A pass through the text form (identity on graphs). */
const reparse: Pass = { name: 'reparse', run: (graph) => stripSpans(parseGraph(printGraph(graph))) };

/** A pass that breaks the graph: it records a wrong result type for the last node. */
const corrupt: Pass = {
  name: 'corrupt',
  run: (graph) => ({
    ...graph,
    values: graph.values.map((v, i) => (i === graph.values.length - 1 ? { ...v, type: { dtype: 'f16' as const, shape: v.type.shape } } : v)),
  }),
};

describe('PassManager', () => {
  test('runs passes in order and records one timing per pass', () => {
    const seen: string[] = [];
    const spy = (name: string): Pass => ({
      name,
      run: (graph) => {
        seen.push(name);
        return graph;
      },
    });
    const pm = new PassManager([spy('a'), spy('b')]).add(spy('c'));
    expect(pm.passNames).toEqual(['a', 'b', 'c']);
    const r = pm.run(g);
    expect(seen).toEqual(['a', 'b', 'c']);
    expect(r.timings.map((t) => t.pass)).toEqual(['a', 'b', 'c']);
    for (const t of r.timings) {
      expect(Number.isFinite(t.ms)).toBe(true);
      expect(t.ms).toBeGreaterThanOrEqual(0);
    }
    expect(r.graph).toBe(g);
  });

  test('returns the input unchanged for an empty pipeline', () => {
    expect(new PassManager().run(g)).toEqual({ graph: g, timings: [] });
  });

  test('hands each pass the previous pass result', () => {
    const r = new PassManager([rename, reparse], { verifyEach: true }).run(g);
    expect(r.graph.values.map((v) => v.name)).toEqual(['x', 'w', 'add.r2', 'softmax.r3']);
  });

  test('never mutates the input graph (passes see frozen data)', () => {
    const frozen = deepFreeze(structuredClone(g));
    const before = structuredClone(frozen);
    const r = new PassManager([rename, reparse, corrupt]).run(frozen);
    expect(frozen).toEqual(before);
    expect(r.graph).not.toEqual(before);
  });

  test('with verifyEach, fails with IR_PASS_FAILED when a pass produces a graph that does not verify', () => {
    const e = expectCode(() => new PassManager([reparse, corrupt, reparse], { verifyEach: true }).run(g), IrCode.PASS_FAILED);
    expect(e.message).toContain("'corrupt'");
    expect(e.message).toContain(IrCode.TYPE_MISMATCH);
    expect((e.cause as IrError).code).toBe(IrCode.TYPE_MISMATCH);
    expect(e.at).toMatchObject({ graph: 'g', node: 3 });
  });

  test('without verifyEach, lets a bad graph through', () => {
    expect(new PassManager([corrupt]).run(g).graph.values[3]!.type.dtype).toBe('f16');
  });

  test('wraps a pass that throws into IR_PASS_FAILED naming the pass, keeping the cause', () => {
    const boom = new RangeError('out of fuel');
    const failing: Pass = {
      name: 'fold-constants',
      run: () => {
        throw boom;
      },
    };
    const e = expectCode(() => new PassManager([failing]).run(g), IrCode.PASS_FAILED);
    expect(e).toBeInstanceOf(IrError);
    expect(e.message).toContain("'fold-constants'");
    expect(e.cause).toBe(boom);
  });

  test('keeps the location of a coded error a pass throws', () => {
    const located: Pass = {
      name: 'located',
      run: () => {
        throw new StageError('RW_EXAMPLE', 'no match', { at: { graph: 'g', node: 2 } });
      },
    };
    const e = expectCode(() => new PassManager([located]).run(g), IrCode.PASS_FAILED);
    expect(e.at).toEqual({ graph: 'g', node: 2 });
    expect(e.message).toContain('RW_EXAMPLE');
  });

  propTest.prop([arbGraph({ maxNodes: 8 }), fc.integer({ min: 1, max: 3 })])(
    'with verifyEach, accepts a pipeline of identity passes on any built graph and returns an equal graph',
    (graph, n) => {
      const r = new PassManager(Array.from({ length: n }, () => reparse), { verifyEach: true }).run(graph);
      expect(r.graph).toEqual(graph);
      expect(r.timings).toHaveLength(n);
    },
  );
});
