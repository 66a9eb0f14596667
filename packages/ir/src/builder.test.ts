import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';
import { GraphBuilder, traceGraph } from './builder.js';
import { IrCode } from './errors.js';
import { printGraph } from './print.js';
import { verifyGraph } from './verify.js';

describe('GraphBuilder', () => {
  test('infers result types through the registry', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', ['f32', ['batch', 8]]);
    const y = b.linear(x, b.param('w', ['f32', [4, 8]]));
    expect(printGraph({ ...b.build(), outputs: [] })).toContain('%linear = sml.linear(%x, %w) : f32[batch, 4]');
    expect(y.type.shape).toHaveLength(2);
  });

  test('interns pure ops: the same op on the same operands and attributes is one value', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', ['f32', [2]]);
    expect(b.exp(x)).toBe(b.exp(x));
    expect(b.softmax(x, 0)).not.toBe(b.softmax(x, -1));
    expect(b.build().nodes).toHaveLength(4);
  });

  test('does not intern when asked not to, nor ever for random ops', () => {
    const b = new GraphBuilder('g', { intern: false });
    const x = b.input('x', ['f32', [2]]);
    expect(b.exp(x)).not.toBe(b.exp(x));
    const c = new GraphBuilder('h');
    const r1 = c.op('randomUniform', [], { shape: [2] });
    const r2 = c.op('randomUniform', [], { shape: [2] });
    expect(r1.id).not.toBe(r2.id);
  });

  test('makes names unique with numeric suffixes and prefixes them inside scopes', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', ['f32', [2]]);
    const names = [b.neg(x), b.neg(b.neg(x)), b.scope('layers.0', () => b.exp(x)), b.op('tanh', [x], undefined, { name: 'act' })].map((v) => v.name);
    expect(names).toEqual(['neg', 'neg_1', 'layers.0.exp', 'act']);
    verifyGraph(b.build());
  });

  test('names the results of multi-result ops <key>.<index>', () => {
    const b = new GraphBuilder('g');
    const [v, i] = b.topk(b.input('x', ['f32', [4]]), 2);
    expect([v.name, i.name]).toEqual(['topk.0', 'topk.1']);
  });

  test('rejects a wrong operand count with IR_OPERAND_COUNT pointing at the node being built', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', ['f32', [2]]);
    const e = expectCode(() => b.op('add', [x]), IrCode.OPERAND_COUNT);
    expect(e.at).toEqual({ graph: 'g', node: 1 });
    expectCode(() => b.op('concat', [], { axis: 0 }), IrCode.OPERAND_COUNT);
  });

  test('rejects values of another builder with IR_UNDEFINED_VALUE', () => {
    const other = new GraphBuilder('other').input('x', ['f32', [2]]);
    const b = new GraphBuilder('g');
    expectCode(() => b.neg(other), IrCode.UNDEFINED_VALUE);
    expectCode(() => {
      b.output('y', other);
    }, IrCode.UNDEFINED_VALUE);
    expectCode(() => b.value(5), IrCode.UNDEFINED_VALUE);
  });

  test('reports type errors of ops with their codes and the node position', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', ['f32', [2, 3]]);
    const e = expectCode(() => b.matmul(x, x), IrCode.SHAPE_MISMATCH);
    expect(e.at).toEqual({ graph: 'g', node: 1 });
    expectCode(() => b.add(x, b.input('i', ['i32', [2, 3]])), IrCode.DTYPE_MISMATCH);
    expectCode(() => b.softmax(x, 2), IrCode.BAD_ATTR);
    expectCode(() => b.op('transpose', [x], {} as never), IrCode.BAD_ATTR);
    expectCode(() => b.op('neg', [x], { alpha: 1 } as never), IrCode.BAD_ATTR);
  });

  test('rejects duplicate and unprintable leaf names', () => {
    const b = new GraphBuilder('g');
    b.input('x', ['f32', [2]]);
    expectCode(() => b.param('x', ['f32', [2]]), IrCode.DUPLICATE_NAME);
    expectCode(() => b.input('a b', ['f32', [2]]), IrCode.BAD_ATTR);
    expectCode(() => b.input('y', ['f32', [-1]]), IrCode.INVALID_DIM);
    expectCode(() => b.input('z', ['f32', ['seq +']]), IrCode.INVALID_DIM);
  });

  test('rejects negative static dims in shape attributes with IR_BAD_ATTR (the graph would not verify)', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', ['f32', [1]]);
    expectCode(() => b.op('broadcastTo', [x], { shape: [-1] }), IrCode.BAD_ATTR);
    expectCode(() => b.op('randomUniform', [], { shape: [2, -2] }), IrCode.BAD_ATTR);
    expectCode(() => b.op('iota', [], { shape: [-2] }), IrCode.BAD_ATTR);
    expectCode(() => b.op('constant', [], { value: [1], shape: [-1] }), IrCode.BAD_ATTR);
    expectCode(() => b.op('reshape', [x], { shape: [-2] }), IrCode.BAD_ATTR);
  });

  test('rejects duplicate output names with IR_DUPLICATE_NAME', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', ['f32', [2]]);
    b.output('y', x);
    expectCode(() => {
      b.output('y', x);
    }, IrCode.DUPLICATE_NAME);
  });

  test('keeps graphs it already built unchanged when building continues', () => {
    const b = new GraphBuilder('inc');
    const x = b.input('x', ['f32', [2]]);
    const first = b.build();
    b.output('y', b.neg(x));
    expect(first.nodes).toHaveLength(1);
    expect(first.values).toHaveLength(1);
    expect(first.outputs).toEqual([]);
  });
});

describe('traceGraph', () => {
  test('names a single output out, a list out0…, and a record by its keys', () => {
    const one = traceGraph('a', (b) => b.input('x', ['f32', []]));
    const list = traceGraph('b', (b) => {
      const x = b.input('x', ['f32', []]);
      return [x, b.neg(x)];
    });
    const rec = traceGraph('c', (b) => ({ logits: b.input('x', ['f32', []]) }));
    expect(one.outputs.map((o) => o.name)).toEqual(['out']);
    expect(list.outputs.map((o) => o.name)).toEqual(['out0', 'out1']);
    expect(rec.outputs.map((o) => o.name)).toEqual(['logits']);
  });
});
