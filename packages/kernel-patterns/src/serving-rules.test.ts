import {
  type DType,
  type Graph,
  GraphBuilder,
  type HostTensor,
  type Value,
  expandComposites,
  hostTensor,
  interpret,
  seededRandom,
  verifyGraph,
} from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { foldServingOps } from './serving-rules.js';

interface Data {
  inputs: Record<string, HostTensor>;
  weights: Record<string, HostTensor>;
}

/** Random data for every input and parameter of `g` (integer leaves from `ints`). */
function dataFor(g: Graph, ints: Record<string, readonly number[]> = {}, seed = 7): Data {
  const r = seededRandom(seed);
  const out: Data = { inputs: {}, weights: {} };
  for (const n of g.nodes) {
    if (n.kind === 'op') continue;
    const t = g.values[n.results[0]!]!.type;
    const shape = t.shape as number[];
    const values = ints[n.name] ?? Array.from({ length: shape.reduce((a, d) => a * d, 1) }, () => r() * 2 - 1);
    (n.kind === 'input' ? out.inputs : out.weights)[n.name] = hostTensor(t.dtype, shape, values);
  }
  return out;
}

const opsOf = (g: Graph): string[] => g.nodes.flatMap((n) => (n.kind === 'op' ? [n.op] : []));

/**
 * Folds `g`, checks the folded graph verifies, holds `op` where the chain was, evaluates equal to
 * `g` on the interpreter bit for bit and expands back into the chain's ops; returns the fold.
 */
function expectFolds(g: Graph, rule: string, op: string, count: number, ints: Record<string, readonly number[]> = {}): ReturnType<typeof foldServingOps> {
  const folded = foldServingOps(g);
  expect(folded.applied[rule]).toBe(count);
  verifyGraph(folded.graph);
  expect(opsOf(folded.graph).filter((o) => o === op)).toHaveLength(count);
  const data = dataFor(g, ints);
  const want = interpret(g, data);
  const got = interpret(folded.graph, data);
  for (const o of g.outputs) expect(Array.from(got[o.name]!.data), o.name).toEqual(Array.from(want[o.name]!.data));
  // Its decomposition is the chain again.
  expect(opsOf(expandComposites(folded.graph, () => true)).sort()).toEqual(opsOf(g).sort());
  return folded;
}

/** `@stageml/peft`'s residual LoRA layer: add(linear(x, W[, bias]), mul(linear(linear(x, A), B[, biasB]), s)). */
function loraChain(
  dtype: DType,
  opts: { bias?: boolean; biasB?: boolean; scale?: 'left' | 'right' | 'none'; shareShrink?: boolean; rank1?: boolean } = {},
): Graph {
  const b = new GraphBuilder('lora');
  const x = b.input('x', [dtype, opts.rank1 === true ? [6] : [3, 6]]);
  const w = b.param('W', [dtype, [5, 6]]);
  const A = b.param('A', [dtype, [2, 6]]);
  const B = b.param('B', [dtype, [5, 2]]);
  const base = b.linear(x, w, opts.bias === true ? b.param('bias', [dtype, [5]]) : undefined);
  const shrink = b.linear(x, A);
  const delta = b.linear(shrink, B, opts.biasB === true ? b.param('bias_B', [dtype, [5]]) : undefined);
  const s = (): Value => (opts.rank1 === true ? b.constant(0.75, dtype, [1, 1]) : b.scalar(0.75, dtype));
  const scaled = opts.scale === 'none' ? delta : opts.scale === 'left' ? b.mul(s(), delta) : b.mul(delta, s());
  b.output('y', b.add(base, scaled));
  if (opts.shareShrink === true) b.output('t', shrink);
  return b.build();
}

describe('add.fold-lora-linear', () => {
  it.each(['f32', 'bf16'] as const)(
    'folds the residual LoRA chain (%s; scale on either side or none; either bias) into one loraLinear op, bit for bit',
    (dtype) => {
      for (const scale of ['left', 'right', 'none'] as const) {
        for (const [bias, biasB] of [
          [false, false],
          [true, false],
          [false, true],
          [true, true],
        ] as const) {
          const folded = expectFolds(loraChain(dtype, { scale, bias, biasB }), 'add.fold-lora-linear', 'loraLinear', 1);
          const n = folded.graph.nodes.find((k) => k.kind === 'op' && k.op === 'loraLinear')!;
          expect(n.kind === 'op' && n.attrs).toEqual({ scale: scale === 'none' ? 1 : 0.75, loraBias: biasB });
          expect(n.operands).toHaveLength(4 + Number(bias) + Number(biasB));
        }
      }
    },
  );

  it('leaves a chain whose shrink has another reader, and a [1, 1] scale that would widen a rank-1 delta, as primitives', () => {
    for (const g of [loraChain('f32', { shareShrink: true }), loraChain('f32', { rank1: true })]) {
      const folded = foldServingOps(g);
      expect(folded.applied['add.fold-lora-linear']).toBe(0);
      expect(folded.graph).toBe(g);
    }
  });

  it('logs each fold with the input nodes its chain matched', () => {
    const g = loraChain('f32', { bias: true });
    const folded = foldServingOps(g);
    expect(folded.log.map((e) => [e.rule, e.node])).toEqual([['add.fold-lora-linear', 'add']]);
    // Every op node of the chain but the scale constant (a leaf of the pattern).
    const ops = g.nodes.flatMap((n, i) => (n.kind === 'op' && n.op !== 'constant' ? [i] : []));
    expect(folded.log[0]!.matched).toEqual(ops);
  });
});

/** `@stageml/peft`'s BGMV bank (`bankLinearGathered`), scale on either side of the product. */
function bgmvChain(dtype: DType, opts: { bias?: boolean; scaleLeft?: boolean; otherIds?: boolean } = {}): Graph {
  const b = new GraphBuilder('bgmv');
  const x = b.input('x', [dtype, [3, 2, 6]]);
  const ids = b.input('ids', ['i64', [3]]);
  const w = b.param('W', [dtype, [5, 6]]);
  const gather = (name: string, shape: number[], by: Value = ids): Value => b.gather(b.param(name, [dtype, shape]), by, 0);
  const base = b.linear(x, w, opts.bias === true ? b.param('bias', [dtype, [5]]) : undefined);
  const expand = b.matmul(b.matmul(x, gather('A', [4, 2, 6]), { transposeB: true }), gather('B', [4, 5, 2]), { transposeB: true });
  const s = b.reshape(gather('S', [4], opts.otherIds === true ? b.input('ids2', ['i64', [3]]) : ids), [-1, 1, 1]);
  b.output('y', b.add(base, opts.scaleLeft === true ? b.mul(s, expand) : b.mul(expand, s)));
  return b.build();
}

describe('add.fold-gathered-lora-linear', () => {
  it.each(['f32', 'bf16'] as const)(
    'folds the BGMV chain (%s; with and without bias; scale on either side) into one gatheredLoraLinear op, bit for bit',
    (dtype) => {
      for (const bias of [false, true]) {
        for (const scaleLeft of [false, true]) {
          expectFolds(bgmvChain(dtype, { bias, scaleLeft }), 'add.fold-gathered-lora-linear', 'gatheredLoraLinear', 1, { ids: [3, 0, 3] });
        }
      }
    },
  );

  it('leaves a chain whose scales are gathered by other ids', () => {
    const g = bgmvChain('f32', { otherIds: true });
    expect(foldServingOps(g).applied['add.fold-gathered-lora-linear']).toBe(0);
  });
});

/** `@stageml/peft`'s SGMV bank (`bankLinearGrouped`): one step per group over linear(x, W). */
function sgmvChain(dtype: DType, ranks: readonly number[], opts: { biasB?: number; unscaled?: number } = {}): Graph {
  const b = new GraphBuilder('sgmv');
  const x = b.input('x', [dtype, [5, 6]]);
  let y = b.linear(x, b.param('W', [dtype, [4, 6]]));
  ranks.forEach((r, i) => {
    const rows = b.input(`rows${String(i)}`, ['i64', [2]]);
    const biasB = opts.biasB === i ? b.param(`bias_B${String(i)}`, [dtype, [4]]) : undefined;
    const expand = b.linear(b.linear(b.indexSelect(x, rows, 0), b.param(`A${String(i)}`, [dtype, [r, 6]])), b.param(`B${String(i)}`, [dtype, [4, r]]), biasB);
    y = b.scatterAdd(y, rows, opts.unscaled === i ? expand : b.mul(expand, b.scalar(0.5 + i, dtype)), 0);
  });
  b.output('y', y);
  return b.build();
}

describe('scatterAdd.fold-lora-step', () => {
  it.each(['f32', 'bf16'] as const)(
    'folds every SGMV group (%s; mixed ranks, one with B’s bias, one unscaled) into a loraScatterAdd step, bit for bit',
    (dtype) => {
      const g = sgmvChain(dtype, [1, 3, 2], { biasB: 1, unscaled: 2 });
      const folded = expectFolds(g, 'scatterAdd.fold-lora-step', 'loraScatterAdd', 3, { rows0: [0, 4], rows1: [2, 2], rows2: [1, 3] });
      expect(opsOf(folded.graph)).toEqual(['linear', 'loraScatterAdd', 'loraScatterAdd', 'loraScatterAdd']);
      expect(folded.graph.nodes.flatMap((n) => (n.kind === 'op' && n.op === 'loraScatterAdd' ? [n.attrs['scale']] : []))).toEqual([0.5, 1.5, 1]);
    },
  );
});

/** A MoE expert projection with expert LoRA, as `@stageml/moe`'s `moeBlock` builds it. */
function moeChain(dtype: DType, transposeW: boolean, scaleLeft = false): Graph {
  const b = new GraphBuilder('moe');
  const x = b.input('x', [dtype, ['rows', 6]]);
  const g = b.input('experts', ['i64', ['rows']]);
  const w = b.param('W', [dtype, transposeW ? [3, 4, 6] : [3, 6, 4]]);
  const base = b.op('groupedMatmul', [x, w, g], { transposeW });
  const shrink = b.op('groupedMatmul', [x, b.param('A', [dtype, [3, 2, 6]]), g], { transposeW: true });
  const expand = b.op('groupedMatmul', [shrink, b.param('B', [dtype, [3, 4, 2]]), g], { transposeW: true });
  const s = b.scalar(2, dtype);
  b.output('y', b.add(scaleLeft ? b.mul(s, expand) : b.mul(expand, s), base));
  return b.build();
}

describe('add.fold-grouped-lora-matmul', () => {
  it.each(['f32', 'bf16'] as const)('folds the expert-LoRA chain (%s; either expert layout; scale on either side) into one groupedLoraMatmul op', (dtype) => {
    for (const transposeW of [false, true]) {
      const g = moeChain(dtype, transposeW, transposeW);
      const folded = foldServingOps(g);
      expect(folded.applied['add.fold-grouped-lora-matmul']).toBe(1);
      expect(opsOf(folded.graph)).toEqual(['groupedLoraMatmul']);
      const n = folded.graph.nodes.at(-1)!;
      expect(n.kind === 'op' && n.attrs).toEqual({ transposeW, scale: 2 });
      // Symbolic rows: bind them, then compare bit for bit.
      const r = seededRandom(3);
      const t = (shape: number[]): HostTensor =>
        hostTensor(
          dtype,
          shape,
          Array.from({ length: shape.reduce((a, d) => a * d, 1) }, () => r() * 2 - 1),
        );
      const data: Data = {
        inputs: { x: t([4, 6]), experts: hostTensor('i64', [4], [2, 0, 2, 1]) },
        weights: { W: t(transposeW ? [3, 4, 6] : [3, 6, 4]), A: t([3, 2, 6]), B: t([3, 4, 2]) },
      };
      expect(Array.from(interpret(folded.graph, data)['y']!.data)).toEqual(Array.from(interpret(g, data)['y']!.data));
      expect(opsOf(expandComposites(folded.graph, () => true)).sort()).toEqual(opsOf(g).sort());
    }
  });
});

describe('foldServingOps', () => {
  it('returns the input graph itself when nothing folds', () => {
    const b = new GraphBuilder('plain');
    b.output('y', b.linear(b.input('x', ['f32', [2, 3]]), b.param('W', ['f32', [4, 3]])));
    const g = b.build();
    const folded = foldServingOps(g);
    expect(folded.graph).toBe(g);
    expect(folded.log).toEqual([]);
    expect(Object.values(folded.applied)).toEqual([0, 0, 0, 0]);
  });
});
