// The native runner's own paths against the interpreter: the tiled kernels at the shapes where
// their edge cases live (K chunks, row and column tails, every activation-tile height), the
// quantized tiles within the activation-rounding bound, the folds (gathered matmul, gather views,
// attention over the cache inputs), symbolic shapes, concurrent runs and the errors.
import { GraphBuilder, type HostTensor, dequantizeWeight, expandComposites, interpret, quantizeWeight, seededRandom } from '@stageml/ir';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { describe, expect, test } from 'vitest';

import { conformanceCase as c, t } from '../tfjs/conformance/case.js';
import { createCpuNativeExecutor, encodeProgram } from './index.js';

const executor = createCpuNativeExecutor({ threads: 2 });
const F32 = { rtol: 2e-5, atol: 2e-5 };

function rand(n: number, seed: number, scale = 1): Float32Array {
  const r = seededRandom(seed);
  return Float32Array.from({ length: n }, () => (r() * 2 - 1) * scale);
}

describe('cpu-native kernels', () => {
  test('reports what it runs on', () => {
    expect(executor.name).toBe('cpu-native');
    expect(['avx512-vnni', 'avx512', 'avx2', 'generic']).toContain(executor.isa);
    expect(executor.build).toMatch(/^(prebuilt (avx512-vnni|avx512|avx2)|source|file)$/);
    expect(executor.threads).toBe(2);
  });

  test.each([
    [1, 7, 1],
    // 1–4 rows: the row streams, 64 inputs a step with a tail of 16-wide steps and a masked one
    [1, 3000, 9],
    [3, 2100, 7],
    [4, 64, 5],
    [2, 600, 5],
    [6, 33, 4],
    [7, 1100, 18],
    [13, 520, 9],
    // columns across blocks of 64 weight rows (and a tail), rows across 6-row tiles, K in three chunks
    [8, 1030, 131],
    [64, 96, 70],
    // the few-row GEMM (17–64 rows: 2 to 4 vectors of 16 rows, tiles of 12 / 8 / 6 weight rows with
    // tails), K in blocks of 64 with a tail, and the tiles on either side of it
    [5, 130, 25],
    [16, 577, 49],
    [17, 1100, 37],
    [30, 300, 29],
    [33, 200, 17],
    [48, 64, 13],
    [65, 70, 30],
  ])('f32 linear: %i rows, %i inputs, %i outputs', async (m, k, n) => {
    await expectMatchesInterpreter(executor, c(`linear ${String(m)}x${String(k)}x${String(n)}`, [t('f32', ['m', k], { dims: [m, k] }), t('f32', [n, k], { param: true }), t('f32', [n])], (b, [x, w, bias]) => b.linear(x!, w!, bias), { tol: F32 }));
  });

  test('f32 matmul: batched with broadcasting, both transposes, symbolic rows', async () => {
    await expectMatchesInterpreter(executor, c('matmul nt', [t('f32', [3, 'm', 70], { dims: [3, 5, 70] }), t('f32', [3, 20, 70])], (b, [x, w]) => b.matmul(x!, w!, { transposeB: true }), { tol: F32 }));
    await expectMatchesInterpreter(executor, c('matmul nn', [t('f32', [2, 1, 4, 17]), t('f32', [3, 17, 90])], (b, [x, w]) => b.matmul(x!, w!), { tol: F32 }));
    await expectMatchesInterpreter(executor, c('matmul tt', [t('f32', [9, 4]), t('f32', [6, 9])], (b, [x, w]) => b.matmul(x!, w!, { transposeA: true, transposeB: true }), { tol: F32 }));
    // 17–64 rows with transposeB: the few-row GEMM in chunks of at least 48 columns (x packed per chunk)
    await expectMatchesInterpreter(executor, c('matmul nt few rows', [t('f32', [2, 'm', 70], { dims: [2, 20, 70] }), t('f32', [2, 130, 70])], (b, [x, w]) => b.matmul(x!, w!, { transposeB: true }), { tol: F32 }));
  });

  test.each([1, 16, 64, 65])('f32 matmul of one row over %i inputs (a decode step\'s LoRA expand), zero coefficients skipped', async (k) => {
    for (const n of [1, 50, 64, 200, 3072]) {
      const b = new GraphBuilder('expand');
      b.output('y', b.matmul(b.input('t', ['f32', [1, 1, k]]), b.input('B', ['f32', [k, n]])));
      const g = b.build();
      const tv = rand(k, k + n);
      for (let j = 0; j < k; j += 3) tv[j] = 0;
      const inputs: Record<string, HostTensor> = { t: { dtype: 'f32', shape: [1, 1, k], data: tv }, B: { dtype: 'f32', shape: [k, n], data: rand(k * n, 7 + n) } };
      const prepared = await executor.prepare(g);
      const got = (await prepared.run(inputs))['y']!;
      const want = interpret(g, { inputs })['y']!;
      expect(got.shape).toEqual([1, 1, n]);
      for (let i = 0; i < n; i++) expect(Math.abs(Number(got.data[i]) - Number(want.data[i])), `k ${String(k)} n ${String(n)} column ${String(i)}`).toBeLessThanOrEqual(F32.atol + F32.rtol * Math.abs(Number(want.data[i])));
      prepared.dispose();
    }
  });

  const quantCases: [bits: 4 | 8, block: number, inF: number, out: number, symmetric: boolean][] = [
    [4, 32, 96, 16, true],
    [4, 32, 100, 37, false],
    [8, 32, 64, 20, true],
    [8, 64, 192, 33, false],
    [4, 128, 256, 17, true],
    [8, 96, 96, 5, true],
  ];
  test.each(quantCases)('quantized tiles: int%i, blocks of %i, %i inputs, %i outputs (symmetric %s), within the activation-rounding bound', async (bits, block, inF, out, symmetric) => {
    const w = rand(out * inF, inF * 7 + out);
    const p = quantizeWeight(w, out, inF, { bits, blockSize: block, symmetric });
    const deq = dequantizeWeight(p.qweight, p.scales, p.zeroPoints, bits, block, inF);
    const b = new GraphBuilder('q');
    const x = b.input('x', ['f32', ['m', inF]]);
    const z = p.zeroPoints === undefined ? undefined : b.param('z', ['u8', p.zeroPoints.shape]);
    b.output('y', b.quantizedLinear(x, b.param('q', ['u8', p.qweight.shape]), b.param('s', ['f32', p.scales.shape]), z, p.attrs));
    const g = b.build();
    const params = { q: p.qweight, s: p.scales, ...(p.zeroPoints === undefined ? {} : { z: p.zeroPoints }) };
    const prepared = await executor.prepare(g, params);
    // Below and above the kernel's 8-row tiles (37: four tiles and a tail).
    for (const m of [1, 3, 8, 13, 16, 37]) {
      const xs: HostTensor = { dtype: 'f32', shape: [m, inF], data: rand(m * inF, m + bits, 2) };
      const got = (await prepared.run({ x: xs }))['y']!;
      const want = interpret(g, { inputs: { x: xs }, weights: params })['y']!;
      expect(got.shape).toEqual([m, out]);
      for (let r = 0; r < m; r++) {
        // Activations rounded per 32 inputs to int8: |Δx_i| ≤ max|x_block| / 254.
        for (let o = 0; o < out; o++) {
          let bound = 0;
          let mag = 0;
          for (let b0 = 0; b0 < inF; b0 += 32) {
            let amax = 0;
            for (let i = b0; i < Math.min(inF, b0 + 32); i++) amax = Math.max(amax, Math.abs(xs.data[r * inF + i]!));
            for (let i = b0; i < Math.min(inF, b0 + 32); i++) {
              bound += (amax / 254) * Math.abs(deq[o * inF + i]!);
              mag += Math.abs(xs.data[r * inF + i]! * deq[o * inF + i]!);
            }
          }
          const err = Math.abs(got.data[r * out + o]! - want.data[r * out + o]!);
          expect(err, `row ${String(r)} out ${String(o)}`).toBeLessThanOrEqual(bound * 1.0001 + 1e-5 * mag + 1e-6);
        }
      }
    }
    prepared.dispose();
  });


  test('rmsNorm gives a row the same bits wherever it sits in the batch (every row the same: all outputs equal)', async () => {
    const n = 200; // 12 steps of 16 inputs and a tail of 8
    const rows = 19;
    const one = rand(n, 11, 3);
    const x = new Float32Array(rows * n);
    for (let r = 0; r < rows; r++) x.set(one, r * n);
    const b = new GraphBuilder('norm');
    b.output('y', b.rmsNorm(b.input('x', ['f32', [rows, n]]), b.param('w', ['f32', [n]]), 1e-6));
    const prepared = await executor.prepare(b.build(), { w: { dtype: 'f32', shape: [n], data: rand(n, 12) } });
    const y = (await prepared.run({ x: { dtype: 'f32', shape: [rows, n], data: x } }))['y']!.data as Float32Array;
    for (let r = 1; r < rows; r++) expect(Array.from(y.subarray(r * n, (r + 1) * n)), `row ${String(r)}`).toEqual(Array.from(y.subarray(0, n)));
    prepared.dispose();
  });

  test.each([7, 16, 29, 130])('rmsNorm over rows of %i (tails of the 16-input steps) equals the interpreter', async (n) => {
    await expectMatchesInterpreter(executor, c(`rmsNorm ${String(n)}`, [t('f32', [5, n]), t('f32', [n])], (b, [x, w]) => b.rmsNorm(x!, w, 1e-6), { tol: F32 }));
  });

  test('quantized blocks that do not tile by 32 run exactly (dequantized weights)', async () => {
    const p = quantizeWeight(rand(6 * 40, 3), 6, 40, { bits: 4, blockSize: 8, symmetric: false });
    await expectMatchesInterpreter(
      executor,
      c('q g8', [t('f32', [3, 40]), t('u8', p.qweight.shape, { param: true, values: Array.from(p.qweight.data) }), t('f32', p.scales.shape, { param: true, values: Array.from(p.scales.data) }), t('u8', p.zeroPoints!.shape, { param: true, values: Array.from(p.zeroPoints!.data) })], (b, [x, q, s, z]) => b.quantizedLinear(x!, q!, s!, z, p.attrs), { tol: F32 }),
    );
  });

  test('a gathered loraBank reads the slot tables in place (one LORA instruction, the add joined to it), and a scalar-index gather is a view', async () => {
    const slots = 5;
    const mk = (b: GraphBuilder) => {
      const x = b.input('x', ['f32', ['batch', 'seq', 24]]);
      const base = b.input('base', ['f32', ['batch', 'seq', 30]]);
      const a = b.input('A', ['f32', [slots, 4, 24]]);
      const bt = b.input('B', ['f32', [slots, 4, 30]]);
      const idx = b.input('row_slot', ['i64', ['batch']]);
      const one = b.input('one_slot', ['i64', []]);
      const y = b.loraBank('gathered', x, base, a, bt, idx);
      const single = b.linear(x, b.gather(a, one));
      b.output('y', y);
      b.output('single', single);
      return b.build();
    };
    const g = mk(new GraphBuilder('slots'));
    const enc = encodeProgram(g, new Map());
    // LORA (its rows start as the base's: no add), the view, one linear, two output copies: no gather instruction.
    expect(enc.stats.instructions).toBe(5);
    expect(enc.stats.views).toBe(1);
    // The same computation in primitive ops is not recognised: two gathers and two matmuls run as they are.
    const prim = expandComposites(g);
    expect(encodeProgram(prim, new Map()).stats.instructions).toBe(9);
    const inputs = {
      x: { dtype: 'f32', shape: [3, 2, 24], data: rand(3 * 2 * 24, 1) },
      base: { dtype: 'f32', shape: [3, 2, 30], data: rand(3 * 2 * 30, 4) },
      A: { dtype: 'f32', shape: [slots, 4, 24], data: rand(slots * 4 * 24, 2) },
      B: { dtype: 'f32', shape: [slots, 4, 30], data: rand(slots * 4 * 30, 3) },
      row_slot: { dtype: 'i64', shape: [3], data: Float64Array.from([4, 0, 4]) },
      one_slot: { dtype: 'i64', shape: [], data: Float64Array.from([2]) },
    } as const satisfies Record<string, HostTensor>;
    await expectMatchesInterpreter(executor, { name: 'slots', graph: g, inputs, weights: {}, compare: 'values', tol: F32 });
    const prepared = await executor.prepare(g);
    await expect(prepared.run({ ...inputs, row_slot: { dtype: 'i64', shape: [3], data: Float64Array.from([4, 5, 0]) } })).rejects.toMatchObject({ code: 'RT_BAD_VALUE', message: expect.stringContaining('out of range') as string });
    await expect(prepared.run({ ...inputs, one_slot: { dtype: 'i64', shape: [], data: Float64Array.from([-1]) } })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
  });

  test.each([
    // rows (the 1–4-row GEMV path, the tiled path), width, rank, outputs (tails of 4 and of 256)
    [1, 40, 3, 9],
    [4, 64, 8, 300],
    [7, 600, 16, 517],
    [64, 96, 2, 260],
    // the rank's columns past one vector (rank 20, 33: a masked tail; 64: four full vectors) joined
    // to the last of several K chunks, on the row path and the tiled path, column blocks with tails
    [3, 1030, 20, 65],
    [13, 1100, 33, 70],
    [64, 512, 64, 130],
  ])('the loraLinear op x·Wᵀ + s·(x·Aᵀ)·Bᵀ runs as one instruction: %i rows, %i inputs, rank %i, %i outputs', async (m, k, r, n) => {
    const b = new GraphBuilder('lora_layer');
    const x = b.input('x', ['f32', ['m', k]]);
    const w = b.param('w', ['f32', [n, k]]);
    const a = b.param('lora_A', ['f32', [r, k]]);
    const bb = b.param('lora_B', ['f32', [n, r]]);
    b.output('y', b.loraLinear(x, w, a, bb, 0.75));
    const g = b.build();
    const weights = { w: { dtype: 'f32', shape: [n, k], data: rand(n * k, 1, 0.2) }, lora_A: { dtype: 'f32', shape: [r, k], data: rand(r * k, 2, 0.2) }, lora_B: { dtype: 'f32', shape: [n, r], data: rand(n * r, 3, 0.5) } } as const satisfies Record<string, HostTensor>;
    // The fused instruction and the output copy.
    expect(encodeProgram(g, new Map(Object.entries(weights))).stats.instructions).toBe(2);
    await expectMatchesInterpreter(executor, { name: `loraLinear ${String(m)}x${String(k)} r${String(r)}`, graph: g, inputs: { x: { dtype: 'f32', shape: [m, k], data: rand(m * k, 4) } }, weights, compare: 'values', tol: F32 });
  });

  test('the primitive LoRA chain is not recognised (no pattern matching): it runs as its ops', async () => {
    const b = new GraphBuilder('lora_chain');
    const x = b.input('x', ['f32', [3, 20]]);
    const shrink = b.linear(x, b.input('A', ['f32', [4, 20]]));
    b.output('y', b.add(b.linear(x, b.input('W', ['f32', [12, 20]])), b.mul(b.linear(shrink, b.input('B', ['f32', [12, 4]])), b.constant(2))));
    const g = b.build();
    const inputs: Record<string, HostTensor> = {
      x: { dtype: 'f32', shape: [3, 20], data: rand(60, 5) },
      A: { dtype: 'f32', shape: [4, 20], data: rand(80, 6) },
      W: { dtype: 'f32', shape: [12, 20], data: rand(240, 7) },
      B: { dtype: 'f32', shape: [12, 4], data: rand(48, 8) },
    };
    // shrink and base (siblings of x: one LINEAR_MULTI), expand, mul, add and the output copy.
    expect(encodeProgram(g, new Map()).stats.instructions).toBe(5);
    await expectMatchesInterpreter(executor, { name: 'lora chain', graph: g, inputs, weights: {}, compare: 'values', tol: F32 });
  });

  test('attention over the cache inputs ([B, past, H, D], as the engine feeds them) reads them in place', async () => {
    const b = new GraphBuilder('kv');
    const q = b.input('q', ['f32', ['batch', 4, 'seq', 8]]);
    const pk = b.input('past_key', ['f32', ['batch', 'past', 2, 8]]);
    const pv = b.input('past_value', ['f32', ['batch', 'past', 2, 8]]);
    const nk = b.input('k', ['f32', ['batch', 2, 'seq', 8]]);
    const nv = b.input('v', ['f32', ['batch', 2, 'seq', 8]]);
    const mask = b.input('mask', ['f32', ['batch', 1, 1, 'past + seq']]);
    b.output('y', b.cachedAttention(q, pk, pv, nk, nv, { causal: true }, mask));
    const g = b.build();
    // One attention over the cache and the new keys, and one output copy.
    expect(encodeProgram(g, new Map()).stats.instructions).toBe(2);
    for (const [batch, past, seq] of [[2, 5, 1], [1, 0, 3], [3, 7, 4]] as const) {
      const maskData = new Float32Array(batch * (past + seq));
      if (past > 0) maskData[0] = -3.4028234663852886e38;
      const inputs: Record<string, HostTensor> = {
        q: { dtype: 'f32', shape: [batch, 4, seq, 8], data: rand(batch * 4 * seq * 8, 11) },
        past_key: { dtype: 'f32', shape: [batch, past, 2, 8], data: rand(batch * past * 16, 12) },
        past_value: { dtype: 'f32', shape: [batch, past, 2, 8], data: rand(batch * past * 16, 13) },
        k: { dtype: 'f32', shape: [batch, 2, seq, 8], data: rand(batch * 2 * seq * 8, 14) },
        v: { dtype: 'f32', shape: [batch, 2, seq, 8], data: rand(batch * 2 * seq * 8, 15) },
        mask: { dtype: 'f32', shape: [batch, 1, 1, past + seq], data: maskData },
      };
      await expectMatchesInterpreter(executor, { name: `kv ${String(batch)}/${String(past)}/${String(seq)}`, graph: g, inputs, weights: {}, compare: 'values', tol: { rtol: 1e-4, atol: 1e-5 } });
    }
  });

  test('keys every head masks out (padding of shorter rows) are not read: values there that would win the softmax change nothing; a fully masked row keeps the full computation', async () => {
    const b = new GraphBuilder('pad');
    const q = b.input('q', ['f32', ['batch', 6, 1, 8]]);
    const pk = b.input('past_key', ['f32', ['batch', 'past', 3, 8]]);
    const pv = b.input('past_value', ['f32', ['batch', 'past', 3, 8]]);
    const nk = b.input('k', ['f32', ['batch', 3, 1, 8]]);
    const nv = b.input('v', ['f32', ['batch', 3, 1, 8]]);
    const mask = b.input('mask', ['f32', ['batch', 1, 1, 'past + 1']]);
    b.output('y', b.cachedAttention(q, pk, pv, nk, nv, {}, mask));
    const g = b.build();
    const batch = 3;
    const past = 20;
    const lengths = [20, 7, 0];
    const MASKED = -3.4028234663852886e38;
    const maskData = new Float32Array(batch * (past + 1));
    const key = rand(batch * past * 24, 21);
    const value = rand(batch * past * 24, 22);
    lengths.forEach((len, r) => {
      maskData.fill(MASKED, r * (past + 1) + len, r * (past + 1) + past);
      for (let j = len; j < past; j++) {
        // Read, a padded key would score +∞ (q's first component is positive) and win the softmax.
        key.fill(0, (r * past + j) * 24, (r * past + j + 1) * 24);
        for (let h = 0; h < 3; h++) key[(r * past + j) * 24 + h * 8] = Number.POSITIVE_INFINITY;
        value.fill(Number.NaN, (r * past + j) * 24, (r * past + j + 1) * 24);
      }
    });
    const qData = rand(batch * 48, 23);
    for (let i = 0; i < qData.length; i += 8) qData[i] = Math.abs(qData[i]!) + 0.1;
    const inputs: Record<string, HostTensor> = {
      q: { dtype: 'f32', shape: [batch, 6, 1, 8], data: qData },
      past_key: { dtype: 'f32', shape: [batch, past, 3, 8], data: key },
      past_value: { dtype: 'f32', shape: [batch, past, 3, 8], data: value },
      k: { dtype: 'f32', shape: [batch, 3, 1, 8], data: rand(batch * 24, 24) },
      v: { dtype: 'f32', shape: [batch, 3, 1, 8], data: rand(batch * 24, 25) },
      mask: { dtype: 'f32', shape: [batch, 1, 1, past + 1], data: maskData },
    };
    const got = (await (await executor.prepare(g, {})).run(inputs))['y']!;
    // Each row against the interpreter on that row alone, with only its own positions.
    lengths.forEach((len, r) => {
      const whole = (name: string): HostTensor => {
        const x = inputs[name]!;
        const n = x.data.length / batch;
        return { dtype: 'f32', shape: [1, ...x.shape.slice(1)], data: x.data.slice(r * n, (r + 1) * n) };
      };
      const prefix = (name: string): HostTensor => ({ dtype: 'f32', shape: [1, len, 3, 8], data: inputs[name]!.data.slice(r * past * 24, (r * past + len) * 24) });
      const one = interpret(g, {
        inputs: { q: whole('q'), past_key: prefix('past_key'), past_value: prefix('past_value'), k: whole('k'), v: whole('v'), mask: { dtype: 'f32', shape: [1, 1, 1, len + 1], data: new Float32Array(len + 1) } },
        weights: {},
      })['y']!;
      const mine = Array.from(got.data.slice(r * 48, (r + 1) * 48));
      mine.forEach((x, i) => {
        expect(x).toBeCloseTo(one.data[i]!, 5);
      });
    });
    // Every key masked (the new one too): the full computation, as the interpreter does it.
    const all = new Float32Array(batch * (past + 1)).fill(MASKED);
    const dense = { ...inputs, past_key: { ...inputs['past_key']!, data: rand(batch * past * 24, 26) }, past_value: { ...inputs['past_value']!, data: rand(batch * past * 24, 27) }, mask: { ...inputs['mask']!, data: all } };
    await expectMatchesInterpreter(executor, { name: 'all masked', graph: g, inputs: dense, weights: {}, compare: 'values', tol: { rtol: 1e-4, atol: 1e-5 } });
  });

  test('recycle: outputs are written into a given-back result when it fits and no input lies in it', async () => {
    const cs = c('recycle', [t('f32', ['m', 40], { dims: [3, 40] }), t('f32', [24, 40], { param: true })], (b, [x, w]) => b.linear(x!, w!));
    const prepared = await executor.prepare(cs.graph, cs.weights);
    const x = (m: number, seed: number): Record<string, HostTensor> => ({ x0: { dtype: 'f32', shape: [m, 40], data: rand(m * 40, seed) } });
    const first = await prepared.run(x(3, 1));
    const buffer = (first['out']!.data as Float32Array).buffer;
    const want = Array.from((await prepared.run(x(2, 2)))['out']!.data);
    // Smaller (fits): the same storage, the new values.
    const second = await prepared.run(x(2, 2), { recycle: first });
    expect((second['out']!.data as Float32Array).buffer).toBe(buffer);
    expect(Array.from(second['out']!.data)).toEqual(want);
    // Larger than the given-back storage: a new buffer.
    const third = await prepared.run(x(5, 3), { recycle: second });
    expect((third['out']!.data as Float32Array).buffer).not.toBe(buffer);
    // An input inside the given-back storage: not overwritten while read.
    const inside = new Float32Array((third['out']!.data as Float32Array).buffer, 0, 80);
    inside.set(rand(80, 4));
    const fromInside = Array.from((await prepared.run({ x0: { dtype: 'f32', shape: [2, 40], data: inside.slice() } }))['out']!.data);
    const fourth = await prepared.run({ x0: { dtype: 'f32', shape: [2, 40], data: inside } }, { recycle: third });
    expect((fourth['out']!.data as Float32Array).buffer).not.toBe((third['out']!.data as Float32Array).buffer);
    expect(Array.from(fourth['out']!.data)).toEqual(fromInside);
  });

  test('concurrent runs of one prepared graph give what each gives alone', async () => {
    const cs = c('conc', [t('f32', ['m', 300], { dims: [4, 300] }), t('f32', [64, 300], { param: true })], (b, [x, w]) => b.silu(b.linear(x!, w!)));
    const prepared = await executor.prepare(cs.graph, cs.weights);
    const xs = [1, 2, 3, 4].map((m): Record<string, HostTensor> => ({ x0: { dtype: 'f32', shape: [m, 300], data: rand(m * 300, m) } }));
    const alone: HostTensor[] = [];
    for (const x of xs) alone.push((await prepared.run(x))['out']!);
    const together = await Promise.all(xs.map((x) => prepared.run(x)));
    together.forEach((r, i) => {
      expect(Array.from(r['out']!.data)).toEqual(Array.from(alone[i]!.data));
    });
  });

  test.each([
    [1, 64, 96, 8, true],
    [5, 600, 70, 3, true],
    [40, 130, 200, 16, true],
    [37, 1100, 33, 6, false],
  ])('groupedMatmul: %i rows, %i inputs, %i outputs over %i groups (transposeW %s): row tails, K chunks, column blocks, empty groups', async (n, k, m, g, tw) => {
    const w: [number, number, number] = tw ? [g, m, k] : [g, k, m];
    await expectMatchesInterpreter(executor, c(`groupedMatmul ${String(n)}x${String(k)}x${String(m)}`, [t('f32', ['n', k], { dims: [n, k] }), t('f32', w, { param: true }), t('i64', ['n'], { dims: [n], range: [0, Math.max(0, g - 3)] })], (b, [x, wv, gv]) => b.op('groupedMatmul', [x!, wv!, gv!], { transposeW: tw }), { tol: F32 }));
  });

  test('scatterAdd: many rows onto few, in parallel, accumulated in index order as the reference does', async () => {
    await expectMatchesInterpreter(executor, c('scatterAdd big', [t('f32', [7, 300]), t('i64', [2000], { range: [0, 6] }), t('f32', [2000, 300])], (b, [x, i, u]) => b.scatterAdd(x!, i!, u!), { tol: F32 }));
  });

  test('topk: wide lanes in parallel, both orders, ties by lower index', async () => {
    await expectMatchesInterpreter(executor, c('topk wide', [t('f32', [300, 128], { range: [-2, 2] })], (b, [x]) => [...b.topk(x!, 8), ...b.topk(x!, 3, 0, false)]));
    const ties = Float32Array.from({ length: 64 * 40 }, (_, i) => (i * 7) % 5);
    await expectMatchesInterpreter(executor, c('topk ties', [t('f32', [64, 40], { values: Array.from(ties) })], (b, [x]) => b.topk(x!, 6)));
  });

  test.each([
    [37, 37, 128, false],
    [20, 45, 40, true],
    [8, 8, 64, true],
    // the block path's row groups (16 queries × 2 heads in 6-row tiles), key chunks past 64, a
    // query tail, value widths of 6 and of 1.5 register rows
    [130, 130, 128, true],
    [17, 70, 96, false],
    [24, 100, 16, true],
  ])('prefill attention (query blocks over transposed keys): %i queries over %i keys of dim %i, causal, GQA, mask %s', async (tq, tk, d, masked) => {
    const ops = [t('f32', [2, 4, tq, d]), t('f32', [2, 2, tk, d]), t('f32', [2, 2, tk, d])];
    // An additive mask hiding the first keys of batch row 1 (padding, at −FLT_MAX) and a few others.
    const mask = Array.from({ length: 2 * tk }, (_, j) => (j >= tk && j - tk < 5 ? -3.4028234663852886e38 : j % 7 === 3 ? -1e9 : 0));
    const withMask = masked ? [...ops, t('f32', [2, 1, 1, tk], { values: mask })] : ops;
    await expectMatchesInterpreter(executor, c(`attention ${String(tq)}x${String(tk)}x${String(d)}`, withMask, (b, [q, k, v, m]) => b.attention(q!, k!, v!, { causal: true }, m), { tol: F32 }));
  });

  test('element-wise ops over many values run split over the threads (same shapes, size-1 dims, broadcasts)', async () => {
    await expectMatchesInterpreter(executor, c('silu·up', [t('f32', [1, 130, 610]), t('f32', [1, 130, 610])], (b, [g, u]) => b.mul(b.silu(g!), u!), { tol: F32 }));
    await expectMatchesInterpreter(executor, c('add, sub, div', [t('f32', [70, 1, 1000]), t('f32', [70, 1, 1000]), t('f32', [1000])], (b, [x, y, z]) => [b.add(x!, y!), b.sub(x!, y!), b.div(x!, b.add(b.exp(z!), b.constant(1)))], { tol: F32 }));
  });

  test('transposes, broadcasts and concats of many values run split over the threads', async () => {
    await expectMatchesInterpreter(executor, c('head transpose', [t('f32', [1, 130, 8, 70])], (b, [x]) => b.transpose(x!, [0, 2, 1, 3])));
    await expectMatchesInterpreter(executor, c('broadcast rows', [t('f32', [1, 1, 700])], (b, [x]) => b.broadcastTo(x!, [3, 40, 700])));
    await expectMatchesInterpreter(executor, c('cache concat', [t('f32', [3, 2, 130, 64]), t('f32', [3, 2, 1, 64])], (b, [k, n]) => b.concat([k!, n!], 2)));
  });

  test.each([
    [2, 'the block path'],
    [32, 'the query-at-a-time path (a block of 16 queries × 32 heads over 8200 keys is over 16 MB of scores)'],
  ])('prefill attention over 8200 keys (each block transposes its own): %i query heads a kv head, %s', async (group) => {
    const tk = 8200;
    const ops = [t('f32', [1, group, 9, 16]), t('f32', [1, 1, tk, 16]), t('f32', [1, 1, tk, 16])];
    await expectMatchesInterpreter(executor, c(`attention long ${String(group)}`, ops, (b, [q, k, v]) => b.attention(q!, k!, v!, { causal: true }), { tol: F32 }));
  });

  test('prefill attention with a per-query boolean mask (rows of the block see different keys)', async () => {
    const tq = 40;
    const tk = 52;
    // Query i sees the keys j with (i + j) % 5 !== 0, and none of the first 3; row 7 of batch 1 sees one key only.
    const mask = Array.from({ length: 2 * tq * tk }, (_, x) => {
      const bi = Math.floor(x / (tq * tk));
      const i = Math.floor(x / tk) % tq;
      const j = x % tk;
      if (bi === 1 && i === 7) return j === 5 ? 1 : 0;
      return j >= 3 && (i + j) % 5 !== 0 ? 1 : 0;
    });
    const ops = [t('f32', [2, 6, tq, 64]), t('f32', [2, 3, tk, 64]), t('f32', [2, 3, tk, 64]), t('bool', [2, 1, tq, tk], { values: mask })];
    await expectMatchesInterpreter(executor, c('attention per-query mask', ops, (b, [q, k, v, m]) => b.attention(q!, k!, v!, { causal: true }, m), { tol: F32 }));
  });

  test("a Mixtral MoE block (router softmax, top-2 renormalized, iota rows, grouped expert GEMMs, scatterAdd) equals the interpreter's", async () => {
    const T = 9;
    const E = 6;
    const H = 40;
    const I = 24;
    await expectMatchesInterpreter(
      executor,
      c('moe block', [t('f32', ['t', H], { dims: [T, H] }), t('f32', [E, H], { param: true }), t('f32', [E, 2 * I, H], { param: true, range: [-0.3, 0.3] }), t('f32', [E, H, I], { param: true, range: [-0.3, 0.3] })], (b, [x, router, gateUp, down]) => {
        const [topW, topE] = b.topk(b.softmax(b.linear(x!, router!), -1), 2, -1);
        const weights = b.div(topW, b.sum(topW, [-1], true));
        const groups = b.reshape(topE, [-1]);
        const token = b.reshape(b.iota(['t', 2], 0), [-1]);
        const gu = b.op('groupedMatmul', [b.gather(x!, token, 0), gateUp!, groups], { transposeW: true });
        const act = b.mul(b.silu(b.slice(gu, 1, 0, I)), b.slice(gu, 1, I));
        const out = b.op('groupedMatmul', [act, down!, groups], { transposeW: true });
        return b.scatterAdd(b.broadcastTo(b.scalar(0, 'f32'), ['t', H]), token, b.mul(out, b.reshape(weights, [-1, 1])), 0);
      }, { tol: F32 }),
    );
  });

  test('errors: bad options, unsupported dtypes and ops at prepare, inputs that disagree with the graph, use after dispose', async () => {
    expect(() => createCpuNativeExecutor({ threads: 0 })).toThrow(expect.objectContaining({ code: 'RT_BAD_VALUE' }) as Error);
    const f64 = c('f64', [t('f64', [3])], (b, [x]) => b.exp(x!));
    await expect(executor.prepare(f64.graph, f64.weights)).rejects.toMatchObject({ code: 'RT_UNSUPPORTED_OP', message: expect.stringContaining('f64') as string });
    const compare = c('less', [t('f32', [5]), t('f32', [5])], (b, [x, y]) => b.op('less', [x!, y!]));
    await expect(executor.prepare(compare.graph, compare.weights)).rejects.toMatchObject({ code: 'RT_UNSUPPORTED_OP', message: expect.stringContaining('less') as string });
    const lin = c('lin', [t('f32', ['m', 4], { dims: [2, 4] }), t('f32', [3, 4], { param: true })], (b, [x, w]) => b.linear(x!, w!));
    await expect(executor.prepare(lin.graph, {})).rejects.toMatchObject({ code: 'RT_MISSING_WEIGHT' });
    const prepared = await executor.prepare(lin.graph, lin.weights);
    await expect(prepared.run({ x0: { dtype: 'f32', shape: [2, 5], data: new Float32Array(10) } })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
    await expect(prepared.run({ x0: { dtype: 'f32', shape: [2, 4], data: new Float32Array(3) } })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
    expect((await prepared.run(lin.inputs))['out']!.shape).toEqual([2, 3]);
    prepared.dispose();
    await expect(prepared.run(lin.inputs)).rejects.toMatchObject({ code: 'RT_DISPOSED' });
  });
});
