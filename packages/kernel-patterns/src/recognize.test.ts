import { type DType, type Graph, GraphBuilder } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { recognizeResidual } from './recognize.js';
import { foldServingOps } from './serving-rules.js';

const opNodes = (g: Graph): number[] => g.nodes.flatMap((n, i) => (n.kind === 'op' ? [i] : []));

/** PEFT's residual LoRA layer with both biases, then a second, plain linear on its result. */
function loraThenLinear(dtype: DType): Graph {
  const b = new GraphBuilder('lora2');
  const x = b.input('x', [dtype, ['n', 6]]);
  const delta = b.linear(b.linear(x, b.param('A', [dtype, [2, 6]])), b.param('B', [dtype, [5, 2]]), b.param('bias_B', [dtype, [5]]));
  const h = b.add(b.linear(x, b.param('W', [dtype, [5, 6]]), b.param('bias', [dtype, [5]])), b.mul(delta, b.scalar(0.5, dtype)));
  b.output('y', b.linear(h, b.param('W2', [dtype, [3, 5]])));
  return b.build();
}

/** An SGMV bank over x of the given shape: linear(x, W) and one loraScatterAdd chain step per rank. */
function sgmv(xShape: (number | string)[], ranks: readonly number[]): Graph {
  const b = new GraphBuilder('sgmv');
  const x = b.input('x', ['f16', xShape]);
  let y = b.linear(x, b.param('W', ['f16', [8, 16]]));
  ranks.forEach((r, i) => {
    const rows = b.input(`rows${String(i)}`, ['i64', ['k']]);
    const expand = b.linear(b.linear(b.indexSelect(x, rows, 0), b.param(`A${String(i)}`, ['f16', [r, 16]])), b.param(`B${String(i)}`, ['f16', [8, r]]));
    y = b.scatterAdd(y, rows, b.mul(expand, b.scalar(i + 1, 'f16')), 0);
  });
  b.output('y', y);
  return b.build();
}

describe('recognizeResidual (reading serving ops)', () => {
  it('reads a folded loraLinear op as the kernel of its chain, reported in the input graph’s node indices either way', () => {
    const g = loraThenLinear('bf16');
    const r = recognizeResidual(g);
    expect(r.kernels.map((k) => [k.kind, k.name])).toEqual([
      ['loraLinear', 'lora_linear_add'],
      ['loraLinear', 'linear_y'],
    ]);
    expect(r.kernels[0]).toMatchObject({
      x: 'x',
      w: 'W',
      bias: 'bias',
      rows: 'n',
      inDim: 6,
      outDim: 5,
      lora: { a: 'A', b: 'B', biasB: 'bias_B', rank: 2, scale: 0.5 },
    });
    // The chain's nodes, its scale constant included, and the second linear: every op of g.
    expect([...r.kernels[0]!.nodes, ...r.kernels[1]!.nodes].sort((p, q) => p - q)).toEqual(opNodes(g));
    expect(r.uncovered).toEqual([]);
    // A bundle's residual comes folded already: the same kernels, over its own nodes.
    const folded = foldServingOps(g).graph;
    const again = recognizeResidual(folded);
    const strip = (k: (typeof again.kernels)[number]) => ({ ...k, nodes: [] });
    expect(again.kernels.map(strip)).toEqual(r.kernels.map(strip));
    expect(again.kernels.flatMap((k) => k.nodes).sort((p, q) => p - q)).toEqual(opNodes(folded));
  });

  it('reads a chain of loraScatterAdd steps over the linear of the same x as one SGMV kernel', () => {
    const g = sgmv(['batch', 16], [4, 8]);
    const r = recognizeResidual(g);
    expect(r.kernels).toHaveLength(1);
    expect(r.kernels[0]).toMatchObject({
      kind: 'bankGrouped',
      name: 'lora_bank_y',
      w: 'W',
      groups: [
        { rowsValue: 'rows0', rank: 4, scale: 1 },
        { rowsValue: 'rows1', rank: 8, scale: 2 },
      ],
    });
    expect(r.kernels[0]!.nodes).toEqual(opNodes(g));
    expect(r.uncovered).toEqual([]);
  });

  it('leaves SGMV steps over a rank-3 x to the host, and reads their base as a plain linear', () => {
    const g = sgmv(['batch', 2, 16], [4]);
    const r = recognizeResidual(g);
    expect(r.kernels.map((k) => k.kind === 'loraLinear' && k.lora === undefined)).toEqual([true]);
    // The step's chain (indexSelect, two linears, the scale and its mul, the scatter) stays.
    expect(r.uncovered).toHaveLength(6);
  });

  it('matches an expert LoRA without a scale as a MoE-LoRA kernel of scale 1', () => {
    const b = new GraphBuilder('moe_unscaled');
    const x = b.input('x', ['f16', ['rows', 16]]);
    const g = b.input('experts', ['i64', ['rows']]);
    const base = b.op('groupedMatmul', [x, b.param('W', ['f16', [4, 16, 8]]), g]);
    const shrink = b.op('groupedMatmul', [x, b.param('A', ['f16', [4, 2, 16]]), g], { transposeW: true });
    b.output('y', b.add(base, b.op('groupedMatmul', [shrink, b.param('B', ['f16', [4, 8, 2]]), g], { transposeW: true })));
    const r = recognizeResidual(b.build());
    expect(r.kernels).toHaveLength(1);
    expect(r.kernels[0]).toMatchObject({ kind: 'moeLora', transposeW: false, inDim: 16, outDim: 8, lora: { rank: 2, scale: 1 } });
    expect(r.uncovered).toEqual([]);
  });
});

// The serving rules match commutative operands in either order, so the kernels do too.
describe('recognizeResidual (operand orders beyond peft)', () => {
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
    expect(r.kernels[0]).toMatchObject({
      kind: 'moeLora',
      name: 'moe_lora_y',
      numExperts: 4,
      inDim: 16,
      outDim: 8,
      lora: { a: 'A', b: 'B', rank: 2, scale: 3 },
    });
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
