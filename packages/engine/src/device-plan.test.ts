import { fileURLToPath } from 'node:url';
import { dtypeBytes } from '@stageml/ir';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, EngineCode, checkDeviceMemory, planDeviceMemory } from './index.js';

const base = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama/base', import.meta.url));

describe('planDeviceMemory / checkDeviceMemory (--gpu-memory-utilization)', () => {
  let e: Engine;
  beforeAll(async () => {
    e = await Engine.load(base, { maxLoras: 3, maxLoraRank: 8, dtype: 'bf16' });
  }, 60_000);
  afterAll(() => {
    e.dispose();
  });

  it('counts weights, slot tables, the KV of every row at the full length and a step workspace against utilization × device', () => {
    const c = e.config;
    const req = { deviceBytes: 1e9, utilization: 0.5, maxBatch: 4, maxModelLen: 100, stepTokens: 16 };
    const p = planDeviceMemory(e, req);
    const m = e.memory();
    expect(p.weights).toBe(m.weights);
    expect(p.slots).toBe(m.slots);
    expect(p.kv).toBe(4 * 100 * (2 * c.numLayers * c.numKvHeads * c.headDim * dtypeBytes('bf16') + 4));
    expect(p.workspace).toBe(16 * (c.vocabSize + 4 * c.hiddenSize + 2 * c.intermediateSize) * 4);
    expect(p.total).toBe(p.weights + p.slots + p.kv + p.workspace);
    expect(p.limit).toBe(5e8);
    expect(p.fits).toBe(true);
    expect(checkDeviceMemory(e, req)).toEqual(p);
  });

  it('is ENGINE_DEVICE_MEMORY naming every size when the plan does not fit, and ENGINE_BAD_OPTIONS for bad numbers', () => {
    const tight = { deviceBytes: 2 ** 20, utilization: 0.9, maxBatch: 8, maxModelLen: 2048, stepTokens: 512 };
    expect(planDeviceMemory(e, tight).fits).toBe(false);
    expect(() => checkDeviceMemory(e, tight)).toThrow(expect.objectContaining({ code: EngineCode.DEVICE_MEMORY, message: expect.stringMatching(/weights .* slot tables .* KV .*8 sequences × 2048 tokens.* workspace .* may use .*0\.9 ×/) }));
    for (const bad of [{ utilization: 0 }, { utilization: 1.5 }, { utilization: Number.NaN }, { deviceBytes: 0 }, { maxBatch: 0 }, { maxModelLen: 1.5 }]) {
      expect(() => planDeviceMemory(e, { ...tight, ...bad })).toThrow(expect.objectContaining({ code: EngineCode.BAD_OPTIONS }));
    }
  });
});
