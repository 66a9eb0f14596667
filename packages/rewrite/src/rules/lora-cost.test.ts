import { type Graph, GraphBuilder, f32 } from '@stageml/ir';
import { LLAMA_7B_GQA_SHAPE, buildLlamaGraph } from '@stageml/models';
import { describe, expect, test } from 'vitest';
import { type RewriteContextOptions, analyticCostModel, defaultRules, loraServingSpec, residualCost, rewriteGreedy } from '../index.js';

const D = 4096;
const R = 16;

/** y = x·Wᵀ + 2·(x·Aᵀ)·Bᵀ at d = 4096, r = 16 (shapes only); optionally a second adapter on the same W. */
function loraGraph(opts: { secondAdapter?: boolean; base?: boolean } = {}): Graph {
  const b = new GraphBuilder('lora');
  const w = b.param('w', ['f32', [D, D]]);
  const layer = (i: number): void => {
    const x = b.input(`x${String(i)}`, ['f32', ['batch', 'seq', D]]);
    const delta = b.mul(b.linear(b.linear(x, b.param(`lora_A${String(i)}`, ['f32', [R, D]])), b.param(`lora_B${String(i)}`, ['f32', [D, R]])), b.scalar(2));
    b.output(`y${String(i)}`, opts.base === false ? delta : b.add(b.linear(x, w), delta));
  };
  layer(0);
  if (opts.secondAdapter === true) layer(1);
  return b.build();
}

const ctx = (g: Graph, cutoff: 'base' | 'adapter', tokens: number, extra: Partial<RewriteContextOptions> = {}): RewriteContextOptions => ({
  lattice: 'serving',
  annotations: loraServingSpec(g),
  cutoff,
  sizes: { batch: 1, seq: tokens },
  ...extra,
});

const merges = (g: Graph, c: RewriteContextOptions): number => rewriteGreedy(g, [defaultRules], { context: c }).applied['add.merge-lora']!;

describe('LoRA merge cost guard (d = 4096, r = 16)', () => {
  test('the merged d×d product costs d/(2r) = 128× the LoRA path at batch·seq = 1', () => {
    const model = analyticCostModel();
    const x = f32([1, D]);
    const merged = model.opCost('linear', [x, f32([D, D])], [f32([1, D])], {}, {}).flops;
    const shrink = model.opCost('linear', [x, f32([R, D])], [f32([1, R])], {}, {}).flops;
    const expand = model.opCost('linear', [f32([1, R]), f32([D, R])], [f32([1, D])], {}, {}).flops;
    expect(merged / (shrink + expand)).toBe(128);
  });

  test('with static adapters the merge always fires: the LoRA path leaves the residual and constants shrink', () => {
    const g = loraGraph();
    for (const tokens of [1, 4096]) {
      const c = ctx(g, 'adapter', tokens, { memoryBudget: residualCost(g, ctx(g, 'adapter', tokens)).constantBytes });
      const r = rewriteGreedy(g, [defaultRules], { context: c, verifyEach: true });
      expect(r.applied['add.merge-lora']).toBe(1);
      expect(r.estimate.after.seconds).toBeLessThan(r.estimate.before.seconds);
      expect(r.estimate.after.constantBytes).toBeLessThan(r.estimate.before.constantBytes);
      expect(residualCost(r.graph, c).dynamicOps).toBe(1);
    }
  });

  test('with per-request adapters it fires at batch·seq = 4096, where it pays, and not at batch·seq = 1', () => {
    const g = loraGraph();
    const big = rewriteGreedy(g, [defaultRules], { context: ctx(g, 'base', 4096) });
    expect(big.applied['add.merge-lora']).toBe(1);
    expect(big.estimate.after.seconds).toBeLessThan(big.estimate.before.seconds);
    const small = rewriteGreedy(g, [defaultRules], { context: ctx(g, 'base', 1) });
    expect(Object.values(small.applied).every((n) => n === 0)).toBe(true);
    expect(small.estimate.after).toEqual(small.estimate.before);
  });

  test('does not fire where the merged weight breaks the memory budget (two adapters share W)', () => {
    const g = loraGraph({ secondAdapter: true });
    const table = residualCost(g, ctx(g, 'adapter', 4096)).constantBytes;
    // Merging the first adapter keeps W (the second still reads it) and adds a d×d weight.
    expect(merges(g, ctx(g, 'adapter', 4096, { memoryBudget: table }))).toBe(0);
    expect(merges(g, ctx(g, 'adapter', 4096, { memoryBudget: table + D * D * 4 }))).toBe(2);
    expect(merges(g, ctx(g, 'adapter', 4096))).toBe(2);
  });

  test('re-association alone never fires: x·(B·A)ᵀ would cost 128× more per request', () => {
    const g = loraGraph({ base: false });
    for (const cutoff of ['base', 'adapter'] as const) {
      for (const tokens of [1, 4096]) {
        const r = rewriteGreedy(g, [defaultRules], { context: ctx(g, cutoff, tokens) });
        expect(r.applied['linear.associate-factors']).toBe(0);
        expect(r.applied['linear.reorder-chain']).toBe(0);
        expect(r.applied['matmul.reorder-chain']).toBe(0);
      }
    }
  });
});

describe('rejected matches are remembered by signature', () => {
  test('a rejection carries over only to matches of the same shape', () => {
    // Two per-request adapters of one shape (d = 512, where a per-request B·A does not pay at
    // batch 64) and one of another (d = 8, where it does): only the small one merges.
    const b = new GraphBuilder('mixed');
    const layer = (i: number, d: number, r: number): void => {
      const x = b.input(`x${String(i)}`, ['f32', ['batch', d]]);
      const lora = b.linear(b.linear(x, b.param(`lora_A${String(i)}`, ['f32', [r, d]])), b.param(`lora_B${String(i)}`, ['f32', [d, r]]));
      b.output(`y${String(i)}`, b.add(b.linear(x, b.param(`w${String(i)}`, ['f32', [d, d]])), lora));
    };
    layer(0, 512, 8);
    layer(1, 8, 1);
    layer(2, 512, 8);
    const g = b.build();
    const r = rewriteGreedy(g, [defaultRules], { context: { lattice: 'serving', annotations: loraServingSpec(g), cutoff: 'base', sizes: { batch: 64 } } });
    expect(r.log.map((e) => e.node)).toEqual(['add_1']);
    expect(r.applied['add.merge-lora']! + r.applied['add.merge-linears']!).toBe(1);
  });
});

describe('the 7B-shaped graph with LoRA on every projection', () => {
  const g = buildLlamaGraph(LLAMA_7B_GQA_SHAPE, { lora: { rank: R, scale: 2 } });

  test('merges all 224 adapters when they are static, into a residual with no LoRA path', () => {
    const c = ctx(g, 'adapter', 4096);
    const r = rewriteGreedy(g, [defaultRules], { context: c });
    expect(r.stop).toBe('fixpoint');
    expect(r.applied['add.merge-lora']).toBe(224);
    expect(residualCost(g, c).dynamicOps - residualCost(r.graph, c).dynamicOps).toBe(224 * 4);
    expect(r.estimate.after.constantBytes).toBeLessThan(r.estimate.before.constantBytes);
  });

  test('changes nothing at batch·seq = 1 when adapters are bound per request', () => {
    const r = rewriteGreedy(g, [defaultRules], { context: ctx(g, 'base', 1) });
    expect(r.stop).toBe('fixpoint');
    expect(r.iterations).toBe(1);
    expect(Object.values(r.applied).every((n) => n === 0)).toBe(true);
    expect(r.graph.nodes).toHaveLength(g.nodes.length);
  });
});
