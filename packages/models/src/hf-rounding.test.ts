import { describe, expect, it } from 'vitest';
import { hfLlamaRounding, roundedTensor, topoOrder } from './hf-rounding.js';

describe('hf-rounding helpers', () => {
  it('roundedTensor rounds to bf16 nearest-even in a new tensor and returns a tensor already of the dtype as is', () => {
    const t = { dtype: 'f32' as const, shape: [3], data: Float32Array.from([1, 1 + 2 ** -8, 1 + 3 * 2 ** -8]) };
    const r = roundedTensor(t, 'bf16');
    expect(r.dtype).toBe('bf16');
    expect([...r.data]).toEqual([1, 1, 1 + 2 ** -6]);
    expect(t.data[1]).toBe(1 + 2 ** -8);
    expect(roundedTensor(r, 'bf16')).toBe(r);
  });

  it('topoOrder puts every node after the nodes defining its operands, stable otherwise', () => {
    // node 0 reads value 2 (defined by node 2); node 1 reads nothing; node 2 reads value 1 (node 1).
    const nodes = [{ operands: [2] }, { operands: [] }, { operands: [1] }];
    const values = [{ node: 0 }, { node: 1 }, { node: 2 }];
    expect(topoOrder(nodes, values)).toEqual([1, 2, 0]);
  });

  it('hfLlamaRounding expands rmsNorm into a rounded norm times the weight, and leaves other ops alone', () => {
    const emitted: string[] = [];
    let next = 10;
    const op1 = (op: string): number => {
      emitted.push(op);
      return next++;
    };
    const types = [{ dtype: 'bf16', shape: [2, 8] }, { dtype: 'bf16', shape: [8] }];
    const id = hfLlamaRounding({ op: 'sml.rms_norm', results: [{ name: 'h', type: { dtype: 'f32', shape: [2, 8] } }] }, [0, 1], 'bf16', { eps: 1e-5 }, op1, (b) => b, types);
    expect(emitted).toEqual(['sml.rms_norm', 'sml.mul']);
    expect(id).toBe(11);
    expect(hfLlamaRounding({ op: 'sml.add', results: [{ name: 'y', type: { dtype: 'f32', shape: [8] } }] }, [0, 1], 'bf16', undefined, op1, (b) => b, types)).toBeUndefined();
  });
});
