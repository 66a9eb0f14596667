// Tests that need an external tool (nvcc here). CI has it on this machine kind and must run
// them: there a missing tool fails the test with a clear message; elsewhere the test is skipped.
import { spawnSync } from 'node:child_process';
import { it } from 'vitest';

/** Whether `cmd --version` runs. */
export function toolAvailable(cmd: string): boolean {
  const r = spawnSync(cmd, ['--version'], { encoding: 'utf8' });
  return r.status === 0;
}

/** An `it` that needs `tool` on PATH (see the file comment). */
export function itWithTool(tool: string, name: string, fn: () => void | Promise<void>, timeout = 120_000): void {
  const available = toolAvailable(tool);
  if (!available && process.env['CI'] !== undefined) {
    it(name, () => {
      throw new Error(`${tool} is required for this test in CI but was not found on PATH`);
    });
    return;
  }
  it.skipIf(!available)(name, fn, timeout);
}
