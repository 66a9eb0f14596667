import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';

import { EXECUTOR_ENV, selectExecutor } from './index.js';

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

  it('measures the candidates once, picks the fastest, and remembers it in memory and on disk', async () => {
    const cacheFile = join(dir, 'choice.json');
    const lines: string[] = [];
    const first = await selectExecutor({ candidates: ['tfjs-wasm', 'onnxruntime'], cacheFile, log: (l) => lines.push(l) });
    expect(first.source).toBe('probe');
    expect(Object.keys(first.probeMs).sort()).toEqual(['onnxruntime', 'tfjs-wasm']);
    const fastest = Object.entries(first.probeMs).sort((x, y) => x[1] - y[1])[0]![0];
    expect(first.name).toBe(fastest);
    expect(lines[0]).toMatch(/^executor: \S+ \('\S+' is fastest on a GEMM probe \(tfjs-wasm [\d.]+ ms, onnxruntime [\d.]+ ms\); remembered in /);
    // Same options in the same process: the same choice, without a new probe.
    const again = await selectExecutor({ candidates: ['tfjs-wasm', 'onnxruntime'], cacheFile });
    expect(again.executor).toBe(first.executor);
    const saved = JSON.parse(readFileSync(cacheFile, 'utf8')) as { entries: Record<string, { name: string }> };
    expect(Object.values(saved.entries).map((e) => e.name)).toEqual([first.name]);
    // A fresh process (module state reset) reads the file instead of probing.
    vi.resetModules();
    const fresh = await import('./select.js');
    const cached = await fresh.selectExecutor({ candidates: ['tfjs-wasm', 'onnxruntime'], cacheFile });
    expect([cached.source, cached.name]).toEqual(['cache', first.name]);
    const refreshed = await fresh.selectExecutor({ candidates: ['tfjs-wasm', 'onnxruntime'], cacheFile, refresh: true });
    expect(refreshed.source).toBe('probe');
  });

  it('falls back to the interpreter when no candidate runs', async () => {
    const s = await selectExecutor({ candidates: [], cacheFile: false });
    expect([s.name, s.source]).toEqual(['interpreter', 'fallback']);
  });
});
