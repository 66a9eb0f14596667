import { type DType, type Graph, GraphBuilder, type HostTensor, OP_KEYS, type OpKey, hostTensor } from '@stageml/ir';
import { opSamples } from '@stageml/testkit';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { once, reference, requireMlirTools, runOrExplain } from '../test/mlir-tools.js';
import { type RunnerCall, lowerFunction } from './index.js';
import { isUnsupported } from './rule.js';
import { mlirRuleOf } from './rules.js';

const SAMPLES_PER_OP = 8;
const LOWERED = OP_KEYS.filter((k) => !isUnsupported(mlirRuleOf(k)));

/**
 * Tolerances by dtype: f32 to 1e-5 as promised. f16/bf16 arithmetic and reductions round at every
 * step in MLIR but once in the reference, so they get a few ulps of their precision.
 */
const TOL: Record<DType, { rtol: number; atol: number }> = {
  f64: { rtol: 1e-9, atol: 1e-9 },
  f32: { rtol: 1e-5, atol: 1e-5 },
  f16: { rtol: 1e-2, atol: 1e-2 },
  bf16: { rtol: 5e-2, atol: 5e-2 },
  i64: { rtol: 0, atol: 0 },
  i32: { rtol: 0, atol: 0 },
  i8: { rtol: 0, atol: 0 },
  u8: { rtol: 0, atol: 0 },
  bool: { rtol: 0, atol: 0 },
};

interface Case {
  readonly op: OpKey;
  readonly graph: Graph;
  readonly values: Record<string, HostTensor>;
}

function caseOf(op: OpKey, index: number, operands: readonly HostTensor[], attrs: unknown): Case {
  const b = new GraphBuilder(`${op}_${String(index)}`);
  const values: Record<string, HostTensor> = {};
  const ins = operands.map((t, k) => {
    values[`x${String(k)}`] = t;
    return b.input(`x${String(k)}`, { dtype: t.dtype, shape: [...t.shape] });
  });
  const outs = b.apply(op, ins, attrs as never);
  outs.forEach((v, k) => {
    b.output(`y${String(k)}`, v);
  });
  return { op, graph: b.build(), values };
}

const ramp = (dtype: DType, shape: number[], f: (i: number) => number = (i) => Math.sin(i * 0.7)): HostTensor =>
  hostTensor(dtype, shape, Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => f(i)));
const NAN = Number.NaN;
const INF = Number.POSITIVE_INFINITY;

/** Hand-picked edge cases: every named-contraction form, NaN/±∞ handling, ties, GQA with masks. */
const EDGES: [OpKey, HostTensor[], unknown][] = [
  ['matmul', [ramp('f32', [2, 3, 4]), ramp('f32', [2, 4, 5])], {}],
  ['matmul', [ramp('f32', [2, 4, 3]), ramp('f32', [2, 4, 5])], { transposeA: true }],
  ['matmul', [ramp('f32', [2, 3, 4]), ramp('f32', [2, 5, 4])], { transposeB: true }],
  ['matmul', [ramp('f32', [4, 3]), ramp('f32', [5, 4])], { transposeA: true, transposeB: true }],
  ['matmul', [ramp('f32', [3, 4]), ramp('f32', [2, 1, 4, 5])], {}],
  ['matmul', [ramp('i64', [2, 3], (i) => i - 2), ramp('i64', [3, 2], (i) => 3 - i)], {}],
  ['linear', [ramp('f32', [2, 3, 4]), ramp('f32', [5, 4]), ramp('f32', [5])], {}],
  ['linear', [ramp('f32', [4]), ramp('f32', [5, 4]), ramp('f32', [5])], {}],
  ['attention', [ramp('f32', [1, 4, 2, 3]), ramp('f32', [1, 2, 5, 3]), ramp('f32', [1, 2, 5, 2]), ramp('bool', [2, 5], (i) => (i % 3 === 1 ? 0 : 1))], { causal: true }],
  ['attention', [ramp('f32', [2, 3, 2]), ramp('f32', [1, 4, 2]), ramp('f32', [1, 4, 3]), ramp('f32', [3, 4], (i) => (i === 0 ? -INF : 0))], { causal: true, scale: 0.3 }],
  ['topk', [hostTensor('f32', [2, 5], [1, NAN, 3, 3, -INF, 2, 2, 2, INF, NAN])], { k: 4 }],
  ['topk', [hostTensor('f32', [2, 5], [1, NAN, 3, 3, -INF, 2, 2, 2, INF, NAN])], { k: 5, largest: false }],
  ['topk', [hostTensor('i32', [4], [3, -1, 3, 7])], { k: 3 }],
  ['argmax', [hostTensor('f32', [3, 3], [1, 5, 5, -INF, -INF, -INF, 2, NAN, NAN])], { axis: 1 }],
  ['max', [hostTensor('f32', [2, 2], [NAN, 1, -INF, -INF])], { axes: [1] }],
  ['softmax', [hostTensor('f32', [2, 3], [-INF, -INF, -INF, 0, 1, INF])], {}],
  ['cast', [hostTensor('f32', [6], [NAN, INF, -3.7, 300.5, -0, 2.5])], { dtype: 'u8' }],
  ['cast', [hostTensor('f32', [4], [NAN, 0, -0, 1e-30])], { dtype: 'bool' }],
  ['cast', [hostTensor('i64', [3], [-1, 255, 2 ** 40])], { dtype: 'i8' }],
  ['notEqual', [hostTensor('f32', [3], [NAN, 1, 2]), hostTensor('f32', [3], [NAN, 1, 3])], {}],
  ['maximum', [hostTensor('f32', [3], [NAN, 1, -0]), hostTensor('f32', [1], [0])], {}],
  ['abs', [hostTensor('i8', [3], [-128, -5, 7])], {}],
  ['transpose', [ramp('f32', [2, 3])], { perm: [0, 1] }],
  ['concat', [ramp('f32', [2, 3])], { axis: 0 }],
  ['reshape', [ramp('f32', [2, 3, 2])], { shape: [3, 4] }],
];

const cases: Case[] = [
  ...LOWERED.flatMap((op) =>
    fc.sample(opSamples[op] as fc.Arbitrary<{ operands: HostTensor[]; attrs: unknown }>, { numRuns: SAMPLES_PER_OP, seed: 20250617 }).map((s, i) => caseOf(op, i, s.operands, s.attrs)),
  ),
  ...EDGES.map(([op, operands, attrs], i) => caseOf(op, 100 + i, operands, attrs)),
];

describe('every lowered op matches the reference interpreter on the CPU runner', () => {
  const batch = once(() => {
    const tools = requireMlirTools();
    const calls: RunnerCall[] = cases.map((c) => ({ fn: lowerFunction(c.graph, {}, { inlineLimit: 4 }), values: c.values }));
    return runOrExplain(calls, tools);
  });

  it.each(LOWERED)('%s', { timeout: 180_000 }, async (op) => {
    const outputs = await batch();
    cases.forEach((c, i) => {
      if (c.op !== op) return;
      const want = reference(c.graph, c.values);
      for (const [name, t] of Object.entries(want)) {
        // NOTE: the reference's erf is a Numerical Recipes fit (relative error < 1.2e-7); libm's is
        // exact to f64, so gelu in f64 agrees only to about 1e-7.
        const tol = op === 'gelu' && t.dtype === 'f64' ? { rtol: 1e-6, atol: 1e-7 } : TOL[t.dtype];
        expect(outputs[i]![name], `${c.graph.name} output ${name}`).toBeAllclose(t, tol);
      }
    });
  });
});
