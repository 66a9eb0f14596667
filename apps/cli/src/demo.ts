import { parseGraph, printGraph, stripSpans, verifyGraph } from '@stageml/ir';
import { LLAMA_7B_GQA_SHAPE, buildLlamaGraph } from '@stageml/models';
import { formatSummary, summarizeGraph } from './inspect.js';

/** Result of the demo: the timings of each step, in milliseconds. */
export interface DemoReport {
  readonly buildMs: number;
  readonly verifyMs: number;
  readonly printMs: number;
  readonly parseMs: number;
  readonly roundTrip: boolean;
  readonly textBytes: number;
}

/**
 * The main job until the server exists: builds a Llama-7B-shaped decoder graph (shapes only),
 * verifies it, prints it, parses the text back and checks the round trip is exact.
 */
export function runDemo(log: (line: string) => void): DemoReport {
  const t0 = performance.now();
  const g = buildLlamaGraph(LLAMA_7B_GQA_SHAPE, { name: 'llama_7b_gqa' });
  const t1 = performance.now();
  verifyGraph(g);
  const t2 = performance.now();
  const text = printGraph(g);
  const t3 = performance.now();
  const back = stripSpans(parseGraph(text));
  const t4 = performance.now();
  const roundTrip = JSON.stringify(back) === JSON.stringify(g);
  log(formatSummary(summarizeGraph(g)));
  log('');
  log('first lines of the text form:');
  for (const line of text.split('\n').slice(0, 12)) log(`  ${line}`);
  log('  …');
  const report: DemoReport = {
    buildMs: t1 - t0,
    verifyMs: t2 - t1,
    printMs: t3 - t2,
    parseMs: t4 - t3,
    roundTrip,
    textBytes: text.length,
  };
  log('');
  log(
    `build ${report.buildMs.toFixed(1)} ms · verify ${report.verifyMs.toFixed(1)} ms · print ${report.printMs.toFixed(1)} ms (${String(report.textBytes)} bytes) · parse ${report.parseMs.toFixed(1)} ms · round trip ${roundTrip ? 'exact' : 'DIFFERS'}`,
  );
  return report;
}
