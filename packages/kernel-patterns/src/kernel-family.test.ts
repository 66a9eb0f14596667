import { describe, expect, it } from 'vitest';

import { type ResidualKernel, byKernelFamily } from './index.js';

describe('byKernelFamily', () => {
  it('calls the emitter of each kernel kind’s family', () => {
    const emit = { loraLinear: () => 'linear', bank: (k: { kind: string }) => `bank:${k.kind}`, moe: () => 'moe' };
    // Only `kind` is read: the rest of a kernel does not matter to the dispatch.
    const of = (kind: ResidualKernel['kind']): ResidualKernel => ({ kind }) as unknown as ResidualKernel;
    expect(['loraLinear', 'bankGrouped', 'bankGathered', 'moeLora'].map((k) => byKernelFamily(of(k as ResidualKernel['kind']), emit))).toEqual([
      'linear',
      'bank:bankGrouped',
      'bank:bankGathered',
      'moe',
    ]);
  });
});
