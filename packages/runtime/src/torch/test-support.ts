// Tests that need Python 3 with torch (Debian: python3-torch). CI must run them: there a missing
// torch fails the suite with a clear message; elsewhere the suite is skipped.
import { afterAll, beforeAll, describe, it } from 'vitest';
import { RuntimeCode, RuntimeError } from '../errors.js';
import { type TorchExecutor, createTorchExecutor, isTorchAvailable } from './executor.js';

/** Whether the torch executor's interpreter (STAGEML_PYTHON, python3, /usr/bin/python3) has torch. */
export const TORCH_AVAILABLE = isTorchAvailable();

/** A `describe` that needs torch (see the file comment). */
export function describeWithTorch(name: string, fn: () => void): void {
  if (!TORCH_AVAILABLE && process.env['CI'] !== undefined) {
    describe(name, () => {
      it('needs Python 3 with torch', () => {
        throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, 'the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)');
      });
    });
    return;
  }
  describe.skipIf(!TORCH_AVAILABLE)(name, fn);
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
