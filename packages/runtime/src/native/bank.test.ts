// The adapter-bank kernel (rows grouped by slot, one pass over each adapter's factors per group)
// against the interpreter at batch mixes where the grouping's edge cases live, the memory
// bandwidth probe, and the addon interface-version check.
import { GraphBuilder, type HostTensor, seededRandom } from '@stageml/ir';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { describe, expect, test } from 'vitest';

import { CPU_ADDON_ABI, loadCpuAddon } from './addon.js';
import { createCpuNativeExecutor, measureFmaPeak, measureMemoryBandwidth } from './index.js';

const executor = createCpuNativeExecutor({ threads: 2 });
const F32 = { rtol: 2e-5, atol: 2e-5 };

function rand(n: number, seed: number): Float32Array {
  const r = seededRandom(seed);
  return Float32Array.from({ length: n }, () => r() * 2 - 1);
}

/** Slot tables of `ranks.length` slots with slot rank R: slot s holds a rank-`ranks[s]` adapter, its padding rows zero. */
function tables(ranks: readonly number[], R: number, K: number, N: number, seed: number): { A: HostTensor; B: HostTensor } {
  const A = rand(ranks.length * R * K, seed);
  const B = rand(ranks.length * R * N, seed + 1);
  for (const [s, r] of ranks.entries()) {
    A.fill(0, (s * R + r) * K, (s + 1) * R * K);
    B.fill(0, (s * R + r) * N, (s + 1) * R * N);
  }
  return { A: { dtype: 'f32', shape: [ranks.length, R, K], data: A }, B: { dtype: 'f32', shape: [ranks.length, R, N], data: B } };
}

function bankGraph(slots: number, R: number, K: number, N: number, zeroTail = false) {
  const b = new GraphBuilder('bank');
  const x = b.input('x', ['f32', ['batch', 'seq', K]]);
  const base = b.input('base', ['f32', ['batch', 'seq', N]]);
  const y = b.loraBank('gathered', x, base, b.input('A', ['f32', [slots, R, K]]), b.input('B', ['f32', [slots, R, N]]), b.input('row_slot', ['i64', ['batch']]), undefined, { zeroTail });
  b.output('y', y);
  return b.build();
}

describe('cpu-native adapter bank (rows grouped by slot)', () => {
  const ranks = [8, 16, 3, 0, 16, 11];
  const R = 16;
  const cases: [name: string, rowSlots: number[], seq: number][] = [
    ['every row its own slot', [0, 1, 2, 4, 5], 1],
    ['all rows on one slot (split across threads)', Array.from({ length: 37 }, () => 1), 1],
    ['rows of one slot not adjacent, several tokens each', [5, 0, 5, 2, 0, 5, 1, 5, 5], 3],
    ['a slot with rank 0 (all padding) mixed in', [3, 1, 3, 0], 2],
    ['one row', [4], 1],
  ];
  test.each(cases.flatMap(([name, rows, seq]) => [[name, rows, seq, false] as const, [`${name}, zeroTail`, rows, seq, true] as const]))('%s', async (_, rowSlots, seq, zeroTail) => {
    const K = 70;
    const N = 45;
    const g = bankGraph(ranks.length, R, K, N, zeroTail);
    const n = rowSlots.length;
    const inputs = {
      x: { dtype: 'f32', shape: [n, seq, K], data: rand(n * seq * K, 7 + n) },
      base: { dtype: 'f32', shape: [n, seq, N], data: rand(n * seq * N, 9 + n) },
      ...tables(ranks, R, K, N, 3),
      row_slot: { dtype: 'i64', shape: [n], data: Float64Array.from(rowSlots) },
    } satisfies Record<string, HostTensor>;
    await expectMatchesInterpreter(executor, { name: 'bank', graph: g, inputs, weights: {}, compare: 'values', tol: F32 });
  });

  test('zeroTail stops reading a slot at its first all-zero A row (rows after it are taken as zero, as the promise says)', async () => {
    const K = 40;
    const N = 24;
    // Slot 1 breaks the promise: row 2 of A is zero, row 3 is not.
    const t = tables([4, 4], 4, K, N, 11);
    t.A.data.fill(0, (4 + 2) * K, (4 + 3) * K);
    const inputs = {
      x: { dtype: 'f32', shape: [2, 1, K], data: rand(2 * K, 5) },
      base: { dtype: 'f32', shape: [2, 1, N], data: new Float32Array(2 * N) },
      ...t,
      row_slot: { dtype: 'i64', shape: [2], data: Float64Array.from([0, 1]) },
    } satisfies Record<string, HostTensor>;
    const run = async (zeroTail: boolean): Promise<Float32Array> => {
      const p = await executor.prepare(bankGraph(2, 4, K, N, zeroTail));
      const y = (await p.run(inputs))['y']!.data as Float32Array;
      p.dispose();
      return y;
    };
    const full = await run(false);
    const cut = await run(true);
    // Row 0 (slot 0 keeps the promise) is the same; row 1 lost rows 2 and 3 of its slot.
    expect(Array.from(cut.subarray(0, N))).toEqual(Array.from(full.subarray(0, N)));
    const x1 = inputs.x.data.subarray(K);
    const A1 = t.A.data.subarray(4 * K);
    const B1 = t.B.data.subarray(4 * N);
    for (let o = 0; o < N; o++) {
      let want = 0;
      for (let r = 0; r < 2; r++) {
        let s = 0;
        for (let k = 0; k < K; k++) s += x1[k]! * A1[r * K + k]!;
        want += s * B1[r * N + o]!;
      }
      expect(cut[N + o]).toBeCloseTo(want, 4);
    }
    expect(Math.max(...Array.from(cut.subarray(N)).map((v, o) => Math.abs(v - full[N + o]!)))).toBeGreaterThan(1e-3);
  });
});

describe('measureMemoryBandwidth', () => {
  test('measures read and copy bandwidth on the pool it is given', () => {
    const bw = measureMemoryBandwidth({ bytes: 8e6, reps: 2, threads: 2 });
    expect(bw.threads).toBe(2);
    expect(bw.readGBs).toBeGreaterThan(0.1);
    expect(bw.copyGBs).toBeGreaterThan(0.1);
    // Without `threads` it keeps the pool as it is.
    expect(measureMemoryBandwidth({ bytes: 2e6, reps: 1 }).threads).toBe(2);
  });
  test('rejects sizes, repetitions and thread counts out of range with RT_BAD_VALUE', () => {
    expect(() => measureMemoryBandwidth({ bytes: 1000 })).toThrow(expect.objectContaining({ code: 'RT_BAD_VALUE' }));
    expect(() => measureMemoryBandwidth({ bytes: 2e6, reps: 0 })).toThrow(expect.objectContaining({ code: 'RT_BAD_VALUE' }));
    expect(() => measureMemoryBandwidth({ bytes: 2e6, threads: 0 })).toThrow(expect.objectContaining({ code: 'RT_BAD_VALUE' }));
  });
});

describe('measureFmaPeak', () => {
  test('measures the multiply-add rate of the pool it is given', () => {
    const peak = measureFmaPeak({ reps: 1, threads: 2 });
    expect(peak.threads).toBe(2);
    // Any x86-64 core of this decade runs well over 1 GFLOP/s of FMAs (and the probe counts 2 a multiply-add).
    expect(peak.gflops).toBeGreaterThan(1);
    expect(measureFmaPeak({ reps: 1 }).threads).toBe(2);
  });
  test('rejects repetitions and thread counts out of range with RT_BAD_VALUE', () => {
    expect(() => measureFmaPeak({ reps: 0 })).toThrow(expect.objectContaining({ code: 'RT_BAD_VALUE' }));
    expect(() => measureFmaPeak({ reps: 1.5 })).toThrow(expect.objectContaining({ code: 'RT_BAD_VALUE' }));
    expect(() => measureFmaPeak({ threads: 300 })).toThrow(expect.objectContaining({ code: 'RT_BAD_VALUE' }));
  });
});

describe('addon interface version', () => {
  test('the loaded addon reports the version this package expects', () => {
    expect(loadCpuAddon().abi?.()).toBe(CPU_ADDON_ABI);
  });
});
