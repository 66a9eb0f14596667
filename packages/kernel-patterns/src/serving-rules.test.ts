import { type DType, GraphBuilder, type HostTensor, expandComposites, interpret, seededRandom } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { recognizeResidual } from './recognize.js';
import { foldServingOps } from './serving-rules.js';

/** `@stageml/peft`'s residual LoRA layer: add(linear(x, W[, bias]), mul(linear(linear(x, A), B), s)). */
function loraChain(dtype: DType, opts: { bias?: boolean; scaleLeft?: boolean; shareShrink?: boolean } = {}) {
  const b = new GraphBuilder('lora');
  const x = b.input('x', [dtype, ['n', 6]]);
  const w = b.param('W', [dtype, [5, 6]]);
  const A = b.param('A', [dtype, [2, 6]]);
  const B = b.param('B', [dtype, [5, 2]]);
  const s = b.scalar(0.75, dtype);
  const base = b.linear(x, w, opts.bias === true ? b.param('bias', [dtype, [5]]) : undefined);
  const shrink = b.linear(x, A);
  const delta = b.linear(shrink, B);
  b.output('y', b.add(base, opts.scaleLeft === true ? b.mul(s, delta) : b.mul(delta, s)));
  if (opts.shareShrink === true) b.output('t', shrink);
  return b.build();
}

function values(dtype: DType): { inputs: Record<string, HostTensor>; weights: Record<string, HostTensor> } {
  const r = seededRandom(7);
  const t = (shape: number[]): HostTensor => ({ dtype, shape, data: Float32Array.from({ length: shape.reduce((a, d) => a * d, 1) }, () => r() * 2 - 1) });
  return { inputs: { x: t([3, 6]) }, weights: { W: t([5, 6]), A: t([2, 6]), B: t([5, 2]), bias: t([5]) } };
}

const opsOf = (g: ReturnType<typeof loraChain>): string[] => g.nodes.flatMap((n) => (n.kind === 'op' ? [n.op] : []));

describe('foldServingOps (add.fold-lora-linear)', () => {
  it.each(['f32', 'bf16'] as const)('folds the residual LoRA chain (%s, scale on either side) into one loraLinear op with the same results, bit for bit', (dtype) => {
    for (const scaleLeft of [false, true]) {
      const g = loraChain(dtype, { scaleLeft });
      const folded = foldServingOps(g);
      expect(folded.applied['add.fold-lora-linear']).toBe(1);
      expect(opsOf(folded.graph)).toEqual(['loraLinear']);
      expect(folded.graph.nodes.flatMap((n) => (n.kind === 'op' ? [n.attrs['scale']] : []))).toEqual([0.75]);
      const v = values(dtype);
      expect(interpret(folded.graph, v)['y']!.data).toEqual(interpret(g, v)['y']!.data);
      // Its decomposition is the chain again.
      expect(opsOf(expandComposites(folded.graph, () => true)).sort()).toEqual(['add', 'constant', 'linear', 'linear', 'linear', 'mul']);
    }
  });

  it('leaves a biased base and a chain whose shrink has another reader as primitives', () => {
    for (const g of [loraChain('f32', { bias: true }), loraChain('f32', { shareShrink: true })]) {
      const folded = foldServingOps(g);
      expect(folded.applied['add.fold-lora-linear']).toBe(0);
      expect(opsOf(folded.graph)).not.toContain('loraLinear');
    }
  });

  it('recognizeResidual reads the op as the same fused LoRA-linear kernel it found in the chain', () => {
    const g = loraChain('bf16');
    const fromChain = recognizeResidual(g).kernels;
    const fromOp = recognizeResidual(foldServingOps(g).graph).kernels;
    expect(fromOp).toHaveLength(1);
    const strip = (k: (typeof fromOp)[number]) => ({ ...k, nodes: [] });
    expect(fromOp.map(strip)).toEqual(fromChain.map(strip));
    expect(recognizeResidual(foldServingOps(g).graph).uncovered).toEqual([]);
  });
});
