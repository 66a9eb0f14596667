// Sibling linears (one input, several weights: a layer's q/k/v, gate/up) fused into one
// LINEAR_MULTI / QLINEAR_MULTI instruction: fewer instructions, the same results as the
// interpreter at decode rows (one pool job over every weight's tiles) and at more rows (each
// weight its own GEMM), and no fusion where a sibling cannot move (a bias, other blocks); the single
// slot form's shrinks (weights that are gather views of the slot tables) fuse too; quantized
// siblings stay one job at every row count (their tiles are one kernel), with the same bits.
import { GraphBuilder, type HostTensor, expandComposites, interpret, quantizeWeight, seededRandom } from '@stageml/ir';
import { describe, expect, test } from 'vitest';

import { createCpuNativeExecutor, encodeProgram } from './index.js';

const executor = createCpuNativeExecutor({ threads: 2 });

function rand(n: number, seed: number): Float32Array {
  const r = seededRandom(seed);
  return Float32Array.from({ length: n }, () => r() * 2 - 1);
}

function closeTo(got: HostTensor, want: HostTensor, tol: number): void {
  expect(got.shape).toEqual(want.shape);
  for (let i = 0; i < want.data.length; i++) {
    const w = Number(want.data[i]);
    expect(Math.abs(Number(got.data[i]) - w), `element ${String(i)}`).toBeLessThanOrEqual(tol * (1 + Math.abs(w)));
  }
}

describe('sibling f32 linears', () => {
  // q, k and v of one input (outputs with 4-row tails: 7 and 13), and an unrelated linear of the output.
  const K = 72;
  const outs = [40, 7, 13];
  const build = (bias: boolean) => {
    const b = new GraphBuilder('siblings');
    const x = b.input('x', ['f32', ['m', K]]);
    const ys = outs.map((n, j) => b.linear(x, b.input(`w${String(j)}`, ['f32', [n, K]]), j === 1 && bias ? b.input('bias', ['f32', [n]]) : undefined));
    ys.forEach((y, j) => { b.output(`y${String(j)}`, y); });
    b.output('z', b.linear(ys[0]!, b.input('wz', ['f32', [5, 40]])));
    return b.build();
  };
  const weights: Record<string, HostTensor> = Object.fromEntries([...outs.map((n, j) => [`w${String(j)}`, { dtype: 'f32', shape: [n, K], data: rand(n * K, j + 1) }] as const), ['wz', { dtype: 'f32', shape: [5, 40], data: rand(200, 9) }], ['bias', { dtype: 'f32', shape: [7], data: rand(7, 10) }]]);

  test('fuse into one instruction, unless one has a bias', () => {
    // 3 siblings + z + 4 output copies: fused, 1 + 1 + 4; with k's bias, q and v fuse (k stays): 2 + 1 + 4.
    expect(encodeProgram(build(false), new Map()).stats.instructions).toBe(6);
    expect(encodeProgram(build(true), new Map()).stats.instructions).toBe(7);
  });

  test.each([1, 2, 4, 5, 9])('%i rows equal the interpreter', async (m) => {
    for (const bias of [false, true]) {
      const g = build(bias);
      const prepared = await executor.prepare(g);
      const inputs = { ...weights, x: { dtype: 'f32', shape: [m, K], data: rand(m * K, 20 + m) } as HostTensor };
      if (!bias) delete (inputs as Record<string, HostTensor | undefined>)['bias'];
      const got = await prepared.run(inputs);
      const want = interpret(g, { inputs });
      for (const name of ['y0', 'y1', 'y2', 'z']) closeTo(got[name]!, want[name]!, 2e-5);
      prepared.dispose();
    }
  });
});

describe('sibling quantized linears', () => {
  const K = 96;
  test.each([
    [8, true],
    [4, true],
    [4, false],
  ] as const)('int%i (symmetric %s): fused, within the activation rounding of the unfused runs', async (bits, symmetric) => {
    const outs = [48, 16, 21];
    const b = new GraphBuilder('qsiblings');
    const x = b.input('x', ['f32', ['m', K]]);
    const params: Record<string, HostTensor> = {};
    const attrs: ReturnType<typeof quantizeWeight>['attrs'][] = [];
    outs.forEach((n, j) => {
      const p = quantizeWeight(rand(n * K, 30 + j), n, K, { bits, blockSize: 32, symmetric });
      attrs.push(p.attrs);
      params[`q${String(j)}`] = p.qweight;
      params[`s${String(j)}`] = p.scales;
      if (p.zeroPoints !== undefined) params[`z${String(j)}`] = p.zeroPoints;
      const z = p.zeroPoints === undefined ? undefined : b.param(`z${String(j)}`, ['u8', p.zeroPoints.shape]);
      b.output(`y${String(j)}`, b.quantizedLinear(x, b.param(`q${String(j)}`, ['u8', p.qweight.shape]), b.param(`s${String(j)}`, ['f32', p.scales.shape]), z, p.attrs));
    });
    const g = b.build();
    expect(encodeProgram(g, new Map(Object.entries(params))).stats.instructions).toBe(1 + outs.length);
    const fused = await executor.prepare(g, params);
    // Each weight alone (no sibling to fuse with): the reference the fused run must equal.
    const alone = await Promise.all(
      outs.map((_, j) => {
        const one = new GraphBuilder(`q${String(j)}`);
        const xj = one.input('x', ['f32', ['m', K]]);
        const z = params[`z${String(j)}`] === undefined ? undefined : one.param(`z${String(j)}`, ['u8', params[`z${String(j)}`]!.shape]);
        one.output('y', one.quantizedLinear(xj, one.param(`q${String(j)}`, ['u8', params[`q${String(j)}`]!.shape]), one.param(`s${String(j)}`, ['f32', params[`s${String(j)}`]!.shape]), z, attrs[j]!));
        return executor.prepare(one.build(), params);
      }),
    );
    for (const m of [1, 3, 6]) {
      const xs: HostTensor = { dtype: 'f32', shape: [m, K], data: rand(m * K, 40 + m) };
      const got = await fused.run({ x: xs });
      for (const [j, p] of alone.entries()) {
        const want = (await p.run({ x: xs }))['y']!;
        expect(Array.from(got[`y${String(j)}`]!.data), `m ${String(m)} weight ${String(j)}`).toEqual(Array.from(want.data));
      }
    }
    fused.dispose();
    for (const p of alone) p.dispose();
  });
});

describe('the single slot form (one slot of the tables, a row mask)', () => {
  // q and k of one input with their slots' LoRA (the engine's `loraBankLinear`, form single): the
  // shrinks x·Aᵀ read gather views of the tables, which run first, so they fuse with the base
  // projections of x.
  const K = 40;
  const outs = [24, 13];
  const slots = 3;
  const R = 4;
  const graph = () => {
    const b = new GraphBuilder('single_slot');
    const x = b.input('x', ['f32', ['batch', 1, K]]);
    const one = b.input('one_slot', ['i64', []]);
    const mask = b.input('row_mask', ['f32', ['batch', 1, 1]]);
    outs.forEach((n, j) => {
      const y = b.loraBankLinear('single', x, b.input(`w${String(j)}`, ['f32', [n, K]]), b.input(`A${String(j)}`, ['f32', [slots, R, K]]), b.input(`B${String(j)}`, ['f32', [slots, R, n]]), one, mask);
      b.output(`y${String(j)}`, y);
    });
    return b.build();
  };
  const inputsFor = (m: number): Record<string, HostTensor> => ({
    x: { dtype: 'f32', shape: [m, 1, K], data: rand(m * K, 50 + m) },
    one_slot: { dtype: 'i64', shape: [], data: Float64Array.from([2]) },
    row_mask: { dtype: 'f32', shape: [m, 1, 1], data: Float32Array.from({ length: m }, (_, r) => (r % 3 === 1 ? 0 : 1)) },
    ...Object.fromEntries(
      outs.flatMap((n, j) => [
        [`w${String(j)}`, { dtype: 'f32', shape: [n, K], data: rand(n * K, 60 + j) }],
        [`A${String(j)}`, { dtype: 'f32', shape: [slots, R, K], data: rand(slots * R * K, 70 + j) }],
        [`B${String(j)}`, { dtype: 'f32', shape: [slots, R, n], data: rand(slots * R * n, 80 + j) }],
      ]),
    ),
  });

  test('the shrinks and the base projections of x are one instruction', () => {
    // cpu-native runs the single form as its decomposition. Per projection (2): the view of A, the
    // view of B, the mask's product, the expand, the add, the output copy; and one LINEAR_MULTI for
    // both base projections and both shrinks (unfused: 4 linears).
    expect(encodeProgram(expandComposites(graph()), new Map()).stats.instructions).toBe(1 + 2 * 6);
  });

  test.each([1, 3, 6])('%i rows equal the interpreter', async (m) => {
    const g = graph();
    const prepared = await executor.prepare(g);
    const inputs = inputsFor(m);
    const got = await prepared.run(inputs);
    const want = interpret(g, { inputs });
    for (const name of ['y0', 'y1']) closeTo(got[name]!, want[name]!, 2e-5);
    prepared.dispose();
  });
});
