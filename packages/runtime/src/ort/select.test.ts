import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';

import { DEFAULT_CANDIDATES, DEFAULT_FALLBACKS, EXECUTOR_ENV, selectExecutor } from './select.js';

const dir = mkdtempSync(join(tmpdir(), 'stageml-select-'));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});
afterEach(() => {
  vi.unstubAllEnvs();
});

describe('selectExecutor', () => {
  it('uses a forced executor without measuring, by option or environment', async () => {
    const lines: string[] = [];
    const a = await selectExecutor({ force: 'interpreter', log: (l) => lines.push(l) });
    expect([a.name, a.source, a.executor.name]).toEqual(['interpreter', 'forced', 'interpreter']);
    expect(lines).toEqual(["executor: interpreter ('interpreter' as requested)"]);
    vi.stubEnv(EXECUTOR_ENV, 'onnxruntime');
    const b = await selectExecutor();
    expect([b.name, b.source, b.reason]).toEqual(['onnxruntime', 'forced', `'onnxruntime' forced by ${EXECUTOR_ENV}=onnxruntime`]);
  });

  it('rejects unknown executor names (RT_BACKEND_UNAVAILABLE)', async () => {
    vi.stubEnv(EXECUTOR_ENV, 'tpu');
    await expect(selectExecutor()).rejects.toMatchObject({ code: 'RT_BACKEND_UNAVAILABLE' });
    await expect(selectExecutor({ force: 'gpu' as 'auto' })).rejects.toMatchObject({ code: 'RT_BACKEND_UNAVAILABLE' });
  });

  const tiny = { hidden: 32, intermediate: 48, heads: 2, kvHeads: 1, headDim: 16, layers: 2, batches: [1, 4] };

  it('measures the candidates once on the model step, picks the fastest, and remembers it in memory and on disk', async () => {
    const cacheFile = join(dir, 'choice.json');
    const lines: string[] = [];
    const opts = { candidates: ['tfjs-wasm', 'onnxruntime'] as const, fallbacks: [], shape: tiny, cacheFile };
    const first = await selectExecutor({ ...opts, log: (l) => lines.push(l) });
    expect(first.source).toBe('probe');
    expect(Object.keys(first.probeMs).sort()).toEqual(['onnxruntime', 'tfjs-wasm']);
    for (const ms of Object.values(first.probeMs)) expect(ms).toHaveLength(2);
    // Each batch counts alike: the winner's time relative to the best at each batch sums lowest.
    const best = [0, 1].map((i) => Math.min(...Object.values(first.probeMs).map((ms) => ms[i]!)));
    const score = (ms: readonly number[]): number => ms.reduce((s, t, i) => s + t / best[i]!, 0);
    const fastest = Object.entries(first.probeMs).sort((x, y) => score(x[1]) - score(y[1]))[0]![0];
    expect(first.name).toBe(fastest);
    expect(lines[0]).toMatch(/^executor: \S+ \('\S+' is fastest on this model's step \(2 layers of hidden 32, intermediate 48, heads 2\/1×16, f32, batch 1 \+ 4\): \S+ [\d.]+ \+ [\d.]+ ms, \S+ [\d.]+ \+ [\d.]+ ms; remembered in /);
    // Same options in the same process: the same choice, without a new probe.
    const again = await selectExecutor(opts);
    expect(again.executor).toBe(first.executor);
    const saved = JSON.parse(readFileSync(cacheFile, 'utf8')) as { entries: Record<string, { name: string }> };
    expect(Object.values(saved.entries).map((e) => e.name)).toEqual([first.name]);
    // The key holds the step shape, the CPU's flags and each candidate's build.
    const key = Object.keys(saved.entries)[0]!;
    expect(key).toMatch(/flags [0-9a-f]{12}|flags unknown/);
    expect(key).toMatch(/tfjs-wasm \d\S*, onnxruntime \d/);
    expect(key).toContain('2 layers of hidden 32, intermediate 48, heads 2/1×16, f32, batch 1 + 4');
    // A fresh process (module state reset) reads the file instead of probing.
    vi.resetModules();
    const fresh = await import('./select.js');
    const cached = await fresh.selectExecutor(opts);
    expect([cached.source, cached.name]).toEqual(['cache', first.name]);
    // Another shape (or quantization) is another decision.
    const other = await fresh.selectExecutor({ ...opts, shape: { ...tiny, quantize: { bits: 8, blockSize: 16, symmetric: true } } });
    expect(other.source).toBe('probe');
    expect(Object.keys((JSON.parse(readFileSync(cacheFile, 'utf8')) as { entries: object }).entries)).toHaveLength(2);
    const refreshed = await fresh.selectExecutor({ ...opts, refresh: true });
    expect(refreshed.source).toBe('probe');
  });

  it('measures cpu-native and onnxruntime by default, the tfjs fallbacks only when neither runs', async () => {
    expect(DEFAULT_CANDIDATES).toEqual(['cpu-native', 'onnxruntime']);
    expect(DEFAULT_FALLBACKS).toEqual(['tfjs-wasm', 'tfjs-cpu']);
    const s = await selectExecutor({ shape: tiny, cacheFile: false });
    expect(Object.keys(s.probeMs).sort()).toEqual(['cpu-native', 'onnxruntime']);
    // torch is no candidate here (no worker is started): a candidate that fails makes way for the fallbacks.
    vi.stubEnv('STAGEML_PYTHON', '/nonexistent/python');
    const fb = await selectExecutor({ candidates: ['torch'], fallbacks: ['tfjs-wasm'], shape: tiny, cacheFile: false });
    expect([fb.name, fb.source]).toEqual(['tfjs-wasm', 'probe']);
    expect(fb.reason).toMatch(/unavailable: torch: /);
    const noFb = await selectExecutor({ candidates: ['onnxruntime'], fallbacks: ['tfjs-wasm'], shape: tiny, cacheFile: false });
    expect(Object.keys(noFb.probeMs)).toEqual(['onnxruntime']);
  });

  it('measures an MoE model on its routed experts: cpu-native and onnxruntime both run and check the MoE step', async () => {
    const moe = { ...tiny, moe: { experts: 8, topK: 2, intermediate: 24 } };
    const lines: string[] = [];
    const s = await selectExecutor({ shape: moe, cacheFile: false, log: (l) => lines.push(l) });
    expect(Object.keys(s.probeMs).sort()).toEqual(['cpu-native', 'onnxruntime']);
    expect(s.reason).not.toMatch(/unavailable/);
    expect(lines[0]).toContain('2 layers of hidden 32, 8 experts (top 2) of intermediate 24, heads 2/1×16, f32, batch 1 + 4');
    await expect(selectExecutor({ shape: { ...moe, moe: { experts: 2, topK: 3, intermediate: 8 } }, cacheFile: false })).rejects.toMatchObject({ code: 'RT_BAD_VALUE', message: /topK \(3\) exceeds the experts \(2\)/ });
  });

  it('refuses a bad probe shape (RT_BAD_VALUE)', async () => {
    await expect(selectExecutor({ shape: { hidden: 0, intermediate: 8 }, cacheFile: false })).rejects.toMatchObject({ code: 'RT_BAD_VALUE', message: /hidden must be a positive integer/ });
    await expect(selectExecutor({ shape: { hidden: 64, intermediate: 8, heads: 4, kvHeads: 3 }, cacheFile: false })).rejects.toMatchObject({ code: 'RT_BAD_VALUE', message: /kvHeads \(3\) must divide heads \(4\)/ });
    await expect(selectExecutor({ shape: { hidden: 64, intermediate: 8, batches: [] }, cacheFile: false })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
  });

  it('falls back to the interpreter when no candidate runs', async () => {
    const s = await selectExecutor({ candidates: [], fallbacks: [], cacheFile: false });
    expect([s.name, s.source]).toEqual(['interpreter', 'fallback']);
  });
});
