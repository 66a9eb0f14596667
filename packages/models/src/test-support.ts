// Test-only helpers of this package's suites.
import type { HostTensor } from '@stageml/ir';
import { expect } from 'vitest';

/** max |a − b| over two tensors of equal size. */
export function maxAbsDiff(a: HostTensor, b: HostTensor): number {
  expect(a.data.length).toBe(b.data.length);
  let m = 0;
  for (let i = 0; i < a.data.length; i++) m = Math.max(m, Math.abs(a.data[i]! - b.data[i]!));
  return m;
}
