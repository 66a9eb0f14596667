import { test } from '@fast-check/vitest';
import { type DType, type Graph, GraphBuilder, type HostTensor, type Value, hostTensor, interpret, seededRandom, verifyGraph } from '@stageml/ir';
import fc from 'fast-check';
import { describe, expect } from 'vitest';
import { recognizeResidual } from './recognize.js';
import { foldServingOps } from './serving-rules.js';

/** One random residual chain of a generated kernel, as `@stageml/peft` / `@stageml/moe` build it. */
interface Chain {
  readonly kind: 'lora' | 'bgmv' | 'sgmv' | 'moe';
  readonly dtype: DType;
  readonly rows: number;
  readonly inDim: number;
  readonly outDim: number;
  readonly ranks: readonly number[];
  readonly bias: boolean;
  /** Where the scale goes: on the right or left of the product, or no product at all. */
  readonly scale: 'right' | 'left' | 'none';
  readonly transposeW: boolean;
  readonly seed: number;
}

const arbChain: fc.Arbitrary<Chain> = fc.record({
  kind: fc.constantFrom('lora', 'bgmv', 'sgmv', 'moe'),
  dtype: fc.constantFrom<DType>('f32', 'bf16', 'f16'),
  rows: fc.integer({ min: 1, max: 4 }),
  inDim: fc.integer({ min: 1, max: 5 }),
  outDim: fc.integer({ min: 1, max: 5 }),
  ranks: fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 1, maxLength: 3 }),
  bias: fc.boolean(),
  scale: fc.constantFrom('right', 'left', 'none'),
  transposeW: fc.boolean(),
  seed: fc.nat(),
});

/** The chain's graph and data (integer leaves drawn in range). */
function build(c: Chain): { graph: Graph; ints: Record<string, number[]> } {
  const b = new GraphBuilder(c.kind);
  const r = seededRandom(c.seed);
  const ints: Record<string, number[]> = {};
  const index = (name: string, n: number, size: number): Value => {
    ints[name] = Array.from({ length: n }, () => Math.floor(r() * size));
    return b.input(name, ['i64', [n]]);
  };
  const p = (name: string, shape: number[]): Value => b.param(name, [c.dtype, shape]);
  const scaled = (delta: Value, s: number): Value => {
    if (c.scale === 'none') return delta;
    const k = b.scalar(s, c.dtype);
    return c.scale === 'left' ? b.mul(k, delta) : b.mul(delta, k);
  };
  const bias = (name: string): Value | undefined => (c.bias ? p(name, [c.outDim]) : undefined);
  const [rank] = c.ranks as [number];
  if (c.kind === 'lora') {
    const x = b.input('x', [c.dtype, [c.rows, c.inDim]]);
    const delta = b.linear(b.linear(x, p('A', [rank, c.inDim])), p('B', [c.outDim, rank]), bias('bias_B'));
    b.output('y', b.add(b.linear(x, p('W', [c.outDim, c.inDim]), bias('bias')), scaled(delta, 0.5)));
  } else if (c.kind === 'bgmv') {
    const adapters = c.ranks.length;
    const x = b.input('x', [c.dtype, [c.rows, 2, c.inDim]]);
    const ids = index('ids', c.rows, adapters);
    const gather = (name: string, shape: number[]): Value => b.gather(p(name, shape), ids, 0);
    const expand = b.matmul(b.matmul(x, gather('A', [adapters, rank, c.inDim]), { transposeB: true }), gather('B', [adapters, c.outDim, rank]), {
      transposeB: true,
    });
    const s = b.reshape(gather('S', [adapters]), [-1, 1, 1]);
    b.output('y', b.add(b.linear(x, p('W', [c.outDim, c.inDim]), bias('bias')), c.scale === 'left' ? b.mul(s, expand) : b.mul(expand, s)));
  } else if (c.kind === 'sgmv') {
    const x = b.input('x', [c.dtype, [c.rows, c.inDim]]);
    let y = b.linear(x, p('W', [c.outDim, c.inDim]), bias('bias'));
    c.ranks.forEach((rk, i) => {
      const rows = index(`rows${String(i)}`, 2, c.rows);
      const delta = b.linear(
        b.linear(b.indexSelect(x, rows, 0), p(`A${String(i)}`, [rk, c.inDim])),
        p(`B${String(i)}`, [c.outDim, rk]),
        i === 0 ? bias('bias_B') : undefined,
      );
      y = b.scatterAdd(y, rows, scaled(delta, 0.5 + i), 0);
    });
    b.output('y', y);
  } else {
    const experts = c.ranks.length;
    const x = b.input('x', [c.dtype, [c.rows, c.inDim]]);
    const g = index('experts', c.rows, experts);
    const base = b.op('groupedMatmul', [x, p('W', c.transposeW ? [experts, c.outDim, c.inDim] : [experts, c.inDim, c.outDim]), g], {
      transposeW: c.transposeW,
    });
    const shrink = b.op('groupedMatmul', [x, p('A', [experts, rank, c.inDim]), g], { transposeW: true });
    const expand = b.op('groupedMatmul', [shrink, p('B', [experts, c.outDim, rank]), g], { transposeW: true });
    b.output('y', b.add(scaled(expand, 2), base));
  }
  return { graph: b.build(), ints };
}

function dataFor(g: Graph, ints: Record<string, number[]>, seed: number): { inputs: Record<string, HostTensor>; weights: Record<string, HostTensor> } {
  const r = seededRandom(seed + 1);
  const inputs: Record<string, HostTensor> = {};
  const weights: Record<string, HostTensor> = {};
  for (const n of g.nodes) {
    if (n.kind === 'op') continue;
    const t = g.values[n.results[0]!]!.type;
    const shape = t.shape as number[];
    const values = ints[n.name] ?? Array.from({ length: shape.reduce((a, d) => a * d, 1) }, () => r() * 2 - 1);
    (n.kind === 'input' ? inputs : weights)[n.name] = hostTensor(t.dtype, shape, values);
  }
  return { inputs, weights };
}

const KERNEL_OF = { lora: 'loraLinear', bgmv: 'bankGathered', sgmv: 'bankGrouped', moe: 'moeLora' } as const;

describe('servingOpRules on random residual chains', () => {
  test.prop([arbChain])('fold the whole chain, verify, evaluate bit for bit as the chain, are idempotent and give one kernel over every op', (c) => {
    const { graph, ints } = build(c);
    const folded = foldServingOps(graph);
    expect(Object.values(folded.applied).reduce((a, n) => a + n, 0)).toBe(c.kind === 'sgmv' ? c.ranks.length : 1);
    verifyGraph(folded.graph);
    const data = dataFor(graph, ints, c.seed);
    expect(Array.from(interpret(folded.graph, data)['y']!.data)).toEqual(Array.from(interpret(graph, data)['y']!.data));
    expect(foldServingOps(folded.graph).graph).toBe(folded.graph);
    const r = recognizeResidual(graph);
    expect(r.kernels.map((k) => k.kind)).toEqual([KERNEL_OF[c.kind]]);
    expect(r.kernels[0]!.nodes).toEqual(graph.nodes.flatMap((n, i) => (n.kind === 'op' ? [i] : [])));
    expect(r.uncovered).toEqual([]);
  });
});
