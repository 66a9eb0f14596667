import { describe, expect, it } from 'vitest';
import { GraphBuilder } from './builder.js';
import { graphOps } from './graph.js';
import { OP_KEYS } from './ops/index.js';
import { typeToString } from './types.js';

describe('builder verbs', () => {
  it('exist for every op of the registry', () => {
    const b = new GraphBuilder('verbs') as unknown as Record<string, unknown>;
    expect(OP_KEYS.filter((k) => typeof b[k] !== 'function')).toEqual([]);
  });

  it('build the same nodes as the generic op call', () => {
    const b = new GraphBuilder('cmp');
    const x = b.input('x', ['f32', ['n', 4]]);
    const y = b.input('y', ['f32', ['n', 4]]);
    const verbs = [b.equal(x, y), b.notEqual(x, y), b.less(x, y), b.lessEqual(x, y), b.greater(x, y), b.greaterEqual(x, y)];
    expect(verbs.map((v) => v.type.dtype)).toEqual(Array(6).fill('bool'));
    expect(b.less(x, y)).toBe(b.op('less', [x, y]));
    const g = b.input('g', ['i64', ['n']]);
    const w = b.param('w', ['f32', [2, 3, 4]]);
    expect(typeToString(b.groupedMatmul(x, w, g, { transposeW: true }).type)).toBe(typeToString({ dtype: 'f32', shape: b.input('probe', ['f32', ['n', 3]]).type.shape }));
    expect(typeToString(b.randomUniform(['n', 2]).type)).toBe(typeToString(b.input('probe2', ['f32', ['n', 2]]).type));
    b.output('y', verbs[0]!);
    expect(graphOps(b.build()).map((n) => n.op)).toEqual(['equal', 'notEqual', 'less', 'lessEqual', 'greater', 'greaterEqual', 'groupedMatmul', 'randomUniform']);
  });
});
