import { GraphBuilder, graphOps } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { bankGraph, bgmvGraph, loraGraph, moeGraph } from '../test/graphs.js';
import { recognizeResidual } from './patterns.js';

const D = { inDim: 64, outDim: 48 };

describe('recognizeResidual', () => {
  it('fuses a LoRA linear into one kernel covering every op', () => {
    const g = loraGraph('bf16', D, 8, 2);
    const r = recognizeResidual(g);
    expect(r.kernels).toHaveLength(1);
    const k = r.kernels[0]!;
    expect(k).toMatchObject({ kind: 'loraLinear', dtype: 'bf16', inDim: 64, outDim: 48, rows: 'batch', x: 'x', w: 'W', lora: { a: 'A', b: 'B', rank: 8, scale: 2 } });
    expect(r.uncovered).toEqual([]);
  });

  it('keeps biases of the base and of B', () => {
    const k = recognizeResidual(loraGraph('f16', D, 4, 1, true)).kernels[0]!;
    expect(k).toMatchObject({ kind: 'loraLinear', bias: 'bias', lora: { biasB: 'bias_B', scale: 1 } });
  });

  it('matches the residual sum and the scale in either operand order', () => {
    const b = new GraphBuilder('swapped');
    const x = b.input('x', ['f32', ['n', 16]]);
    const delta = b.linear(b.linear(x, b.param('A', ['f32', [4, 16]])), b.param('B', ['f32', [8, 4]]));
    b.output('y', b.add(b.mul(b.scalar(3), delta), b.linear(x, b.param('W', ['f32', [8, 16]]))));
    const r = recognizeResidual(b.build());
    expect(r.kernels.map((k) => k.kind)).toEqual(['loraLinear']);
    expect(r.kernels[0]).toMatchObject({ lora: { scale: 3, rank: 4 } });
  });

  it('does not fuse an interior value that something else reads', () => {
    const b = new GraphBuilder('shared');
    const x = b.input('x', ['f32', ['n', 16]]);
    const t = b.linear(x, b.param('A', ['f32', [4, 16]]));
    const y = b.add(b.linear(x, b.param('W', ['f32', [8, 16]])), b.linear(t, b.param('B', ['f32', [8, 4]])));
    b.output('y', y);
    b.output('t', t);
    const r = recognizeResidual(b.build());
    expect(r.kernels.map((k) => k.kind)).toEqual(['loraLinear', 'loraLinear', 'loraLinear']);
    expect(r.kernels.every((k) => k.kind === 'loraLinear' && k.lora === undefined)).toBe(true);
    expect(r.uncovered).toHaveLength(1);
  });

  it('recognizes an SGMV bank with mixed ranks as one kernel', () => {
    const g = bankGraph('f16', D, [8, 16, 64]);
    const r = recognizeResidual(g);
    expect(r.kernels).toHaveLength(1);
    const k = r.kernels[0]!;
    expect(k.kind).toBe('bankGrouped');
    if (k.kind !== 'bankGrouped') return;
    expect(k.groups.map((gr) => [gr.rowsValue, gr.rank, gr.scale])).toEqual([
      ['rows0', 8, 0.5],
      ['rows1', 16, 1],
      ['rows2', 64, 1.5],
    ]);
    expect(r.uncovered).toEqual([]);
  });

  it('recognizes a BGMV bank with its rows per id', () => {
    const k = recognizeResidual(bgmvGraph('bf16', D, 5, 16, 3)).kernels[0]!;
    expect(k).toMatchObject({ kind: 'bankGathered', numAdapters: 5, rank: 16, rowsPerId: 3, rows: '3*batch', ids: 'ids' });
  });

  it('recognizes both expert projections of a MoE block and leaves routing to the host', () => {
    const g = moeGraph('bf16', 64, 32, 4, 8);
    const r = recognizeResidual(g);
    expect(r.kernels.map((k) => k.kind)).toEqual(['loraLinear', 'moeLora', 'moeLora']);
    const [router, gateUp, down] = r.kernels;
    expect(router).toMatchObject({ w: 'router' });
    expect(router).not.toHaveProperty('lora');
    expect(gateUp).toMatchObject({ inDim: 64, outDim: 64, numExperts: 4, transposeW: true, lora: { rank: 8, scale: 2 } });
    expect(down).toMatchObject({ inDim: 32, outDim: 64, lora: { a: 'dn_A', b: 'dn_B' } });
    const hostOps = r.uncovered.map((i) => graphOps({ ...g, nodes: [g.nodes[i]!] })[0]!.op);
    expect(hostOps).toContain('softmax');
    expect(hostOps).toContain('topk');
    expect(hostOps).not.toContain('groupedMatmul');
  });

  it('rejects a match whose contraction dim is symbolic', () => {
    const b = new GraphBuilder('dyn');
    const x = b.input('x', ['f32', ['n', 'd']]);
    b.output('y', b.linear(x, b.input('W', ['f32', [8, 'd']])));
    const r = recognizeResidual(b.build());
    expect(r.kernels).toEqual([]);
    expect(r.rejected[0]?.message).toMatch(/input dim of linear is d/);
  });
});
