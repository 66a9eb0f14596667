/**
 * A decode step's reply from the torch worker to the TypeScript executor, through a real pipe, at
 * the Llama-3-8B shape: 64 rows of f32 logits over 128,256 tokens plus the 64 new key and value
 * tensors (bf16, [64, 1, 8, 128]), written by `stageml_torch.protocol.write_frame` from CPU
 * tensors in a Python process and decoded by `FrameDecoder` here. Cases: the full reply, the
 * reply of a greedy step (`RunOptions.argmax`: one i64 per row instead of the logits), and the
 * full reply through the decoder as it was before (the frame merged into one buffer, then each
 * tensor copied out: the peer this session's decoder replaces).
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
import { type Frame, FrameDecoder } from '@stageml/runtime';
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

/**
 * The decoder before this session (its `#peek` and `next`): the frame's bytes merged into one
 * buffer once they have all arrived, then each tensor copied out of it.
 */
class MergingDecoder {
  #chunks: Buffer[] = [];
  #size = 0;
  push(b: Buffer): void {
    this.#chunks.push(b);
    this.#size += b.byteLength;
  }
  #peek(n: number): Buffer {
    if (this.#chunks[0]!.byteLength < n) {
      let k = 0;
      let got = 0;
      while (got < n) got += this.#chunks[k++]!.byteLength;
      this.#chunks.splice(0, k, Buffer.concat(this.#chunks.slice(0, k)));
    }
    return this.#chunks[0]!.subarray(0, n);
  }
  next(): { header: Record<string, unknown> } | undefined {
    if (this.#size < 4) return undefined;
    const headLen = this.#peek(4).readUInt32LE(0);
    if (this.#size < 4 + headLen) return undefined;
    const header = JSON.parse(this.#peek(4 + headLen).subarray(4).toString('utf8')) as { tensors: { nbytes: number }[] } & Record<string, unknown>;
    let off = 4 + headLen;
    const total = header.tensors.reduce((a, t) => a + t.nbytes, off);
    if (this.#size < total) return undefined;
    const all = this.#peek(total);
    for (const t of header.tensors) {
      const buf = new ArrayBuffer(t.nbytes);
      new Uint8Array(buf).set(all.subarray(off, off + t.nbytes));
      off += t.nbytes;
    }
    const rest = this.#chunks[0]!.subarray(total);
    this.#chunks = rest.byteLength > 0 ? [rest, ...this.#chunks.slice(1)] : this.#chunks.slice(1);
    this.#size -= total;
    return { header };
  }
}

/** The interpreter the torch executor would use: STAGEML_PYTHON, else python3 or /usr/bin/python3 with torch. */
function python(): string | undefined {
  const env = process.env['STAGEML_PYTHON'];
  const candidates = env !== undefined && env !== '' ? [env] : ['python3', '/usr/bin/python3'];
  return candidates.find((c) => spawnSync(c, ['-c', 'import torch'], { timeout: 60_000 }).status === 0);
}

async function measure(py: string, greedy: boolean, decoder: 'new' | 'merging'): Promise<{ ms: number; mb: number }> {
  return new Promise((resolve, reject) => {
    const p = spawn(py, ['-c', WRITER, greedy ? '1' : '0'], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, PYTHONPATH: NATIVE } });
    const d = decoder === 'new' ? new FrameDecoder() : new MergingDecoder();
    const times: number[] = [];
    let bytes = 0;
    let err = '';
    p.stderr.on('data', (b: Buffer) => (err += b.toString()));
    p.stdout.on('data', (b: Buffer) => {
      bytes += b.byteLength;
      d.push(b);
      for (let f = d.next(); f !== undefined; f = d.next()) times.push(Date.now() - ((f as Frame).header['t'] as number) * 1000);
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
  const before = await measure(py, false, 'merging');
  const full = await measure(py, false, 'new');
  const greedy = await measure(py, true, 'new');
  const base = `full reply (${before.mb.toFixed(1)} MB), the merging decoder (before)`;
  cases.push({ name: base, medianMs: before.ms, runs: FRAMES - WARM });
  cases.push({ name: `full reply (${full.mb.toFixed(1)} MB), FrameDecoder`, medianMs: full.ms, runs: FRAMES - WARM, baseline: base, ratio: full.ms / before.ms });
  cases.push({ name: `greedy step's reply (${greedy.mb.toFixed(1)} MB: argmax instead of logits), FrameDecoder`, medianMs: greedy.ms, runs: FRAMES - WARM, baseline: base, ratio: greedy.ms / before.ms });
  writeResults('torch-reply', "A Llama-3-8B decode step's reply at 64 rows from the torch worker's write_frame (CPU tensors, a Python process) to the decoded frame here, through a pipe: ms from the write's start (wall clock, both processes on this machine).", cases, [
    `Load average at start: ${load} (shared 2-core machine; the writer and the reader share it).`,
    'On the GPU host the worker copies its outputs from the device first (bench/results/gpu-worker.md: 2-3 ms at 64 rows); the pipe and the decoder are the same.',
  ]);
}

await main();
