import { describe, expect, test } from 'vitest';

import { attr } from './attrs.js';
import { GraphBuilder, traceGraph } from './builder.js';
import { parseGraph, stripSpans } from './parse.js';
import { printAttr, printFloat, printGraph, printName } from './print.js';
import { parseDim, sym } from './dim.js';

describe('printName', () => {
  test('prints identifiers bare', () => {
    expect(printName('layers.0.attn/q:proj-$1')).toBe('layers.0.attn/q:proj-$1');
  });
  test('quotes names with spaces, quotes, non-ASCII or nothing at all', () => {
    expect(printName('a b')).toBe('"a b"');
    expect(printName('say "hi"')).toBe('"say \\"hi\\""');
    expect(printName('poids')).toBe('poids');
    expect(printName('größe')).toBe('"größe"');
    expect(printName('')).toBe('""');
  });
  test('quotes names starting with // so the parser does not read a comment', () => {
    expect(printName('//x')).toBe('"//x"');
    expect(printName('a//b')).toBe('a//b');
  });
});

describe('printFloat', () => {
  test.each<[string, number, string]>([
    ['NaN', Number.NaN, 'nan'],
    ['+∞', Number.POSITIVE_INFINITY, 'inf'],
    ['−∞', Number.NEGATIVE_INFINITY, '-inf'],
    ['−0', -0, '-0'],
    ['+0', 0, '0'],
    ['0.1', 0.1, '0.1'],
    ['1e-7', 1e-7, '1e-7'],
    ['−2.5e300', -2.5e300, '-2.5e+300'],
  ])('prints %s as %s', (_label, x, text) => {
    expect(printFloat(x)).toBe(text);
  });
});

describe('printAttr', () => {
  test('prints each attribute kind in the generic syntax', () => {
    expect(printAttr(attr.bool({}), true)).toBe('true');
    expect(printAttr(attr.int({}), -3)).toBe('-3');
    expect(printAttr(attr.float({}), Number.NaN)).toBe('nan');
    expect(printAttr(attr.enum(['none', 'tanh'], {}), 'tanh')).toBe('"tanh"');
    expect(printAttr(attr.ints({}), [1, -2])).toBe('[1, -2]');
    expect(printAttr(attr.floats({}), [0.5, Number.NEGATIVE_INFINITY])).toBe('[0.5, -inf]');
    expect(printAttr(attr.dim({}), sym('seq'))).toBe('seq');
    expect(printAttr(attr.dims({}), [2, sym('seq')])).toBe('[2, seq]');
    expect(printAttr(attr.dtype({}), 'bf16')).toBe('bf16');
  });
});

describe('printGraph', () => {
  test('prints the generic form, omitting attributes at their defaults', () => {
    const g = traceGraph('block', (b) => {
      const x = b.input('x', ['f32', ['batch', 'seq', 8]]);
      const w = b.param('w', ['f32', [8, 4]]);
      const y = b.matmul(x, w);
      const z = b.matmul(x, w, { transposeB: false });
      const [v, i] = b.topk(b.softmax(b.add(y, z)), 2);
      return { values: v, indices: i };
    });
    expect(printGraph(g)).toMatchInlineSnapshot(`
      "graph @block {
        %x = input : f32[batch, seq, 8]
        %w = param : f32[8, 4]
        %matmul = sml.matmul(%x, %w) : f32[batch, seq, 4]
        %add = sml.add(%matmul, %matmul) : f32[batch, seq, 4]
        %softmax = sml.softmax(%add) : f32[batch, seq, 4]
        %topk.0, %topk.1 = sml.topk(%softmax) {k = 2} : f32[batch, seq, 2], i64[batch, seq, 2]
        return values = %topk.0, indices = %topk.1
      }
      "
    `);
  });

  test('prints symbolic attributes and results canonically', () => {
    const g = traceGraph('s', (b) => {
      const x = b.input('x', ['f32', ['seq', 'batch']]);
      return b.slice(b.reshape(x, [-1]), 0, 1, parseDim('batch*seq - 1'));
    });
    expect(printGraph(g)).toMatchInlineSnapshot(`
      "graph @s {
        %x = input : f32[seq, batch]
        %reshape = sml.reshape(%x) {shape = [-1]} : f32[batch*seq]
        %slice = sml.slice(%reshape) {axis = 0, start = 1, end = batch*seq - 1} : f32[batch*seq - 2]
        return out = %slice
      }
      "
    `);
  });

  test('round-trips names that need quoting, including ones starting with //', () => {
    const b = new GraphBuilder('my graph');
    const x = b.input('//x', ['f32', [2]]);
    const y = b.neg(x);
    b.output('out put', y);
    b.output('//y', x);
    b.output('', y);
    const g = b.build();
    expect(stripSpans(parseGraph(printGraph(g)))).toEqual(g);
  });

  test('round-trips float attributes exactly, NaN, infinities and −0 included', () => {
    const values = [Number.NaN, -0, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 5e-324, 1.7976931348623157e308, 0.1 + 0.2];
    const g = traceGraph('c', (b) => b.constant(values, 'f64', [values.length]));
    const back = stripSpans(parseGraph(printGraph(g)));
    expect(back).toEqual(g);
    const node = back.nodes[0]!;
    expect(node.kind === 'op' && Object.is((node.attrs['value'] as number[])[1], -0)).toBe(true);
  });

  test('keeps the sign of a −0 float attribute through print and parse', () => {
    const g = traceGraph('n', (b) => b.rmsNorm(b.input('x', ['f32', [4]]), undefined, -0));
    expect(printGraph(g)).toContain('{eps = -0}');
    const node = parseGraph(printGraph(g)).nodes[1]!;
    expect(node.kind === 'op' && Object.is(node.attrs['eps'], -0)).toBe(true);
  });
});
