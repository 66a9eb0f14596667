/**
 * Lazy safetensors reads versus reading the whole file.
 *
 *   node --conditions=@stageml/source --import tsx bench/safetensors-read.ts
 *
 * Writes a 1 GiB checkpoint (256 F32 tensors of 4 MiB) to a temporary directory, then takes the
 * median of 5 runs of: opening it with `SafetensorsFile` and reading one 4 MiB tensor (raw and
 * decoded), `fs.readFile` of the whole file, and an eager load (readFile + parse + decode one
 * tensor), each after two unmeasured warm-ups. The file was just written, so every case reads
 * from the page cache: this measures the reader, not the disk. Results go to
 * bench/results/safetensors-read.{json,md}; the temporary file is deleted.
 */
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, tmpdir, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { type RawTensor, SafetensorsFile, parseSafetensors, writeSafetensors } from '@stageml/safetensors';

const TENSORS = 256;
const TENSOR_BYTES = 4 << 20;
const RUNS = 5;
const TARGET = 'layer.128.weight';
const RESULTS = join(dirname(fileURLToPath(import.meta.url)), 'results');

/** One measured case, in the shape of bench/lib/harness.ts's `BenchCase` plus its samples. */
interface Case {
  readonly name: string;
  readonly description: string;
  readonly medianMs: number;
  readonly minMs: number;
  readonly runs: number;
  readonly samplesMs: number[];
  /** Bytes the case delivers to the caller (MB/s is this over the median time, 1 MB = 10^6 B). */
  readonly bytes: number;
  readonly mbPerSec: number;
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

async function measure(name: string, description: string, bytes: number, run: () => Promise<unknown>): Promise<Case> {
  for (let i = 0; i < 2; i++) await run(); // warm-up, not counted
  const samplesMs: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const t0 = performance.now();
    await run();
    samplesMs.push(performance.now() - t0);
  }
  const medianMs = median(samplesMs);
  const c = { name, description, runs: RUNS, bytes, samplesMs: samplesMs.map((x) => Number(x.toFixed(3))), medianMs: Number(medianMs.toFixed(3)), minMs: Number(Math.min(...samplesMs).toFixed(3)), mbPerSec: Number((bytes / 1e6 / (medianMs / 1000)).toFixed(1)) };
  process.stdout.write(`${name.padEnd(14)} median ${medianMs.toFixed(2).padStart(9)} ms  ${String(c.mbPerSec).padStart(9)} MB/s\n`);
  return c;
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'stageml-bench-safetensors-'));
  try {
    const path = join(dir, 'model.safetensors');
    const data = new Uint8Array(TENSOR_BYTES);
    for (let i = 0; i < data.length; i += 4) new DataView(data.buffer).setFloat32(i, Math.sin(i), true);
    const tensors: Record<string, RawTensor> = {};
    for (let i = 0; i < TENSORS; i++) tensors[`layer.${String(i).padStart(3, '0')}.weight`] = { dtype: 'F32', shape: [1024, 1024], data };
    const t0 = performance.now();
    await writeSafetensors(path, tensors, { format: 'pt' });
    const fileBytes = (await readFile(path)).length;
    process.stdout.write(`wrote ${(fileBytes / 2 ** 30).toFixed(3)} GiB in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);

    const cases = [
      await measure('lazy-raw', `SafetensorsFile.open + readRaw('${TARGET}') + close`, TENSOR_BYTES, async () => {
        const f = await SafetensorsFile.open(path);
        await f.readRaw(TARGET);
        await f.close();
      }),
      await measure('lazy-tensor', `SafetensorsFile.open + readTensor('${TARGET}') + close`, TENSOR_BYTES, async () => {
        const f = await SafetensorsFile.open(path);
        await f.readTensor(TARGET);
        await f.close();
      }),
      await measure('readFile', 'fs.readFile of the whole file', fileBytes, () => readFile(path)),
      await measure('eager-tensor', `fs.readFile + parseSafetensors + readTensor('${TARGET}')`, TENSOR_BYTES, async () => {
        parseSafetensors(await readFile(path)).readTensor(TARGET);
      }),
    ];
    const medians = Object.fromEntries(cases.map((c) => [c.name, c.medianMs]));
    const ratio = (a: string, b: string): number => Number((medians[a]! / medians[b]!).toFixed(1));
    const ratios = { 'readFile/lazy-tensor': ratio('readFile', 'lazy-tensor'), 'eager-tensor/lazy-tensor': ratio('eager-tensor', 'lazy-tensor'), 'readFile/lazy-raw': ratio('readFile', 'lazy-raw') };
    const result = {
      suite: 'safetensors-read',
      date: new Date().toISOString(),
      machine: { cpus: cpus().length, cpuModel: cpus()[0]?.model ?? 'unknown', memory: totalmem(), node: process.version, platform: `${process.platform}-${process.arch}` },
      file: { bytes: fileBytes, tensors: TENSORS, tensorBytes: TENSOR_BYTES, runs: RUNS, cache: 'warm (file just written)' },
      cases,
      medians,
      ratios,
    };
    await mkdir(RESULTS, { recursive: true });
    await writeFile(join(RESULTS, 'safetensors-read.json'), `${JSON.stringify(result, null, 2)}\n`);
    const rows = cases.map((c) => `| ${c.name} | ${c.description} | ${(c.bytes / 2 ** 20).toFixed(0)} MiB | ${c.medianMs.toFixed(2)} | ${c.minMs.toFixed(2)} | ${String(c.mbPerSec)} |`);
    const md = [
      `# safetensors-read`,
      '',
      `${result.date} · ${String(result.machine.cpus)} × ${result.machine.cpuModel} · ${(result.machine.memory / 2 ** 30).toFixed(0)} GiB · Node ${process.version}`,
      '',
      `File: ${(fileBytes / 2 ** 30).toFixed(3)} GiB, ${String(TENSORS)} F32 tensors of 4 MiB, page cache warm; median of ${String(RUNS)} runs after two warm-ups. Lazy cases include open, header parse and close.`,
      '',
      '| case | what | bytes delivered | median ms | min ms | MB/s (median) |',
      '| --- | --- | ---: | ---: | ---: | ---: |',
      ...rows,
      '',
      ...Object.entries(ratios).map(([k, v]) => `- ${k}: **${String(v)}×**`),
      '',
    ].join('\n');
    await writeFile(join(RESULTS, 'safetensors-read.md'), md);
    process.stdout.write(`${Object.entries(ratios).map(([k, v]) => `${k} = ${String(v)}×`).join(', ')}\n`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
