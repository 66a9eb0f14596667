import { GraphBuilder, OP_KEYS, hostTensor, parseGraph } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { describe, expect, it } from 'vitest';
import { LowerCode, denseAttr, isUnsupported, lowerToMlir, mlirRuleOf, resourceBlob, scalarLiteral } from './index.js';
import { reassociate } from './reshape.js';

describe('scalarLiteral', () => {
  it('spells NaN and ±∞ as hex bit patterns of each float type, never as 0', () => {
    expect(scalarLiteral('f32', Number.NaN)).toBe('0x7FC00000');
    expect(scalarLiteral('f32', Number.POSITIVE_INFINITY)).toBe('0x7F800000');
    expect(scalarLiteral('f32', Number.NEGATIVE_INFINITY)).toBe('0xFF800000');
    expect(scalarLiteral('f64', Number.NaN)).toBe('0x7FF8000000000000');
    expect(scalarLiteral('f16', Number.NEGATIVE_INFINITY)).toBe('0xFC00');
    expect(scalarLiteral('bf16', Number.NaN)).toBe('0x7FC0');
  });

  it('prints the shortest float that reads back exactly, always with a fraction', () => {
    expect(scalarLiteral('f32', 1)).toBe('1.0');
    expect(scalarLiteral('f32', Math.fround(0.1))).toBe('0.1');
    expect(scalarLiteral('f32', Math.fround(1e-7))).toBe('1.0e-7');
    expect(scalarLiteral('f32', -0)).toBe('-0.0');
    expect(scalarLiteral('f64', 0.1)).toBe('0.1');
    expect(scalarLiteral('f32', 3e38)).toBe('3.0e+38');
  });

  it('prints integers exactly, u8 as its i8 bit pattern and bools as words', () => {
    expect(scalarLiteral('i64', -(2 ** 63))).toBe('-9223372036854775808');
    expect(scalarLiteral('i64', 2 ** 53)).toBe('9007199254740992');
    expect(scalarLiteral('u8', 200)).toBe('-56');
    expect(scalarLiteral('bool', 1)).toBe('true');
  });
});

describe('denseAttr and resourceBlob', () => {
  it('splats uniform tensors and nests the rest row-major', () => {
    expect(denseAttr(hostTensor('f32', [2, 2], [0, 0, 0, 0]))).toBe('dense<0.0> : tensor<2x2xf32>');
    expect(denseAttr(hostTensor('f32', [2, 2], [1, Number.NaN, 3, 4]))).toBe('dense<[[1.0, 0x7FC00000], [3.0, 4.0]]> : tensor<2x2xf32>');
    expect(denseAttr(hostTensor('bool', [3], [1, 0, 1]))).toBe('dense<[true, false, true]> : tensor<3xi1>');
    expect(denseAttr(hostTensor('f32', [], [2.5]))).toBe('dense<2.5> : tensor<f32>');
  });

  it('encodes blobs as an alignment word and little-endian elements', () => {
    expect(resourceBlob(hostTensor('f32', [2], [1, Number.NaN]))).toBe('0x040000000000803F0000C07F');
    expect(resourceBlob(hostTensor('i64', [1], [-2]))).toBe('0x08000000FEFFFFFFFFFFFFFF');
    expect(resourceBlob(hostTensor('f16', [1], [1]))).toBe('0x02000000003C');
  });
});

describe('reassociate', () => {
  it('groups expansions, collapses and symbolic products', () => {
    expect(reassociate([{ terms: [{ vars: ['b'], coef: 1 }], constant: 0 }, 64], [{ terms: [{ vars: ['b'], coef: 1 }], constant: 0 }, 4, 16])).toEqual([
      { src: [0], dst: [0] },
      { src: [1], dst: [1, 2] },
    ]);
    expect(reassociate([2, 3, 4], [6, 4])).toEqual([
      { src: [0, 1], dst: [0] },
      { src: [2], dst: [1] },
    ]);
    expect(reassociate([6], [1, 6, 1])).toEqual([{ src: [0], dst: [0, 1, 2] }]);
  });

  it('gives up when no grouping has equal products', () => {
    expect(reassociate([2, 3], [3, 2])).toBeUndefined();
  });
});

describe('mlirRules', () => {
  it('covers every registry op, and only random ops are unsupported', () => {
    const unsupported = OP_KEYS.filter((k) => isUnsupported(mlirRuleOf(k)));
    expect(unsupported).toEqual(['randomUniform', 'quantizedLinear']);
  });
});

describe('lowerToMlir', () => {
  const lora = parseGraph(`graph @lora {
    %x = input : f32[batch, 8]
    %w = param : f32[6, 8]
    %a = param : f32[2, 8]
    %s = sml.constant() {value = [0.5]} : f32[]
    %base = sml.linear(%x, %w) : f32[batch, 6]
    %d = sml.linear(%x, %a) : f32[batch, 2]
    return y = %base, d = %d
  }`);
  const w = hostTensor('f32', [6, 8], Array.from({ length: 48 }, (_, i) => i / 8));
  const a = hostTensor('f32', [2, 8], Array.from({ length: 16 }, (_, i) => -i));

  it('inlines small constants and passes large ones as arguments by default', () => {
    const m = lowerToMlir(lora, { w, a });
    expect(m.text).toContain('%a = arith.constant dense<[[');
    expect(m.function.arguments.map((x) => [x.name, x.kind])).toEqual([
      ['x', 'input'],
      ['w', 'constant'],
    ]);
    expect(m.text).toContain('%w: tensor<6x8xf32> {stageml.constant = "w"}');
    expect(m.text).not.toContain('dense_resource');
  });

  it('puts large constants in a dialect_resources section in resources mode', () => {
    const m = lowerToMlir(lora, { w, a }, { constants: 'resources', inlineLimit: 0 });
    expect(m.function.arguments.map((x) => x.name)).toEqual(['x']);
    expect(m.text).toContain('%w = arith.constant dense_resource<lora_w> : tensor<6x8xf32>');
    expect(m.text).toMatch(/\{-#\n {2}dialect_resources: \{\n {4}builtin: \{\n {6}lora_w: "0x04000000/);
    const body = m.text.slice(0, m.text.indexOf('{-#'));
    expect(body.length).toBeLessThan(4000);
  });

  it('always inlines splats, so no rank-0 dense_resource reaches MLIR 19 (which crashes on it)', () => {
    const m = lowerToMlir(lora, { w, a }, { constants: 'resources', inlineLimit: 0 });
    expect(m.text).toContain('%s = arith.constant dense<0.5> : tensor<f32>');
    const zeros = lowerToMlir(lora, { w: hostTensor('f32', [6, 8], new Array<number>(48).fill(0)), a }, { inlineLimit: 0 });
    expect(zeros.text).toContain('%w = arith.constant dense<0.0> : tensor<6x8xf32>');
  });

  it('keeps parameters without values as arguments and computes symbolic sizes once', () => {
    const m = lowerToMlir(lora);
    expect(m.function.arguments.map((x) => x.kind)).toEqual(['input', 'param', 'param']);
    expect(m.text.match(/%batch = tensor.dim %x, %c0/g)).toHaveLength(1);
    expect(m.text).toContain('-> (tensor<?x6xf32> {stageml.output = "y"}, tensor<?x2xf32> {stageml.output = "d"})');
  });

  it('is deterministic', () => {
    expect(lowerToMlir(lora, { w, a }).text).toBe(lowerToMlir(lora, { w, a }).text);
  });

  it('names the op and the reason when an op has no lowering (LOWER_UNSUPPORTED_OP)', () => {
    const b = new GraphBuilder('noisy');
    const x = b.input('x', ['f32', [4]]);
    b.output('y', b.add(x, b.op('randomUniform', [], { shape: [4] })));
    const err = expectCode(() => lowerToMlir(b.build()), LowerCode.UNSUPPORTED_OP);
    expect(err.message).toMatch(/sml\.random_uniform/);
    expect(err.message).toMatch(/seeded stream/);
  });

  it('rejects a constant of the wrong shape (LOWER_BAD_CONSTANT)', () => {
    expectCode(() => lowerToMlir(lora, { w: a, a }), LowerCode.BAD_CONSTANT);
  });

  it('rejects bad options (LOWER_BAD_OPTIONS)', () => {
    expectCode(() => lowerToMlir(lora, {}, { inlineLimit: -1 }), LowerCode.BAD_OPTIONS);
    expectCode(() => lowerToMlir(lora, {}, { constants: 'inline' as 'args' }), LowerCode.BAD_OPTIONS);
  });

  it('solves a symbol from a linear dim once the others are bound', () => {
    const b = new GraphBuilder('solve');
    const x = b.input('x', ['f32', ['n']]);
    b.input('y', ['f32', ['2*m + n']]);
    b.output('i', b.add(b.cast(b.iota(['m'], 0), 'f32'), b.sum(x)));
    const text = lowerToMlir(b.build()).text;
    expect(text).toMatch(/%(\d+) = tensor.dim %y, %c0 : tensor<\?xf32>\n {4}%(\d+) = arith.subi %\1, %n : index\n(.*\n)? {4}%m = arith.divsi %\2, %c2 : index/);
    expect(text).toContain('tensor.empty(%m) : tensor<?xi64>');
  });

  it('reports a symbol no argument determines (LOWER_UNBOUND_DIM)', () => {
    const b = new GraphBuilder('positions');
    b.output('i', b.iota(['n'], 0));
    expectCode(() => lowerToMlir(b.build()), LowerCode.UNBOUND_DIM);
  });

  it('rejects an invalid graph with its IR code', () => {
    expectCode(() => lowerToMlir({ ...lora, outputs: [{ name: 'y', value: 99 }] }), 'IR_UNDEFINED_VALUE');
  });
});
