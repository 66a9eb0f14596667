import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** One measured case: median of repeated runs, with the ratio to its baseline when it has one. */
export interface BenchCase {
  name: string;
  medianMs: number;
  runs: number;
  baseline?: string;
  ratio?: number;
  budgetMs?: number;
  /**
   * The time, in the unit of `medianMs`, that the bytes the case must read take at the bandwidth
   * probed in the same run (lib/roofline.ts); the table then shows it and medianMs ÷ it.
   */
  rooflineMs?: number;
  extra?: Record<string, number | string>;
}

export const RESULTS_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', 'results');

/** Median wall time (ms) of `fn` over `runs` runs after `warmup` unmeasured runs. */
export function medianMs(fn: () => unknown, runs = 15, warmup = 3): number {
  for (let i = 0; i < warmup; i++) fn();
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    fn();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  const mid = times.length >> 1;
  return times.length % 2 === 1 ? times[mid]! : (times[mid - 1]! + times[mid]!) / 2;
}

export function machine(): Record<string, string | number> {
  const cpu = cpus();
  return { cpus: cpu.length, cpuModel: cpu[0]?.model ?? 'unknown', memoryGiB: Math.round(totalmem() / 2 ** 30), node: process.version, platform: `${process.platform}-${process.arch}` };
}

/**
 * Writes bench/results/<suite>.json and <suite>.md and prints the table. `meta` adds fields of the
 * run (load averages, what was chosen, goals) to the JSON document, beside its cases.
 */
export function writeResults(suite: string, description: string, cases: BenchCase[], notes: string[] = [], meta: Record<string, unknown> = {}): void {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const doc = { suite, description, date: new Date().toISOString(), machine: machine(), ...meta, cases };
  writeFileSync(join(RESULTS_DIR, `${suite}.json`), `${JSON.stringify(doc, null, 2)}\n`);
  const roofline = cases.some((c) => c.rooflineMs !== undefined);
  const rows = cases.map(
    (c) =>
      `| ${c.name} | ${c.medianMs.toFixed(3)} | ${String(c.runs)} | ${c.baseline ?? '—'} | ${c.ratio === undefined ? '—' : c.ratio.toFixed(2)} | ${c.budgetMs === undefined ? '—' : `${String(c.budgetMs)} (${c.medianMs <= c.budgetMs ? 'met' : 'MISSED'})`} |${roofline ? ` ${c.rooflineMs === undefined ? '— | —' : `${c.rooflineMs.toFixed(3)} | ${(c.medianMs / c.rooflineMs).toFixed(2)}`} |` : ''}`,
  );
  const m = machine();
  const md = [
    `# ${suite}`,
    '',
    description,
    '',
    `Date: ${doc.date} · machine: ${String(m['cpus'])}× ${String(m['cpuModel'])}, ${String(m['memoryGiB'])} GiB, Node ${String(m['node'])}`,
    '',
    `| case | median ms | runs | baseline | ratio (case / baseline) | budget ms |${roofline ? ' roofline ms | ÷ roofline |' : ''}`,
    `| --- | ---: | ---: | --- | ---: | --- |${roofline ? ' ---: | ---: |' : ''}`,
    ...rows,
    '',
    ...notes,
    '',
  ].join('\n');
  writeFileSync(join(RESULTS_DIR, `${suite}.md`), md);
  process.stdout.write(md);
}
