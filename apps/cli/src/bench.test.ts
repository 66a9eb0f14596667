import { afterEach, describe, expect, it, vi } from 'vitest';
import { ExitCode } from './index.js';
import { DEFAULT_EXECUTOR, EXECUTOR_NAMES, probeShapeOf, resolveExecutor } from './executors.js';
import { fixture, runCaptured as run } from './test-fixtures.js';

afterEach(() => {
  vi.unstubAllEnvs();
});

describe('stageml bench lora-layer', () => {
  it('prints the LoRA layer and base medians and their ratio as JSON', async () => {
    const r = await run(['bench', 'lora-layer', '--dim', '64', '--rank', '4', '--batch', '8', '--executor', 'onnxruntime', '--runs', '3', '--json']);
    expect(r.code).toBe(ExitCode.OK);
    const j = JSON.parse(r.out) as Record<string, number | string>;
    expect(j).toMatchObject({ bench: 'lora-layer', executor: 'onnxruntime', dim: 64, rank: 4, batch: 8, runs: 3 });
    expect(j['loraMs']).toBeGreaterThan(0);
    expect(j['baseMs']).toBeGreaterThan(0);
    expect(j['ratio']).toBeCloseTo((j['loraMs'] as number) / (j['baseMs'] as number), 10);
  });

  it('prints a table, and logs which executor auto chose', async () => {
    const r = await run(['bench', 'lora-layer', '--dim', '32', '--rank', '2', '--batch', '2', '--runs', '1']);
    expect(r.code).toBe(ExitCode.OK);
    expect(r.err).toMatch(/^executor: \S+ \(/);
    expect(r.out).toMatch(/lora-layer d=32 r=2 batch=2 on \S+ \(median of 1 runs each\)/);
    expect(r.out).toMatch(/residual LoRA layer\s+[\d.]+ ms/);
    expect(r.out).toMatch(/ratio\s+[\d.]+/);
  });

  it('runs on the interpreter when asked', async () => {
    const r = await run(['bench', 'lora-layer', '--dim', '16', '--rank', '2', '--batch', '2', '--runs', '1', '--executor', 'interpreter', '--json']);
    expect(JSON.parse(r.out)).toMatchObject({ executor: 'interpreter' });
  });

  it('rejects unknown suites (exit 2) and executors (exit 5, RT_BACKEND_UNAVAILABLE)', async () => {
    const suite = await run(['bench', 'gemm', '--dim', '8', '--rank', '1', '--batch', '1']);
    expect(suite.code).toBe(ExitCode.USAGE);
    expect(suite.err).toContain('error[CLI_USAGE]');
    const ex = await run(['bench', 'lora-layer', '--dim', '8', '--rank', '1', '--batch', '1', '--executor', 'tpu']);
    expect(ex.code).toBe(ExitCode.UNAVAILABLE);
    expect(ex.err).toContain('error[RT_BACKEND_UNAVAILABLE]');
    const bad = await run(['bench', 'lora-layer', '--dim', '0', '--rank', '1', '--batch', '1']);
    expect(bad.code).toBe(ExitCode.USAGE);
  });
});

describe('resolveExecutor', () => {
  it('accepts auto and every runtime executor', () => {
    expect(EXECUTOR_NAMES).toEqual(['auto', 'onnxruntime', 'cpu-native', 'tfjs-wasm', 'tfjs-cpu', 'interpreter', 'torch']);
  });

  it('defaults to STAGEML_EXECUTOR, else the interpreter', async () => {
    expect((await resolveExecutor(undefined)).name).toBe(DEFAULT_EXECUTOR);
    vi.stubEnv('STAGEML_EXECUTOR', 'onnxruntime');
    expect((await resolveExecutor(undefined)).name).toBe('onnxruntime');
    expect((await resolveExecutor('interpreter')).name).toBe('interpreter');
    expect((await resolveExecutor('tfjs-cpu')).name).toBe('tfjs-cpu');
  });

  it('rejects unknown names with RT_BACKEND_UNAVAILABLE', async () => {
    await expect(resolveExecutor('cuda')).rejects.toMatchObject({ code: 'RT_BACKEND_UNAVAILABLE' });
  });
});

describe('probeShapeOf', () => {
  it("reads the decoder layer `auto` measures from the model's config.json", async () => {
    const dir = fixture('peft-tiny/llama/base');
    expect(await probeShapeOf(dir)).toEqual({ hidden: 64, intermediate: 176, layers: 2, heads: 4, kvHeads: 2, headDim: 16, batches: [1, 8] });
    // The serving batch (capped at 8) and --quantize (auto measured as int8) change the step.
    expect((await probeShapeOf(dir, { maxBatch: 4 }))?.batches).toEqual([1, 4]);
    expect((await probeShapeOf(dir, { maxBatch: 1 }))?.batches).toEqual([1]);
    expect((await probeShapeOf(dir, { maxBatch: 64 }))?.batches).toEqual([1, 8]);
    expect((await probeShapeOf(dir, { quantize: { spec: { bits: 4, blockSize: 32, symmetric: true } } }))?.quantize).toEqual({ bits: 4, blockSize: 32, symmetric: true });
    expect((await probeShapeOf(dir, { quantize: { choose: () => undefined } }))?.quantize).toEqual({ bits: 8, blockSize: 32, symmetric: true });
    // An MoE model is measured on its routed experts (Mixtral: 4 experts, top 2).
    expect((await probeShapeOf(fixture('peft-tiny/mixtral/base')))?.moe).toEqual({ experts: 4, topK: 2, intermediate: expect.any(Number) as number });
    // No readable config: undefined (the runtime's default shape is measured).
    expect(await probeShapeOf('/nonexistent-stageml')).toBeUndefined();
  });
});
