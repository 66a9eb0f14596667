// Test helpers of the CLI's tests (not exported from the package).
import { fileURLToPath } from 'node:url';
import { runCli } from './cli.js';

/** Path of `p` under the repository's fixtures/. */
export const fixture = (p: string): string => fileURLToPath(new URL(`../../../fixtures/${p}`, import.meta.url));

/** Runs the CLI in-process, capturing its exit code and output lines. */
export async function runCaptured(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runCli(args, { out: (l) => out.push(l), err: (l) => err.push(l) });
  return { code, out: out.join('\n'), err: err.join('\n') };
}
