// Tests that need Python 3 with torch (Debian: python3-torch). CI must run them: there a missing
// torch fails the suite with a clear message; elsewhere the suite is skipped.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describeNeeding } from '@stageml/testkit';
import { afterAll, beforeAll } from 'vitest';
import { RuntimeCode, RuntimeError } from '../errors.js';
import { type TorchExecutor, createTorchExecutor, isTorchAvailable } from './executor.js';

/** Whether the torch executor's interpreter (STAGEML_PYTHON, python3, /usr/bin/python3) has torch. */
export const TORCH_AVAILABLE = isTorchAvailable();

/** A `describe` that needs torch (see the file comment). */
export function describeWithTorch(name: string, fn: () => void): void {
  describeNeeding(name, TORCH_AVAILABLE, () => new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)'), fn);
}

/**
 * Inside a `describeWithTorch`: starts a CPU torch executor before the suite's tests and closes it
 * after them; the returned function gives the running executor.
 */
export function useCpuTorchExecutor(): () => TorchExecutor {
  let executor: TorchExecutor | undefined;
  beforeAll(async () => {
    executor = await createTorchExecutor({ device: 'cpu' });
  }, 120_000);
  afterAll(async () => {
    await executor?.close();
  });
  return () => {
    if (executor === undefined) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor has not started (use it inside a test)');
    return executor;
  };
}

/** The repository's `native/` folder (the `stageml_torch` package's parent). */
export const NATIVE_DIR = fileURLToPath(new URL('../../../../native', import.meta.url));

let python: string | undefined;

/** The interpreter the torch executor would pick (STAGEML_PYTHON, else python3 or /usr/bin/python3 with torch). */
export function torchPython(): string {
  const env = process.env['STAGEML_PYTHON'];
  const candidates = env !== undefined && env !== '' ? [env] : ['python3', '/usr/bin/python3'];
  return candidates.find((c) => spawnSync(c, ['-c', 'import torch'], { timeout: 60_000 }).status === 0) ?? 'python3';
}

/**
 * Runs Python `code` with `native/` on the path (and `env` added) and parses the last line it
 * prints as JSON; a non-zero exit throws with its stderr.
 */
export function runNativePython(code: string, env: Record<string, string> = {}): unknown {
  python ??= torchPython();
  const r = spawnSync(python, ['-c', code], { env: { ...process.env, PYTHONPATH: NATIVE_DIR, ...env }, encoding: 'utf8' });
  if (r.status !== 0) throw new RuntimeError(RuntimeCode.EVAL_FAILED, `python failed (${String(r.status)}): ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop() ?? 'null');
}
