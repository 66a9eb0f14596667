// Greedy picks in the addon (`argmax`, ABI 8): the same index as `firstMaxIndex` on every kind of
// row (ties, NaNs, infinities, signed zeros, tails of every length), and a run asked for
// `RunOptions.argmax` returning i64 indices while its buffer is still recycled.
import { GraphBuilder, type HostTensor, seededRandom } from '@stageml/ir';
import { describe, expect, test } from 'vitest';

import { argmaxRows, firstMaxIndex } from '../executor.js';
import { loadCpuAddon } from './addon.js';
import { createCpuNativeExecutor } from './index.js';

const addon = loadCpuAddon();

function rows(data: number[][]): { x: Float32Array; n: number } {
  const n = data[0]!.length;
  return { x: Float32Array.from(data.flat()), n };
}

function reference(x: Float32Array, n: number): number[] {
  return Array.from({ length: x.length / n }, (_, r) => firstMaxIndex(x, r * n, n));
}

describe('addon argmax', () => {
  test('takes the first maximum, as firstMaxIndex does', () => {
    const { x, n } = rows([
      [1, 3, 3, 2],
      [5, 5, 5, 5],
      [-1, -7, -0.5, -0.5],
      [Number.NaN, 9, 10, 1],
      [1, Number.NaN, 10, Number.NaN],
      [-Infinity, -Infinity, -Infinity, -Infinity],
      [-0, 0, -0, 0],
      [0, Infinity, Infinity, 3],
    ]);
    expect(Array.from(addon.argmax(x, n))).toEqual([1, 0, 2, 0, 2, 0, 0, 1]);
    expect(Array.from(addon.argmax(x, n))).toEqual(reference(x, n));
  });

  test.each([1, 2, 15, 16, 17, 31, 33, 576, 49152])('random rows of %i entries, the maximum anywhere (tails included)', (n) => {
    const r = seededRandom(n);
    const x = Float32Array.from({ length: 3 * n }, () => Math.round(r() * 1000) / 100);
    // A repeated maximum near each row's end: the first of them must win.
    if (n >= 3) for (let row = 0; row < 3; row++) x[row * n + n - 1] = x[row * n + n - 3] = 20;
    expect(Array.from(addon.argmax(x, n))).toEqual(reference(x, n));
  });

  test('refuses what is not a Float32Array of whole rows', () => {
    expect(() => addon.argmax(new Float64Array(4) as unknown as Float32Array, 2)).toThrow(/Float32Array/);
    expect(() => addon.argmax(new Float32Array(5), 2)).toThrow(/row length/);
    expect(() => addon.argmax(new Float32Array(4), 0)).toThrow(/row length/);
  });
});

describe('RunOptions.argmax on cpu-native', () => {
  const b = new GraphBuilder('picks');
  const x = b.input('x', ['f32', [3, 40]]);
  const w = b.input('w', ['f32', [1000, 40]]);
  b.output('logits', b.linear(x, w));
  b.output('twice', b.add(x, x));
  const graph = b.build();
  const r = seededRandom(5);
  const inputs: Record<string, HostTensor> = {
    x: { dtype: 'f32', shape: [3, 40], data: Float32Array.from({ length: 120 }, () => r() - 0.5) },
    w: { dtype: 'f32', shape: [1000, 40], data: Float32Array.from({ length: 40_000 }, () => r() - 0.5) },
  };

  test('returns each row’s index (i64 of the leading dims) and keeps recycling the run’s buffer', async () => {
    const prepared = await createCpuNativeExecutor({ threads: 2 }).prepare(graph);
    const plain = await prepared.run(inputs);
    expect(plain['logits']!.dtype).toBe('f32');
    const want = argmaxRows(plain['logits']!);
    const first = await prepared.run(inputs, { argmax: ['logits'] });
    expect(first['logits']!.dtype).toBe('i64');
    expect(first['logits']!.shape).toEqual([3]);
    expect(argmaxRows(first['logits']!)).toEqual(want);
    const buffer = (first['twice']!.data as Float32Array).buffer;
    const second = await prepared.run(inputs, { argmax: ['logits'], recycle: first });
    expect((second['twice']!.data as Float32Array).buffer).toBe(buffer);
    expect(argmaxRows(second['logits']!)).toEqual(want);
    prepared.dispose();
  });
});
