import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';
import { traceGraph } from './builder.js';
import { sym } from './dim.js';
import { IrCode, IrError } from './errors.js';
import type { Graph } from './graph.js';
import { parseGraph } from './parse.js';
import { checkGraph, verifyGraph } from './verify.js';

/*
 * The base graph (node index: value id = name):
 *   0: 0 = %x    input f32[batch, 3]
 *   1: 1 = %w    param f32[3, 4]
 *   2: 2 = %matmul   matmul(%x, %w)          f32[batch, 4]
 *   3: 3 = %constant constant {value=[1]}    f32[]
 *   4: 4 = %add      add(%matmul, %constant) f32[batch, 4]
 *   5: 5, 6 = %topk.0, %topk.1 topk(%add) {k=2}  f32[batch, 2], i64[batch, 2]
 */
const base: Graph = traceGraph('g', (b) => {
  const x = b.input('x', ['f32', ['batch', 3]]);
  const w = b.param('w', ['f32', [3, 4]]);
  const [v, i] = b.topk(b.add(b.matmul(x, w), b.constant(1)), 2);
  return { values: v, indices: i };
});

/** Mutable view of a graph's plain data, for building malformed graphs in tests. */
interface Draft {
  name: string;
  nodes: Record<string, unknown>[];
  values: { name: unknown; type: { dtype: unknown; shape: unknown[] }; node: unknown; index: unknown }[];
  outputs: { name: unknown; value: unknown }[];
}

/** A deep copy of `g` changed by `f` (the original is never touched). */
function edit(g: Graph, f: (d: Draft) => void): Graph {
  const d = structuredClone(g) as unknown as Draft;
  f(d);
  return d as unknown as Graph;
}

describe('verifyGraph', () => {
  test('accepts the base graph', () => {
    expect(checkGraph(base)).toEqual([]);
    expect(() => {
      verifyGraph(base);
    }).not.toThrow();
  });

  describe('rejects an unknown op with IR_UNKNOWN_OP', () => {
    test.each(['frobnicate', 'sml.add', 'constructor', 'toString', ''])('op key %j', (op) => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.nodes[4]!['op'] = op)));
      }, IrCode.UNKNOWN_OP);
    });
  });

  describe('rejects a wrong operand count with IR_OPERAND_COUNT', () => {
    test('one operand for matmul', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.nodes[2]!['operands'] = [0])));
      }, IrCode.OPERAND_COUNT);
    });
    test('three operands for add', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.nodes[4]!['operands'] = [2, 3, 3])));
      }, IrCode.OPERAND_COUNT);
    });
    test('an operand for constant', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.nodes[3]!['operands'] = [0])));
      }, IrCode.OPERAND_COUNT);
    });
    test('no operands for the variadic concat', () => {
      const g = traceGraph('c', (b) => b.concat([b.input('x', ['f32', [2]])], 0));
      expectCode(() => {
        verifyGraph(edit(g, (d) => (d.nodes[1]!['operands'] = [])));
      }, IrCode.OPERAND_COUNT);
    });
  });

  describe('rejects bad attributes with IR_BAD_ATTR', () => {
    test.each<[string, number, Record<string, unknown>]>([
      ['a missing required attribute (topk k)', 5, { axis: -1, largest: true }],
      ['an unknown attribute', 4, { alpha: 1 }],
      ['a wrong kind (bool for an int)', 5, { k: true, axis: -1, largest: true }],
      ['a non-integer int', 5, { k: 1.5, axis: -1, largest: true }],
      ['an int below its minimum', 5, { k: -1, axis: -1, largest: true }],
      ['an axis out of range', 5, { k: 2, axis: 2, largest: true }],
      ['a non-list for floats', 3, { value: 1, shape: [], dtype: 'f32' }],
      ['an unknown dtype attribute', 3, { value: [1], shape: [], dtype: 'f8' }],
      ['a malformed dim in dims', 3, { value: [1], shape: [{ terms: 'x' }], dtype: 'f32' }],
    ])('%s', (_what, node, attrs) => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.nodes[node]!['attrs'] = attrs)));
      }, IrCode.BAD_ATTR);
    });

    test('an enum value outside its set', () => {
      const g = traceGraph('e', (b) => b.gelu(b.input('x', ['f32', [2]]), 'tanh'));
      expectCode(() => {
        verifyGraph(edit(g, (d) => (d.nodes[1]!['attrs'] = { approximate: 'fast' })));
      }, IrCode.BAD_ATTR);
    });
  });

  describe('rejects a recorded type that differs from inference with IR_TYPE_MISMATCH', () => {
    test('a wrong shape', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.values[2]!.type.shape = [sym('batch'), 5])));
      }, IrCode.TYPE_MISMATCH);
    });
    test('a wrong dtype', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.values[6]!.type.dtype = 'i32')));
      }, IrCode.TYPE_MISMATCH);
    });
    test('a wrong rank', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.values[3]!.type.shape = [1])));
      }, IrCode.TYPE_MISMATCH);
    });
  });

  test('rejects operand shapes that violate the op rule with IR_SHAPE_MISMATCH', () => {
    expectCode(() => {
      verifyGraph(edit(base, (d) => (d.values[1]!.type.shape = [5, 4])));
    }, IrCode.SHAPE_MISMATCH);
  });

  test('rejects operand dtypes that violate the op rule with IR_DTYPE_MISMATCH', () => {
    expectCode(() => {
      verifyGraph(edit(base, (d) => (d.values[1]!.type.dtype = 'f16')));
    }, IrCode.DTYPE_MISMATCH);
  });

  describe('rejects use before definition with IR_UNDEFINED_VALUE', () => {
    test.each<[string, unknown]>([
      ['a later value', 4],
      ['its own result', 2],
      ['a negative id', -1],
      ['a fractional id', 0.5],
      ['a non-number', '0'],
    ])('an operand naming %s', (_what, id) => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.nodes[2]!['operands'] = [0, id])));
      }, IrCode.UNDEFINED_VALUE);
    });
    test('an output naming a value that does not exist', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.outputs[0]!.value = 7)));
      }, IrCode.UNDEFINED_VALUE);
    });
  });

  describe('rejects duplicate names with IR_DUPLICATE_NAME', () => {
    test('two values with one name', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.values[4]!.name = 'matmul')));
      }, IrCode.DUPLICATE_NAME);
    });
    test('an input and a parameter with one name', () => {
      expectCode(() => {
        verifyGraph(
          edit(base, (d) => {
            d.values[1]!.name = 'x';
            d.nodes[1]!['name'] = 'x';
          }),
        );
      }, IrCode.DUPLICATE_NAME);
    });
    test('two outputs with one name', () => {
      expectCode(() => {
        verifyGraph(edit(base, (d) => (d.outputs[1]!.name = 'values')));
      }, IrCode.DUPLICATE_NAME);
    });
  });

  describe('rejects malformed structure with IR_MALFORMED_GRAPH', () => {
    test.each<[string, (d: Draft) => void]>([
      ['results numbered out of definition order', (d) => (d.nodes[2]!['results'] = [3])],
      ['a value claiming the wrong defining node', (d) => (d.values[2]!.node = 3)],
      ['a value claiming the wrong result index', (d) => (d.values[6]!.index = 0)],
      ['more values than nodes define', (d) => d.values.push({ name: 'ghost', type: { dtype: 'f32', shape: [] }, node: 6, index: 0 })],
      ['an unknown node kind', (d) => (d.nodes[3]!['kind'] = 'macro')],
      ['a parameter with operands', (d) => (d.nodes[1]!['operands'] = [0])],
      ['an input whose value has another name', (d) => (d.nodes[0]!['name'] = 'y')],
      ['a multi-result op with one result', (d) => (d.nodes[5]!['results'] = [5])],
      ['a value name with a space', (d) => (d.values[4]!.name = 'a b')],
      ['a node without results', (d) => delete d.nodes[4]!['results']],
      ['a null node', (d) => (d.nodes[3] = null as unknown as Record<string, unknown>)],
      ['null attributes', (d) => (d.nodes[4]!['attrs'] = null)],
      ['a null output', (d) => (d.outputs[0] = null as unknown as Draft['outputs'][number])],
      ['a graph without a node list', (d) => delete (d as Partial<Draft>).nodes],
      ['a graph whose values are not a list', (d) => (d.values = {} as Draft['values'])],
    ])('%s', (_what, f) => {
      expectCode(() => {
        verifyGraph(edit(base, f));
      }, IrCode.MALFORMED_GRAPH);
    });
  });

  test('rejects a value of unknown dtype with IR_UNKNOWN_DTYPE', () => {
    expectCode(() => {
      verifyGraph(edit(base, (d) => (d.values[0]!.type.dtype = 'f8')));
    }, IrCode.UNKNOWN_DTYPE);
  });

  test.each<[string, unknown]>([
    ['negative', -2],
    ['fractional', 2.5],
    ['a string', 'batch'],
  ])('rejects a %s dimension with IR_INVALID_DIM', (_what, dim) => {
    expectCode(() => {
      verifyGraph(edit(base, (d) => (d.values[0]!.type.shape = [dim, 3])));
    }, IrCode.INVALID_DIM);
  });

  test('points the error at the offending node, its graph and its first value', () => {
    const e = expectCode(() => {
      verifyGraph(edit(base, (d) => (d.values[2]!.type.shape = [sym('batch'), 5])));
    }, IrCode.TYPE_MISMATCH);
    expect(e.at).toMatchObject({ graph: 'g', node: 2, value: 'matmul' });
  });

  test('points errors in parsed graphs at their source line and column', () => {
    const text = ['graph @p {', '  %x = input : f32[2]', '  %y = sml.neg(%x) : f32[3]', '  return y = %y', '}'].join('\n');
    const e = expectCode(() => parseGraph(text), IrCode.TYPE_MISMATCH);
    expect(e.at).toMatchObject({ line: 3, column: 3, node: 1, value: 'y' });
    expect(e.message).toMatch(/^3:3 /);
  });
});

describe('checkGraph', () => {
  test('returns an empty list for a valid graph', () => {
    expect(checkGraph(base)).toEqual([]);
  });

  test('reports every broken node, each as a coded IrError, in node order', () => {
    const errors = checkGraph(
      edit(base, (d) => {
        d.nodes[2]!['op'] = 'nope';
        d.values[6]!.type.dtype = 'f32';
        d.outputs[1]!.name = 'values';
      }),
    );
    expect(errors.every((e) => e instanceof IrError)).toBe(true);
    expect(errors.map((e) => e.code)).toEqual([IrCode.UNKNOWN_OP, IrCode.TYPE_MISMATCH, IrCode.DUPLICATE_NAME]);
    expect(errors.map((e) => e.at?.node)).toEqual([2, 5, undefined]);
  });
});
