import { test } from '@fast-check/vitest';
import type { GraphBuilder, Value } from '@stageml/ir';
import fc from 'fast-check';
import { describe, expect } from 'vitest';
import { type Couple, arbCase, checkRewrite } from '../../test/harness.js';
import { addMergeLinears, addMergeLora, defaultRules, linearAssociateFactors, linearSplitFactors, subMergeLinears, subMergeLora } from '../index.js';

/** Where a LoRA layer's scales sit, and how it is written. */
const arbForm = fc.record({
  din: fc.integer({ min: 1, max: 5 }),
  dout: fc.integer({ min: 1, max: 5 }),
  r: fc.integer({ min: 1, max: 3 }),
  bias: fc.boolean(),
  sub: fc.boolean(),
  swapAdd: fc.boolean(),
  onX: fc.boolean(),
  onMid: fc.boolean(),
  onOut: fc.boolean(),
  alpha: fc.boolean(),
  swapMul: fc.boolean(),
  scaleParam: fc.boolean(),
  values: fc.array(fc.integer({ min: -8, max: 8 }).map((k) => k / 4), { minLength: 4, maxLength: 4 }),
  rank3: fc.boolean(),
});
type Form = typeof arbForm extends fc.Arbitrary<infer F> ? F : never;

/** y = x·Wᵀ (+ c) ± [alpha ·] s_out · ((s_x · x)·Aᵀ · s_mid)·Bᵀ, written as the form says. */
function loraLayer(b: GraphBuilder, p: Form, couple: Couple): Record<string, Value> {
  const x = couple(b.input('in', ['f32', p.rank3 ? ['batch', 2, p.din] : ['batch', p.din]]));
  const w = b.param('w', ['f32', [p.dout, p.din]]);
  const A = b.param('lora_A', ['f32', [p.r, p.din]]);
  const B = b.param('lora_B', ['f32', [p.dout, p.r]]);
  let k = 0;
  const scale = (): Value => (p.scaleParam && k === 0 ? (k++, b.param('scale', ['f32', []])) : b.scalar(p.values[k++]!));
  const times = (v: Value, s: Value): Value => (p.swapMul ? b.mul(s, v) : b.mul(v, s));
  const base = b.linear(x, w, p.bias ? b.param('bias', ['f32', [p.dout]]) : undefined);
  let h = b.linear(p.onX ? times(x, scale()) : x, A);
  if (p.onMid) h = times(h, scale());
  let d = b.linear(h, B);
  if (p.onOut) d = times(d, scale());
  if (p.alpha) d = times(d, scale());
  const y = p.sub ? b.sub(base, d) : p.swapAdd ? b.add(d, base) : b.add(base, d);
  return { y };
}

describe('add.merge-lora and sub.merge-lora', () => {
  test.prop([arbCase(arbForm, loraLayer)])('every written form merges into one linear and keeps semantics', (c) => {
    const name = c.params.sub ? 'sub.merge-lora' : 'add.merge-lora';
    const r = checkRewrite(c, [addMergeLora, subMergeLora], { fires: name });
    // The output is one linear of x with the merged weight: no LoRA path is left per request.
    const y = r.graph.values[r.graph.outputs.find((o) => o.name === 'y')!.value]!;
    expect(r.graph.nodes[y.node]).toMatchObject({ kind: 'op', op: 'linear' });
    expect(r.log.find((e) => e.rule === name)!.after).toMatch(/sml\.matmul\(%lora_B/);
  });

  test.prop([arbCase(arbForm, loraLayer)])('the full library reaches one linear of x, whatever order its rules fire in', (c) => {
    const r = checkRewrite(c, [defaultRules]);
    const y = r.graph.values[r.graph.outputs.find((o) => o.name === 'y')!.value]!;
    expect(r.graph.nodes[y.node]).toMatchObject({ kind: 'op', op: 'linear' });
  });

  // Wide enough that a per-request B·A (out·in work) costs more than the LoRA path at batch 1.
  const wide = arbForm.chain((f) => fc.record({ din: fc.integer({ min: 10, max: 12 }), dout: fc.integer({ min: 10, max: 12 }) }).map((d) => ({ ...f, ...d })));
  test.prop([arbCase(wide, loraLayer, { noise: false })])('does not fire when the adapter is dynamic and the batch is small', (c) => {
    const context = { lattice: 'serving', annotations: { params: { lora_A: 'adapter', lora_B: 'adapter' } }, cutoff: 'base', sizes: { batch: 1 } };
    checkRewrite(c, [addMergeLora, subMergeLora], { notFires: c.params.sub ? 'sub.merge-lora' : 'add.merge-lora', context });
  });
});

const arbFactors = (small: boolean) =>
  fc.record({
    din: small ? fc.integer({ min: 1, max: 2 }) : fc.integer({ min: 6, max: 8 }),
    dout: small ? fc.integer({ min: 1, max: 2 }) : fc.integer({ min: 6, max: 8 }),
    r: small ? fc.integer({ min: 6, max: 8 }) : fc.constant(1),
    shared: fc.boolean(),
  });

describe('linear.associate-factors', () => {
  // (x·Aᵀ)·Bᵀ with a rank larger than in·out/(in + out): the folded product B·A is cheaper.
  const arb = arbCase(arbFactors(true), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', p.din]]));
    const h = b.linear(x, b.param('lora_A', ['f32', [p.r, p.din]]));
    return { y: b.linear(h, b.param('lora_B', ['f32', [p.dout, p.r]])) };
  });
  test.prop([arb])('(x·Aᵀ)·Bᵀ → x·(B·A)ᵀ when the rank is large keeps semantics', (c) => {
    checkRewrite(c, [linearAssociateFactors], { fires: 'linear.associate-factors' });
  });

  const low = arbCase(arbFactors(false), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', p.din]]));
    return { y: b.op('linear', [b.linear(x, b.param('lora_A', ['f32', [p.r, p.din]])), b.param('lora_B', ['f32', [p.dout, p.r]])], {}, { name: 'root' }) };
  });
  test.prop([low])('never fires for a low rank, where it alone would make the residual more expensive', (c) => {
    checkRewrite(c, [linearAssociateFactors], { notAt: 'root' });
  });
});

describe('linear.split-factors', () => {
  // x·(B·A)ᵀ with a low-rank product: the factored form is cheaper and the product need not be stored.
  const arb = arbCase(arbFactors(false), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', p.din]]));
    const ba = b.matmul(b.param('lora_B', ['f32', [p.dout, p.r]]), b.param('lora_A', ['f32', [p.r, p.din]]));
    return { y: b.linear(x, ba) };
  });
  test.prop([arb])('x·(B·A)ᵀ → (x·Aᵀ)·Bᵀ for a low rank keeps semantics', (c) => {
    checkRewrite(c, [linearSplitFactors], { fires: 'linear.split-factors' });
  });

  const high = arbCase(arbFactors(true), (b, p, couple) => {
    const x = couple(b.input('in', ['f32', ['batch', p.din]]));
    return { y: b.op('linear', [x, b.matmul(b.param('lora_B', ['f32', [p.dout, p.r]]), b.param('lora_A', ['f32', [p.r, p.din]]))], {}, { name: 'root' }) };
  });
  test.prop([high])('does not fire when the factors are larger than their product', (c) => {
    checkRewrite(c, [linearSplitFactors], { notAt: 'root' });
  });
});

describe('add.merge-linears and sub.merge-linears', () => {
  const arb = arbCase(
    fc.record({ din: fc.integer({ min: 1, max: 4 }), dout: fc.integer({ min: 1, max: 4 }), b1: fc.boolean(), b2: fc.boolean(), sub: fc.boolean(), swap: fc.boolean(), scales: fc.nat(2), s: fc.integer({ min: -8, max: 8 }) }),
    (b, p, couple) => {
      const x = couple(b.input('in', ['f32', ['batch', p.din]]));
      const lin = (w: string, bias: string | undefined): Value => b.linear(x, b.param(w, ['f32', [p.dout, p.din]]), bias === undefined ? undefined : b.param(bias, ['f32', [p.dout]]));
      const base = lin('w1', p.b1 ? 'b1' : undefined);
      let other = lin('w2', p.b2 ? 'b2' : undefined);
      for (let i = 0; i < p.scales; i++) other = p.swap ? b.mul(b.scalar(p.s / 4 + i), other) : b.mul(other, b.scalar(p.s / 4 + i));
      return { y: p.sub ? b.sub(base, other) : p.swap ? b.add(other, base) : b.add(base, other) };
    },
  );
  test.prop([arb])('x·W₁ᵀ ± s·x·W₂ᵀ → x·(W₁ ± s·W₂)ᵀ (biases too) keeps semantics', (c) => {
    checkRewrite(c, [addMergeLinears, subMergeLinears], { fires: c.params.sub ? 'sub.merge-linears' : 'add.merge-linears' });
  });
});
