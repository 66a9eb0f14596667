/**
 * A decode step's reply from the torch worker to the TypeScript executor, through a real pipe, at
 * the Llama-3-8B shape: 64 rows of f32 logits over 128,256 tokens plus the 64 new key and value
 * tensors (bf16, [64, 1, 8, 128]), written by `stageml_torch.protocol.write_frame` from CPU
 * tensors in a Python process and decoded by `FrameDecoder` here. Cases: the full reply (what a
 * step with a sampled row returns), and the reply of a greedy step (`RunOptions.argmax`: one i64
 * per row instead of the logits).
 *
 *   node --conditions=@stageml/source --import tsx bench/torch-reply.ts
 *
 * Per case the median over 12 frames (after 2) of the time from the write's start to the decoded
 * frame. Needs python3 with torch (CI installs Debian's python3-torch). Results:
 * bench/results/torch-reply.{json,md}.
 */
import { spawn, spawnSync } from 'node:child_process';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { FrameDecoder } from '@stageml/runtime';
import { type BenchCase, writeResults } from './lib/harness.js';

const NATIVE = fileURLToPath(new URL('../native', import.meta.url));
const FRAMES = 14;
const WARM = 2;

const WRITER = `
import sys, time, torch
from stageml_torch.protocol import write_frame
from stageml_torch.ops import argmax_rows
greedy = sys.argv[1] == "1"
g = torch.Generator().manual_seed(0)
logits = torch.randn((64, 128256), generator=g).to(torch.bfloat16).float()
kv = {"new_%s.%d" % (kv, l): torch.randn((64, 1, 8, 128), generator=g).to(torch.bfloat16) for l in range(32) for kv in ("key", "value")}
out = sys.stdout.buffer
for i in range(${String(FRAMES)}):
    tensors = dict(kv, logits=argmax_rows(logits) if greedy else logits)
    write_frame(out, {"ok": True, "t": time.time()}, tensors)
`;

/** The interpreter the torch executor would use: STAGEML_PYTHON, else python3 or /usr/bin/python3 with torch. */
function python(): string | undefined {
  const env = process.env['STAGEML_PYTHON'];
  const candidates = env !== undefined && env !== '' ? [env] : ['python3', '/usr/bin/python3'];
  return candidates.find((c) => spawnSync(c, ['-c', 'import torch'], { timeout: 60_000 }).status === 0);
}

async function measure(py: string, greedy: boolean): Promise<{ ms: number; mb: number }> {
  return new Promise((resolve, reject) => {
    const p = spawn(py, ['-c', WRITER, greedy ? '1' : '0'], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, PYTHONPATH: NATIVE } });
    const d = new FrameDecoder();
    const times: number[] = [];
    let bytes = 0;
    let err = '';
    p.stderr.on('data', (b: Buffer) => (err += b.toString()));
    p.stdout.on('data', (b: Buffer) => {
      bytes += b.byteLength;
      d.push(b);
      for (let f = d.next(); f !== undefined; f = d.next()) times.push(Date.now() - (f.header['t'] as number) * 1000);
    });
    p.on('close', (code) => {
      if (code !== 0 || times.length !== FRAMES) {
        reject(new Error(`writer failed (${String(code)}): ${err}`));
        return;
      }
      const t = times.slice(WARM).sort((a, b) => a - b);
      resolve({ ms: t[t.length >> 1]!, mb: bytes / FRAMES / 1e6 });
    });
  });
}

async function main(): Promise<void> {
  const load = loadavg().map((x) => x.toFixed(2)).join(' ');
  const cases: BenchCase[] = [];
  const py = python();
  if (py === undefined) throw new Error('bench torch-reply needs python3 with torch (apt-get install python3-torch, or set STAGEML_PYTHON)');
  const full = await measure(py, false);
  const greedy = await measure(py, true);
  const base = `full reply (${full.mb.toFixed(1)} MB: logits and new keys/values)`;
  cases.push({ name: base, medianMs: full.ms, runs: FRAMES - WARM });
  cases.push({ name: `greedy step's reply (${greedy.mb.toFixed(1)} MB: each row's argmax instead of the logits)`, medianMs: greedy.ms, runs: FRAMES - WARM, baseline: base, ratio: greedy.ms / full.ms });
  writeResults('torch-reply', "A Llama-3-8B decode step's reply at 64 rows from the torch worker's write_frame (CPU tensors, a Python process) to the decoded frame here, through a pipe: ms from the write's start (wall clock, both processes on this machine).", cases, [
    `Load average at start: ${load} (shared 2-core machine; the writer and the reader share it).`,
    'On the GPU host the worker copies its outputs from the device first (bench/results/gpu-worker.md: 2-3 ms at 64 rows); the pipe and the decoder are the same.',
  ]);
}

await main();
