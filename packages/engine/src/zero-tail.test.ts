import { describe, expect, test } from 'vitest';
import { roundFloat32InPlace } from '@stageml/ir';
import type { DeviceWrite, TorchDeviceTensors } from '@stageml/runtime';

import { zeroRowsLast } from './zero-tail.js';

describe('zeroRowsLast', () => {
  test('moves all-zero A rows after the others, keeping their order, and zeroes those rows of B', () => {
    // rank 4, in 2, out 3, at offsets 2 (A) and 1 (B) of larger tables.
    const A = Float32Array.from([9, 9, /* r0 */ 0, 0, /* r1 */ 1, 2, /* r2 */ 0, 0, /* r3 */ 3, 0, 9]);
    const B = Float32Array.from([7, /* r0 */ 1, 1, 1, /* r1 */ 2, 2, 2, /* r2 */ 5, 5, 5, /* r3 */ 3, 3, 3, 7]);
    expect(zeroRowsLast(A, 2, B, 1, 4, 2, 3)).toBe(2);
    expect(Array.from(A)).toEqual([9, 9, 1, 2, 3, 0, 0, 0, 0, 0, 9]);
    expect(Array.from(B)).toEqual([7, 2, 2, 2, 3, 3, 3, 0, 0, 0, 0, 0, 0, 7]);
  });
  test('leaves a slot without zero rows as it is', () => {
    const A = Float32Array.from([1, 2, 3, 4]);
    const B = Float32Array.from([5, 6]);
    expect(zeroRowsLast(A, 0, B, 0, 2, 2, 1)).toBe(2);
    expect(Array.from(A)).toEqual([1, 2, 3, 4]);
    expect(Array.from(B)).toEqual([5, 6]);
  });
});

describe('SlotTables keeps the zeroTail promise', () => {
  test("an adapter's all-zero A rows are written after its other rows, their B rows zero", async () => {
    const { SlotTables } = await import('./slots.js');
    const module = 'model.layers.0.self_attn.q_proj';
    const tables = new SlotTables(2, 4, [{ module, inDim: 2, outDim: 3 }]);
    // rank 3: A [3, 2] with row 1 zero; B [out 3, r 3]; scale 2.
    const A = { dtype: 'f32', shape: [3, 2], data: Float32Array.from([1, 2, 0, 0, 3, 4]) } as const;
    const B = { dtype: 'f32', shape: [3, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6, 7, 8, 9]) } as const;
    const adapter = { name: 'z', dir: '', config: {}, modules: new Map([[module, { module, rank: 3, alpha: 6, scale: 2, A, B }]]), parameterFactors: [], overrides: new Map(), tokenRows: [], bytes: 0 };
    const slot = tables.write(adapter as unknown as Parameters<typeof tables.write>[0]);
    const a = tables.inputs[`slots.${module}.A`]!.data as Float32Array;
    const b = tables.inputs[`slots.${module}.B`]!.data as Float32Array;
    expect(Array.from(a.subarray(slot * 8, slot * 8 + 8))).toEqual([1, 2, 3, 4, 0, 0, 0, 0]);
    // B rows of the kept rank rows 0 and 2 (scale folded in), then zeros.
    expect(Array.from(b.subarray(slot * 12, slot * 12 + 12))).toEqual([2, 8, 14, 6, 12, 18, 0, 0, 0, 0, 0, 0]);
  });
});

describe('SlotTables on a device', () => {
  /** A device store that records each write (the tables' handles are placeholders). */
  function recordingStore(): { store: TorchDeviceTensors; writes: DeviceWrite[] } {
    const writes: DeviceWrite[] = [];
    const store = {
      load: () => Promise.reject(new Error('not used')),
      zeros: (entries: readonly { dtype: string; shape: readonly number[] }[]) => Promise.resolve(entries.map((e) => ({ dtype: e.dtype, shape: [...e.shape], data: { length: e.shape.reduce((a, b) => a * b, 1) } }))),
      write: (ws: readonly DeviceWrite[]) => {
        writes.push(...ws);
        return Promise.resolve();
      },
      onRestore: () => undefined,
      holds: () => true,
      bytes: () => 0,
    };
    return { store: store as unknown as TorchDeviceTensors, writes };
  }
  const module = 'model.layers.0.self_attn.q_proj';
  const adapterOf = (a: number[], b: number[]): unknown => ({
    name: 'z', dir: '', config: {}, parameterFactors: [], overrides: new Map(), tokenRows: [], bytes: 0,
    modules: new Map([[module, { module, rank: 3, alpha: 6, scale: 2, A: { dtype: 'f32', shape: [3, 2], data: Float32Array.from(a) }, B: { dtype: 'f32', shape: [3, 3], data: Float32Array.from(b) } }]]),
  });

  test('sends A unrounded and B as stored, for the worker to round, scale and transpose (no host pass)', async () => {
    const { SlotTables } = await import('./slots.js');
    const { store, writes } = recordingStore();
    const tables = await SlotTables.onDevice(store, 2, 4, [{ module, inDim: 2, outDim: 3 }], 'bf16');
    const adapter = adapterOf([1.001, 2, 0, 0.5, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    const slot = tables.write(adapter as Parameters<typeof tables.write>[0], [], () => Promise.reject(new Error('not used')));
    const [a, b] = writes;
    expect(a).toMatchObject({ start: slot * 8, exact: false });
    expect(Array.from(a!.data)).toEqual(Array.from(Float32Array.from([1.001, 2, 0, 0.5, 3, 4])));
    expect(b).toMatchObject({ start: slot * 12, scale: 2, transpose: [3, 3] });
    expect(Array.from(b!.data)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9]);
  });

  test('an A row that rounds to zero in the tables dtype takes the host path: rounded, moved last, its B row zeroed', async () => {
    const { SlotTables } = await import('./slots.js');
    const { store, writes } = recordingStore();
    const tables = await SlotTables.onDevice(store, 2, 4, [{ module, inDim: 2, outDim: 3 }], 'bf16');
    // Row 1 is 1e-41 and -1e-42: not zero in f32, zero in bf16.
    const adapter = adapterOf([1.001, 2, 1e-41, -1e-42, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    tables.write(adapter as Parameters<typeof tables.write>[0], [], () => Promise.reject(new Error('not used')));
    const [a, b] = writes;
    expect(a!.exact === undefined && b!.scale === undefined && b!.transpose === undefined).toBe(true);
    const A = Float32Array.from([1.001, 2, 3, 4, 0, 0]);
    roundFloat32InPlace(A, 'bf16');
    expect(Array.from(a!.data)).toEqual(Array.from(A));
    expect(Array.from(b!.data)).toEqual([2, 8, 14, 6, 12, 18, 0, 0, 0]);
  });
});
