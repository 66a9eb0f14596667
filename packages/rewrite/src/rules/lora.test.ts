import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { GraphBuilder, hostTensor, interpret, parseGraph, printGraph } from '@stageml/ir';
import { describe, expect, test } from 'vitest';
import { addMergeLora, defaultRules, loraServingSpec, rewriteGreedy } from '../index.js';

const fixture = parseGraph(readFileSync(fileURLToPath(new URL('../../../../fixtures/ir/lora-layer.ir', import.meta.url)), 'utf8'));

describe('add.merge-lora', () => {
  // Regression, from the original Python StageML: its rule matched torch.add(a, b,
  // alpha=k) — traced as add(a, mul(b, k)) — and dropped alpha, computing a wrong result.
  test('keeps the alpha of an alpha-scaled add', () => {
    const b = new GraphBuilder('alpha');
    const x = b.input('x', ['f32', [2, 3]]);
    const w = b.param('w', ['f32', [2, 3]]);
    const A = b.param('lora_A', ['f32', [1, 3]]);
    const B = b.param('lora_B', ['f32', [2, 1]]);
    const delta = b.mul(b.linear(b.linear(x, A), B), b.scalar(0.5));
    b.output('y', b.add(b.linear(x, w), b.mul(delta, b.scalar(3))));
    const g = b.build();
    const r = rewriteGreedy(g, [addMergeLora], { verifyEach: true });
    expect(r.applied['add.merge-lora']).toBe(1);
    const data = {
      inputs: { x: hostTensor('f32', [2, 3], [1, 2, 3, -1, 0, 2]) },
      weights: {
        w: hostTensor('f32', [2, 3], [1, 0, 0, 0, 1, 0]),
        lora_A: hostTensor('f32', [1, 3], [1, 1, 1]),
        lora_B: hostTensor('f32', [2, 1], [1, -1]),
      },
    };
    // x·Wᵀ = [[1, 2], [−1, 0]]; (x·Aᵀ)·Bᵀ = [[6, −6], [1, −1]]; y = x·Wᵀ + 3 · 0.5 · delta.
    expect(Array.from(interpret(g, data)['y']!.data)).toEqual([10, -7, 0.5, -1.5]);
    expect(Array.from(interpret(r.graph, data)['y']!.data)).toEqual([10, -7, 0.5, -1.5]);
    // With alpha dropped, y would be x·Wᵀ + 0.5·delta = [4, −1, −0.5, 0.5].
  });

  test('rewrites the fixture layer at the adapter cutoff and logs the step, before → after', () => {
    const r = rewriteGreedy(fixture, [defaultRules], { verifyEach: true, context: { lattice: 'serving', annotations: loraServingSpec(fixture), cutoff: 'adapter' } });
    expect(r.log.map((e) => [e.rule, e.node])).toEqual([['add.merge-lora', 'y']]);
    expect(r.log[0]!.before).toMatchInlineSnapshot(`
      "%base = sml.linear(%x, %w, %bias) : f32[batch, 96]
      %shrink = sml.linear(%x, %lora_A) : f32[batch, 8]
      %expand = sml.linear(%shrink, %lora_B) : f32[batch, 96]
      %delta = sml.mul(%expand, %scale) : f32[batch, 96]
      %y = sml.add(%base, %delta) : f32[batch, 96]"
    `);
    expect(r.log[0]!.after).toMatchInlineSnapshot(`
      "%y.matmul = sml.matmul(%lora_B, %lora_A) : f32[96, 64]
      %y.mul = sml.mul(%y.matmul, %scale) : f32[96, 64]
      %y.add = sml.add(%w, %y.mul) : f32[96, 64]
      %y = sml.linear(%x, %y.add, %bias) : f32[batch, 96]"
    `);
    expect(printGraph(r.graph)).toMatchInlineSnapshot(`
      "graph @lora_layer {
        %x = input : f32[batch, 64]
        %w = param : f32[96, 64]
        %bias = param : f32[96]
        %lora_A = param : f32[8, 64]
        %lora_B = param : f32[96, 8]
        %scale = sml.constant() {value = [2]} : f32[]
        %y.matmul = sml.matmul(%lora_B, %lora_A) : f32[96, 64]
        %y.mul = sml.mul(%y.matmul, %scale) : f32[96, 64]
        %y.add = sml.add(%w, %y.mul) : f32[96, 64]
        %y = sml.linear(%x, %y.add, %bias) : f32[batch, 96]
        return y = %y
      }
      "
    `);
  });
});
