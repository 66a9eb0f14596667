import { GraphBuilder } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { recognizeResidual } from './recognize.js';

// The imperative recognizer these patterns replaced knew only the operand orders peft emits; the
// pattern forms match commutative operands in either order.
describe('recognizeResidual (pattern forms beyond peft)', () => {
  it('matches an expert LoRA with the scale on the left and the base on the right', () => {
    const b = new GraphBuilder('moe_swapped');
    const x = b.input('x', ['bf16', ['rows', 16]]);
    const g = b.input('experts', ['i64', ['rows']]);
    const w = b.param('W', ['bf16', [4, 8, 16]]);
    const a = b.param('A', ['bf16', [4, 2, 16]]);
    const bb = b.param('B', ['bf16', [4, 8, 2]]);
    const base = b.op('groupedMatmul', [x, w, g], { transposeW: true });
    const expand = b.op('groupedMatmul', [b.op('groupedMatmul', [x, a, g], { transposeW: true }), bb, g], { transposeW: true });
    b.output('y', b.add(b.mul(b.scalar(3, 'bf16'), expand), base));
    const r = recognizeResidual(b.build());
    expect(r.kernels).toHaveLength(1);
    expect(r.kernels[0]).toMatchObject({ kind: 'moeLora', name: 'moe_lora_y', numExperts: 4, inDim: 16, outDim: 8, lora: { a: 'A', b: 'B', rank: 2, scale: 3 } });
    expect(r.uncovered).toEqual([]);
  });

  it('matches a BGMV bank whose scale multiplies from the left', () => {
    const b = new GraphBuilder('bgmv_swapped');
    const x = b.input('x', ['f16', ['batch', 1, 16]]);
    const ids = b.input('ids', ['i64', ['batch']]);
    const w = b.param('W', ['f16', [8, 16]]);
    const gather = (name: string, shape: number[]) => b.op('gather', [b.param(name, ['f16', shape]), ids], { axis: 0 });
    const shrink = b.op('matmul', [x, gather('A', [3, 2, 16])], { transposeA: false, transposeB: true });
    const expand = b.op('matmul', [shrink, gather('B', [3, 8, 2])], { transposeA: false, transposeB: true });
    const scale = b.reshape(gather('S', [3]), [-1, 1, 1]);
    b.output('y', b.add(b.linear(x, w), b.mul(scale, expand)));
    const r = recognizeResidual(b.build());
    expect(r.kernels.map((k) => k.kind)).toEqual(['bankGathered']);
    expect(r.kernels[0]).toMatchObject({ a: 'A', b: 'B', scales: 'S', ids: 'ids', numAdapters: 3, rank: 2, rowsPerId: 1 });
  });

  it('rejects a symbolic rank instead of emitting a kernel', () => {
    const b = new GraphBuilder('symbolic');
    const x = b.input('x', ['f32', ['n', 16]]);
    const delta = b.linear(b.linear(x, b.param('A', ['f32', ['r', 16]])), b.param('B', ['f32', [8, 'r']]));
    b.output('y', b.add(b.linear(x, b.param('W', ['f32', [8, 16]])), delta));
    const r = recognizeResidual(b.build());
    expect(r.kernels.filter((k) => k.kind === 'loraLinear' && k.lora !== undefined)).toEqual([]);
    expect(r.rejected[0]).toEqual({ node: 7, value: 'add', message: 'rank of A is r: kernels specialize on it, so it must be static' });
  });
});
