// `pnpm test`: runs every vitest test in one process (one transform cache; faster than a vitest per
// package on a 2-core machine), then prints the reporter's totals as `N passed, N failed`.
// Extra arguments go to vitest (e.g. `pnpm test packages/ir`).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const dir = mkdtempSync(join(tmpdir(), 'stageml-test-'));
const report = join(dir, 'report.json');
const vitest = join('node_modules', '.bin', 'vitest');
const r = spawnSync(vitest, ['run', '--reporter=default', '--reporter=json', `--outputFile.json=${report}`, ...process.argv.slice(2)], {
  stdio: 'inherit',
});
let passed = 0;
let failed = 0;
let skipped = 0;
try {
  const totals = JSON.parse(readFileSync(report, 'utf8'));
  passed = totals.numPassedTests;
  failed = totals.numFailedTests + (totals.numRuntimeErrorTestSuites ?? 0);
  skipped = (totals.numPendingTests ?? 0) + (totals.numTodoTests ?? 0);
} catch {
  failed = Math.max(failed, 1);
}
rmSync(dir, { recursive: true, force: true });
console.log(`${passed} passed, ${failed} failed${skipped > 0 ? `, ${skipped} skipped` : ''}`);
process.exit(r.status === 0 && failed === 0 ? 0 : r.status || 1);
