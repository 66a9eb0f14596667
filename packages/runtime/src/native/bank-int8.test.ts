// The int8 adapter-bank kernel (LORA_Q: codes and per-row scales read in place, rows grouped by
// slot) and the decomposed grouped/single forms on i8 tables, against the interpreter.
import { GraphBuilder, type HostTensor, seededRandom } from '@stageml/ir';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { describe, expect, test } from 'vitest';

import { createCpuNativeExecutor, encodeProgram } from './index.js';

const executor = createCpuNativeExecutor({ threads: 2 });
const F32 = { rtol: 2e-5, atol: 2e-5 };

/** Int8 tables of `ranks.length` slots with slot rank R: slot s holds rank `ranks[s]`, its padding rows zero codes and zero scales. */
function tables(ranks: readonly number[], R: number, K: number, N: number, seed: number): Record<'A' | 'aScale' | 'B' | 'bScale', HostTensor> {
  const r = seededRandom(seed);
  const S = ranks.length;
  const codes = (w: number) => Int8Array.from({ length: S * R * w }, () => Math.round(r() * 254 - 127));
  const A = codes(K);
  const B = codes(N);
  const aScale = Float32Array.from({ length: S * R }, () => r() * 0.02);
  const bScale = Float32Array.from({ length: S * R }, () => r() * 0.02);
  for (const [s, rank] of ranks.entries()) {
    A.fill(0, (s * R + rank) * K, (s + 1) * R * K);
    B.fill(0, (s * R + rank) * N, (s + 1) * R * N);
    aScale.fill(0, s * R + rank, (s + 1) * R);
    bScale.fill(0, s * R + rank, (s + 1) * R);
  }
  return {
    A: { dtype: 'i8', shape: [S, R, K], data: A },
    aScale: { dtype: 'f32', shape: [S, R], data: aScale },
    B: { dtype: 'i8', shape: [S, R, N], data: B },
    bScale: { dtype: 'f32', shape: [S, R], data: bScale },
  };
}

function bankGraph(form: 'gathered' | 'grouped' | 'single', slots: number, R: number, K: number, N: number, zeroTail = false) {
  const b = new GraphBuilder('bank8');
  const x = b.input('x', ['f32', ['batch', 'seq', K]]);
  const base = b.input('base', ['f32', ['batch', 'seq', N]]);
  const t = [b.input('A', ['i8', [slots, R, K]]), b.input('aScale', ['f32', [slots, R]]), b.input('B', ['i8', [slots, R, N]]), b.input('bScale', ['f32', [slots, R]])] as const;
  const y =
    form === 'gathered'
      ? b.quantizedLoraBank('gathered', x, base, ...t, b.input('row_slot', ['i64', ['batch']]), undefined, { zeroTail })
      : form === 'grouped'
        ? b.quantizedLoraBank('grouped', x, base, ...t, b.input('group_slot', ['i64', ['groups']]), b.input('row_group', ['f32', ['batch', 'groups']]))
        : b.quantizedLoraBank('single', x, base, ...t, b.input('one_slot', ['i64', []]), b.input('row_mask', ['f32', ['batch', 1, 1]]));
  b.output('y', y);
  return b.build();
}

function rand(n: number, seed: number): Float32Array {
  const r = seededRandom(seed);
  return Float32Array.from({ length: n }, () => r() * 2 - 1);
}

describe('cpu-native int8 adapter bank', () => {
  const ranks = [8, 16, 3, 0, 16, 11];
  const R = 16;
  const K = 70;
  const N = 45;
  const cases: [name: string, rowSlots: number[], seq: number][] = [
    ['every row its own slot', [0, 1, 2, 4, 5], 1],
    ['all rows on one slot (split across threads)', Array.from({ length: 37 }, () => 1), 1],
    ['rows of one slot not adjacent, several tokens each', [5, 0, 5, 2, 0, 5, 1, 5, 5], 3],
    ['a slot with rank 0 (all padding) mixed in', [3, 1, 3, 0], 2],
  ];
  test.each(cases.flatMap(([name, rows, seq]) => [[name, rows, seq, false] as const, [`${name}, zeroTail`, rows, seq, true] as const]))('gathered: %s', async (_, rowSlots, seq, zeroTail) => {
    const n = rowSlots.length;
    const inputs = {
      x: { dtype: 'f32', shape: [n, seq, K], data: rand(n * seq * K, 7 + n) },
      base: { dtype: 'f32', shape: [n, seq, N], data: rand(n * seq * N, 9 + n) },
      ...tables(ranks, R, K, N, 3),
      row_slot: { dtype: 'i64', shape: [n], data: Float64Array.from(rowSlots) },
    } satisfies Record<string, HostTensor>;
    await expectMatchesInterpreter(executor, { name: 'bank8', graph: bankGraph('gathered', ranks.length, R, K, N, zeroTail), inputs, weights: {}, compare: 'values', tol: F32 });
  });

  test('the gathered form is one LORA_Q instruction, the add joined to it (no dequantized copy of the tables)', () => {
    const p = encodeProgram(bankGraph('gathered', ranks.length, R, K, N, true), new Map());
    // LORA_Q (each output row starts as its base row) and the copy of the result into its output buffer.
    expect(p.stats.instructions).toBe(2);
  });

  test('grouped and single forms run through the decomposition (gathered rows dequantized)', async () => {
    const n = 4;
    const common = {
      x: { dtype: 'f32', shape: [n, 2, K], data: rand(n * 2 * K, 11) },
      base: { dtype: 'f32', shape: [n, 2, N], data: rand(n * 2 * N, 12) },
      ...tables(ranks, R, K, N, 5),
    } satisfies Record<string, HostTensor>;
    const grouped = { ...common, group_slot: { dtype: 'i64', shape: [2], data: Float64Array.from([1, 5]) }, row_group: { dtype: 'f32', shape: [n, 2], data: Float32Array.from([1, 0, 0, 1, 0, 0, 1, 0]) } } satisfies Record<string, HostTensor>;
    await expectMatchesInterpreter(executor, { name: 'bank8g', graph: bankGraph('grouped', ranks.length, R, K, N), inputs: grouped, weights: {}, compare: 'values', tol: F32 });
    const single = { ...common, one_slot: { dtype: 'i64', shape: [], data: Float64Array.from([4]) }, row_mask: { dtype: 'f32', shape: [n, 1, 1], data: Float32Array.from([1, 0, 1, 1]) } } satisfies Record<string, HostTensor>;
    await expectMatchesInterpreter(executor, { name: 'bank8s', graph: bankGraph('single', ranks.length, R, K, N), inputs: single, weights: {}, compare: 'values', tol: F32 });
  });
});
