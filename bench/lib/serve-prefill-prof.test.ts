// bench/gpu/serve/prefill_prof.py (run.sh PREFILL_PROF=1): the profiler on the torch worker's first
// prefill runs and the decode runs after them. Its wrapper of the worker's run handler, driven here
// with run headers as the executor sends them and a stand-in handler, on the CPU (CPU ops only).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';
import { describeWithTorch, torchPython } from '../../packages/runtime/src/torch/test-support.js';

const SERVE = fileURLToPath(new URL('../gpu/serve', import.meta.url));
const NATIVE = fileURLToPath(new URL('../../native', import.meta.url));

const DRIVER = `
import sys, torch
sys.path.insert(0, sys.argv[1])
import prefill_prof as P
seen = []
def handler(self, header, tensors):
    seen.append(header["id"])
    return {"ok": True, "id": header["id"], "v": torch.ones(32, 32).matmul(torch.ones(32, 32)).sum().item()}
P._orig = handler
def run(i, appends):
    return {"id": i, "caches": {"rows": [{"append": [0, a]} for a in appends]}}
replies = [P.profiled(None, run(i, a), []) for i, a in enumerate([[1, 1], [6, 4], [3], [1, 1], [1, 1], [1, 1]])]
print([r["id"] for r in replies], seen)
`;

describeWithTorch('bench/gpu/serve prefill_prof.py', () => {
  it('profiles the first prefill runs and the decode runs after them, and returns every reply', () => {
    const dir = mkdtempSync(join(tmpdir(), 'stageml-pprof-'));
    try {
      const out = join(dir, 'prof.txt');
      const r = spawnSync(torchPython(), ['-c', DRIVER, SERVE], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: NATIVE, PREFILL_PROF_OUT: out, PREFILL_PROF_RUNS: '1', PREFILL_PROF_DECODE: '2' }, timeout: 120_000 });
      expect(r.status, r.stderr).toBe(0);
      // Every run answered by the worker's handler, in order, profiled or not.
      expect(r.stdout.trim()).toBe('[0, 1, 2, 3, 4, 5] [0, 1, 2, 3, 4, 5]');
      const heads = readFileSync(out, 'utf8').split('\n').filter((l) => l.startsWith('=== '));
      // The decode run before any prefill and the prefill past PREFILL_PROF_RUNS are not profiled;
      // the first prefill and the two decode runs after it are, each with its rows and positions.
      expect(heads.map((h) => h.replace(/wall [\d.]+ ms/, 'wall _ ms'))).toEqual([
        '=== prefill run: 2 rows, appended 10 positions (max 6 a row), wall _ ms (profiled), no CUDA device: CPU ops only',
        '=== decode run: 2 rows, appended 2 positions (max 1 a row), wall _ ms (profiled), no CUDA device: CPU ops only',
        '=== decode run: 2 rows, appended 2 positions (max 1 a row), wall _ ms (profiled), no CUDA device: CPU ops only',
      ]);
      expect(readFileSync(out, 'utf8')).toContain('aten::mm');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
