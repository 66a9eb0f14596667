// Per-row inputs (`RunOptions.rows`): cached attention reading each row's own cache buffer in
// place equals the same attention over the rows joined into one zero-padded batch, bit for bit
// (masked positions weigh exactly zero either way); which inputs a program accepts per row; and
// the coded errors for rows that do not fit their shape.
import { GraphBuilder, type HostTensor, seededRandom } from '@stageml/ir';
import { describe, expect, test } from 'vitest';

import { RuntimeCode } from '../errors.js';
import { type RowsInput, checkRowsInput, joinRows } from '../row-inputs.js';
import { createCpuNativeExecutor } from './index.js';

const executor = createCpuNativeExecutor({ threads: 2 });
const MASKED = -3.4028234663852886e38;

function rand(n: number, seed: number): Float32Array {
  const r = seededRandom(seed);
  return Float32Array.from({ length: n }, () => r() * 2 - 1);
}

/** q [batch, 6, seq, 16] over caches [batch, past, 3, 16] and the step's keys [batch, 3, seq, 16], a key mask [batch, past + seq]. */
function cachedGraph(causal: boolean) {
  const b = new GraphBuilder('rows');
  const q = b.input('q', ['f32', ['batch', 6, 'seq', 16]]);
  const pk = b.input('past_key', ['f32', ['batch', 'past', 3, 16]]);
  const pv = b.input('past_value', ['f32', ['batch', 'past', 3, 16]]);
  const nk = b.input('k', ['f32', ['batch', 3, 'seq', 16]]);
  const nv = b.input('v', ['f32', ['batch', 3, 'seq', 16]]);
  const mask = b.reshape(b.input('mask', ['f32', ['batch', 'past + seq']]), ['batch', 1, 1, -1]);
  b.output('y', b.cachedAttention(q, pk, pv, nk, nv, { causal }, mask));
  return b.build();
}

/** Rows of `lengths` positions (width 48), their key mask over [past | seq] with each row's missing positions masked. */
function rowsCase(lengths: readonly number[], seq: number, seed: number) {
  const batch = lengths.length;
  const past = Math.max(...lengths);
  const width = 48;
  const keys = lengths.map((n, r) => rand(n * width, seed + r));
  const values = lengths.map((n, r) => rand(n * width, seed + 100 + r));
  const mask = new Float32Array(batch * (past + seq));
  lengths.forEach((n, r) => {
    mask.fill(MASKED, r * (past + seq) + n, r * (past + seq) + past);
    // Some cached positions masked too (a prompt's padding).
    if (n > 2) mask[r * (past + seq) + 1] = MASKED;
  });
  const inputs: Record<string, HostTensor> = {
    q: { dtype: 'f32', shape: [batch, 6, seq, 16], data: rand(batch * 6 * seq * 16, seed + 200) },
    k: { dtype: 'f32', shape: [batch, 3, seq, 16], data: rand(batch * 3 * seq * 16, seed + 201) },
    v: { dtype: 'f32', shape: [batch, 3, seq, 16], data: rand(batch * 3 * seq * 16, seed + 202) },
    mask: { dtype: 'f32', shape: [batch, past + seq], data: mask },
  };
  const rows: Record<string, RowsInput> = {
    past_key: { dtype: 'f32', shape: [batch, past, 3, 16], rows: keys },
    past_value: { dtype: 'f32', shape: [batch, past, 3, 16], rows: values },
  };
  return { inputs, rows };
}

describe('cpu-native per-row cache inputs', () => {
  test.each([
    ['decode, rows of 0 to 37 positions', [37, 5, 0, 19], 1, true],
    ['one position of prefill chunk per row', [9, 30, 1], 3, true],
    // 20 queries: the block path (16 queries at a time, keys transposed once per row and head).
    ['prefill chunks over long and short rows', [70, 4, 33], 20, true],
    ['non-causal', [12, 40], 5, false],
  ] as const)('%s: equals the joined batch bit for bit', async (_name, lengths, seq, causal) => {
    const g = cachedGraph(causal);
    const p = await executor.prepare(g);
    expect(p.rowInputs).toEqual(new Set(['past_key', 'past_value']));
    const { inputs, rows } = rowsCase(lengths, seq, 7 * seq + lengths.length);
    const inPlace = await p.run(inputs, { rows });
    const joined = await p.run({ ...inputs, past_key: joinRows(rows['past_key']!), past_value: joinRows(rows['past_value']!) });
    expect(inPlace['y']!.shape).toEqual(joined['y']!.shape);
    expect(Array.from(inPlace['y']!.data)).toEqual(Array.from(joined['y']!.data));
    p.dispose();
  });

  test('rows are read where they lie: changing a row buffer between runs changes the result', async () => {
    const p = await executor.prepare(cachedGraph(true));
    const { inputs, rows } = rowsCase([8, 8], 1, 3);
    const before = Array.from((await p.run(inputs, { rows }))['y']!.data);
    rows['past_value']!.rows[1]!.fill(5);
    const after = Array.from((await p.run(inputs, { rows }))['y']!.data);
    // Row 0's output (6 heads × 16) is unchanged, row 1's moved.
    expect(after.slice(0, 96)).toEqual(before.slice(0, 96));
    expect(after.slice(96)).not.toEqual(before.slice(96));
    p.dispose();
  });

  test('an input read elsewhere than as a cache is not offered per row, and giving it so is RT_BAD_VALUE', async () => {
    const b = new GraphBuilder('also');
    const q = b.input('q', ['f32', [1, 2, 1, 4]]);
    const pk = b.input('past_key', ['f32', [1, 'past', 2, 4]]);
    const pv = b.input('past_value', ['f32', [1, 'past', 2, 4]]);
    const nk = b.input('k', ['f32', [1, 2, 1, 4]]);
    const nv = b.input('v', ['f32', [1, 2, 1, 4]]);
    b.output('y', b.cachedAttention(q, pk, pv, nk, nv, {}));
    b.output('keys', b.mul(pk, b.scalar(2)));
    const p = await executor.prepare(b.build());
    expect(p.rowInputs).toEqual(new Set(['past_value']));
    const inputs: Record<string, HostTensor> = {
      q: { dtype: 'f32', shape: [1, 2, 1, 4], data: rand(8, 1) },
      past_value: { dtype: 'f32', shape: [1, 3, 2, 4], data: rand(24, 2) },
      k: { dtype: 'f32', shape: [1, 2, 1, 4], data: rand(8, 3) },
      v: { dtype: 'f32', shape: [1, 2, 1, 4], data: rand(8, 4) },
    };
    await expect(p.run(inputs, { rows: { past_key: { dtype: 'f32', shape: [1, 3, 2, 4], rows: [rand(24, 5)] } } })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
    p.dispose();
  });

  test('rows that do not fit their shape, or an input given both ways, are RT_BAD_VALUE', async () => {
    const p = await executor.prepare(cachedGraph(true));
    const { inputs, rows } = rowsCase([4, 2], 1, 9);
    const key = rows['past_key']!;
    const bad: RowsInput[] = [
      { ...key, rows: [key.rows[0]!] },
      { ...key, rows: [key.rows[0]!, new Float32Array(47)] },
      { ...key, rows: [key.rows[0]!, new Float32Array(5 * 48)] },
    ];
    for (const r of bad) await expect(p.run(inputs, { rows: { ...rows, past_key: r } })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
    await expect(p.run({ ...inputs, past_key: joinRows(key) }, { rows })).rejects.toMatchObject({ code: RuntimeCode.BAD_VALUE });
    p.dispose();
  });
});

describe('joinRows', () => {
  test('lays each row at the start of its past, zeros after it', () => {
    const t = joinRows({ dtype: 'f32', shape: [2, 3, 2], rows: [Float32Array.from([1, 2]), Float32Array.from([3, 4, 5, 6, 7, 8])] });
    expect(t.shape).toEqual([2, 3, 2]);
    expect(Array.from(t.data)).toEqual([1, 2, 0, 0, 0, 0, 3, 4, 5, 6, 7, 8]);
  });

  test('checkRowsInput refuses a wrong row count, partial or excess positions, and non-f32 rows', () => {
    const ok: RowsInput = { dtype: 'f32', shape: [2, 3, 2], rows: [new Float32Array(2), new Float32Array(6)] };
    expect(() => { checkRowsInput('x', ok); }).not.toThrow();
    for (const rows of [[new Float32Array(2)], [new Float32Array(2), new Float32Array(3)], [new Float32Array(2), new Float32Array(8)], [new Float32Array(2), new Float64Array(2) as unknown as Float32Array]]) {
      expect(() => { checkRowsInput('x', { ...ok, rows }); }).toThrow(expect.objectContaining({ code: RuntimeCode.BAD_VALUE }));
    }
  });
});
