import type { Command } from 'commander';
import { type Graph, printGraph } from '@stageml/ir';
import { type RewriteResult, defaultRules, loraServingSpec, rewriteGreedy } from '@stageml/rewrite';
import { parseNonNegativeInt, parsePositiveInt } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import { formatSummary, loadGraphFile, summarizeGraph } from '../inspect.js';
import type { CliIo } from '../io.js';

/** Options of `stageml inspect`. */
interface InspectOptions {
  json?: boolean;
  print?: boolean;
  rewrite?: boolean;
  cutoff?: string;
  batch?: number;
  seq?: number;
  budget?: number;
}

/** `stageml inspect FILE`: verify a graph and print its summary (or, with `--rewrite`, rewrite it first). */
export function registerInspect(program: Command, io: CliIo): void {
  program
    .command('inspect')
    .description('verify a graph (.ir text or .json) and print its summary')
    .argument('<file>', 'graph file')
    .option('--json', 'print the summary (or the rewrite report) as JSON')
    .option('--print', 'also print the graph in text form')
    .option('--rewrite', 'rewrite the graph with the full rule library (cost-checked) and print the result and the rewrite log')
    .option('--cutoff <stage>', 'with --rewrite: the last stage computed ahead of time, on base < adapter < tenant < request < routing < token (default adapter)')
    .option('--batch <n>', 'with --rewrite: batch size per request, for the cost model (default 1)', parsePositiveInt)
    .option('--seq <n>', 'with --rewrite: sequence length per request, for the cost model (default 1)', parsePositiveInt)
    .option('--budget <bytes>', 'with --rewrite: most bytes the residual constant table may hold (default unlimited)', parseNonNegativeInt)
    .action((file: string, opts: InspectOptions) => {
      const g = loadGraphFile(file);
      if (opts.rewrite === true) {
        inspectRewrite(g, opts, io);
        return;
      }
      const stray = (['cutoff', 'batch', 'seq', 'budget'] as const).filter((k) => opts[k] !== undefined);
      if (stray.length > 0) throw new CliError(CliCode.USAGE, `--${stray.join(', --')} only apply with --rewrite`);
      const summary = summarizeGraph(g);
      if (opts.json === true) io.out(JSON.stringify(summary, null, 2));
      else io.out(formatSummary(summary));
      if (opts.print === true) io.out(printGraph(g));
    });
}

/**
 * `inspect --rewrite`: annotates the graph for LoRA serving (parameters named `*lora*` at
 * `adapter`, other parameters at `base`, inputs at `token`), rewrites it to a fixpoint with the
 * full rule library at the given cutoff, sizes and budget, and prints the rewritten graph and the
 * log of every rewrite (rule, node, before → after).
 */
function inspectRewrite(g: Graph, opts: InspectOptions, io: CliIo): void {
  const cutoff = opts.cutoff ?? 'adapter';
  const sizes = { batch: opts.batch ?? 1, seq: opts.seq ?? 1 };
  const r = rewriteGreedy(g, [defaultRules], {
    context: {
      lattice: 'serving',
      annotations: loraServingSpec(g),
      cutoff,
      sizes,
      ...(opts.budget === undefined ? {} : { memoryBudget: opts.budget }),
    },
  });
  const text = printGraph(r.graph);
  if (opts.json === true) {
    io.out(JSON.stringify({ graph: r.graph.name, cutoff, sizes, stop: r.stop, iterations: r.iterations, applied: r.applied, estimate: r.estimate, log: r.log, text }, null, 2));
    return;
  }
  io.out(formatRewrite(r, cutoff, sizes));
  io.out(text.trimEnd());
}

const seconds = (s: number): string => (s === 0 ? '0 s' : s < 1e-6 ? `${(s * 1e9).toPrecision(3)} ns` : s < 1e-3 ? `${(s * 1e6).toPrecision(3)} µs` : `${(s * 1e3).toPrecision(3)} ms`);

/** Human-readable rewrite report: totals, per-rule counts and the log (before → after). */
function formatRewrite(r: RewriteResult, cutoff: string, sizes: { batch: number; seq: number }): string {
  const { before, after } = r.estimate;
  const fired = Object.entries(r.applied).filter(([, n]) => n > 0);
  const lines = [
    `rewrite @${r.graph.name}: ${String(r.log.length)} rewrite(s), ${r.stop} after ${String(r.iterations)} sweep(s) (cutoff ${cutoff}, batch ${String(sizes.batch)}, seq ${String(sizes.seq)})`,
    `  per request: ${seconds(before.seconds)} → ${seconds(after.seconds)}; constants: ${String(before.constantBytes)} → ${String(after.constantBytes)} bytes`,
    `  applied: ${fired.length === 0 ? '(none)' : fired.map(([k, n]) => `${k} ${String(n)}`).join(', ')}`,
  ];
  r.log.forEach((e, i) => {
    lines.push(`  [${String(i + 1)}] ${e.rule} at %${e.node}`);
    for (const l of e.before.split('\n')) lines.push(`      - ${l}`);
    for (const l of e.after.split('\n')) lines.push(`      + ${l}`);
  });
  return lines.join('\n');
}
