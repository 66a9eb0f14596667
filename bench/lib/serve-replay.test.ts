// bench/gpu/serve's worker-alone measurement (issue 41): record.py keeps the frames a served run
// sends its torch worker, replay.py sends them again to a fresh worker and times each drive case.
// On the CPU worker: the recording changes no reply, the replay takes every frame again with the
// same replies, and a case's frames are the ones read inside its window.
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { GraphBuilder, hostTensor } from '@stageml/ir';
import { createTorchExecutor } from '@stageml/runtime';
import { expect, it } from 'vitest';
import { describeWithTorch, torchPython } from '../../packages/runtime/src/torch/test-support.js';

const SERVE = fileURLToPath(new URL('../gpu/serve', import.meta.url));
/** Seconds since the epoch to the microsecond, as drive.py's time.time() (Date.now() is whole milliseconds). */
const wall = (): number => (performance.timeOrigin + performance.now()) / 1000;

/** An interpreter wrapper as run.sh writes it: the worker under record.py, recording into `rec`. */
function recordingPython(dir: string, python: string, rec: string): string {
  const wrapper = join(dir, 'python-record');
  writeFileSync(wrapper, `#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = stageml_torch.worker ]; then shift 2; RECORD_DIR='${rec}' exec '${python}' '${join(SERVE, 'record.py')}' "$@"; fi\nexec '${python}' "$@"\n`, { mode: 0o755 });
  return wrapper;
}

const b = new GraphBuilder('scale');
const x = b.input('x', ['f32', ['n', 4]]);
b.output('y', b.add(b.mul(x, b.param('W', ['f32', [4]])), x));
const g = b.build();
const weights = { W: hostTensor('f32', [4], [1, 2, 3, 4]) };
const input = (n: number) => ({ x: hostTensor('f32', [n, 4], Array.from({ length: 4 * n }, (_, i) => i - n)) });
/** The graph's values, y = x · (W + 1). */
const expected = (n: number): number[] => Array.from(input(n).x.data as Float32Array, (v, i) => v * ([1, 2, 3, 4][i % 4]! + 1));
const NATIVE = fileURLToPath(new URL('../../native', import.meta.url));

describeWithTorch('bench/gpu/serve record.py and replay.py', () => {
  it('records what the executor sends its worker and replays it to a fresh worker, timing each case', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'stageml-replay-'));
    try {
      const python = torchPython();
      const rec = join(dir, 'rec');
      const wrapper = recordingPython(dir, python, rec);
      const served: Float32Array[] = [];
      const ex = await createTorchExecutor({ python: wrapper, device: 'cpu' });
      let t0 = 0;
      let t1 = 0;
      try {
        const p = await ex.prepare(g, weights);
        served.push((await p.run(input(1)))['y']!.data as Float32Array);
        t0 = wall();
        for (const n of [2, 3, 5]) served.push((await p.run(input(n)))['y']!.data as Float32Array);
        t1 = wall();
        p.dispose();
      } finally {
        await ex.close();
      }
      // The recording changed no reply: the values are the graph's, y = x · (W + 1).
      served.forEach((y, k) => {
        expect(Array.from(y)).toEqual(expected([1, 2, 3, 5][k]!));
      });
      const index = readFileSync(join(rec, 'index.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { op: string; t: number });
      expect(index.map((f) => f.op)).toEqual(['hello', 'prepare', 'run', 'run', 'run', 'run', 'dispose', 'shutdown']);
      const drive = join(dir, 'drive.json');
      writeFileSync(drive, JSON.stringify({ cases: [{ kind: 'base', streams: 3, tokens: 10, tok_s: 100, t0_unix: t0, t1_unix: t1 }, { kind: 'none', streams: 1, tokens: 1, tok_s: 1, t0_unix: 0, t1_unix: 1 }] }));
      const out = join(dir, 'replay.json');
      const r = spawnSync(python, [join(SERVE, 'replay.py'), '--record', rec, '--drive', drive, '--out', out, '--python', python], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: NATIVE }, timeout: 120_000 });
      expect(r.status, r.stderr).toBe(0);
      const replay = JSON.parse(readFileSync(out, 'utf8')) as { replayed: number; failed_count: number; cases: { kind: string; runs: number; frames: number; wall_s: number; alone_tok_s: number; http_over_alone: number; frames_ms: [string, number][]; run_median_ms: number; over_median_ms: number }[] };
      // Every frame but the shutdown, each answered ok again.
      expect(replay.replayed).toBe(7);
      expect(replay.failed_count).toBe(0);
      // The case holds the three runs inside its window (a case whose window saw no frame is left out).
      expect(replay.cases).toHaveLength(1);
      expect(replay.cases[0]).toMatchObject({ kind: 'base', runs: 3, frames: 3 });
      expect(replay.cases[0]!.alone_tok_s).toBeCloseTo(10 / replay.cases[0]!.wall_s, 6);
      expect(replay.cases[0]!.http_over_alone).toBeCloseTo(100 / replay.cases[0]!.alone_tok_s, 6);
      // Each of its frames' replayed ms, the median run and what the runs took beyond it.
      const ms = replay.cases[0]!.frames_ms;
      expect(ms.map(([op]) => op)).toEqual(['run', 'run', 'run']);
      const sorted = ms.map(([, v]) => v).sort((a, b) => a - b);
      expect(replay.cases[0]!.run_median_ms).toBe(sorted[1]);
      expect(replay.cases[0]!.over_median_ms).toBeCloseTo(sorted[2]! - sorted[1]!, 2);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
  it('keeps serving when the record cannot be written, and the replay refuses the incomplete record', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'stageml-replay-'));
    try {
      const python = torchPython();
      const rec = join(dir, 'rec');
      mkdirSync(rec);
      // Every write fails as on a full disk (ENOSPC).
      symlinkSync('/dev/full', join(rec, 'frames.bin'));
      const ex = await createTorchExecutor({ python: recordingPython(dir, python, rec), device: 'cpu' });
      try {
        const p = await ex.prepare(g, weights);
        for (const n of [1, 3]) expect(Array.from((await p.run(input(n)))['y']!.data as Float32Array)).toEqual(expected(n));
        p.dispose();
      } finally {
        await ex.close();
      }
      const meta = JSON.parse(readFileSync(join(rec, 'meta.json'), 'utf8')) as { failed: string | null };
      expect(meta.failed).toMatch(/writing the record failed after 0 bytes/);
      const drive = join(dir, 'drive.json');
      writeFileSync(drive, JSON.stringify({ cases: [] }));
      const r = spawnSync(python, [join(SERVE, 'replay.py'), '--record', rec, '--drive', drive, '--out', join(dir, 'replay.json'), '--python', python], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: NATIVE }, timeout: 120_000 });
      expect(r.status).not.toBe(0);
      expect(r.stderr).toContain('the record is incomplete (writing the record failed');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
