// Test-only helpers for the engine suites that run the torch executor (CPU torch; Debian's
// python3-torch in CI, where a missing torch fails the suite with a clear message; elsewhere the
// suite is skipped).
import { RuntimeCode, RuntimeError, type TorchExecutor, createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { describeNeeding } from '@stageml/testkit';
import { afterAll, beforeAll } from 'vitest';

/** A `describe` that needs Python 3 with torch: failing in CI when torch is missing, skipped elsewhere. */
export function describeWithTorch(name: string, fn: () => void): void {
  describeNeeding(name, isTorchAvailable(), () => new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)'), fn);
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
