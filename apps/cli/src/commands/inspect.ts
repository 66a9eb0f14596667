import type { Command } from 'commander';
import { printGraph } from '@stageml/ir';
import { formatSummary, loadGraphFile, summarizeGraph } from '../inspect.js';
import type { CliIo } from '../io.js';

/** `stageml inspect FILE`: verify a graph and print its summary. */
export function registerInspect(program: Command, io: CliIo): void {
  program
    .command('inspect')
    .description('verify a graph (.ir text or .json) and print its summary')
    .argument('<file>', 'graph file')
    .option('--json', 'print the summary as JSON')
    .option('--print', 'also print the graph in text form')
    .action((file: string, opts: { json?: boolean; print?: boolean }) => {
      const g = loadGraphFile(file);
      const summary = summarizeGraph(g);
      if (opts.json === true) io.out(JSON.stringify(summary, null, 2));
      else io.out(formatSummary(summary));
      if (opts.print === true) io.out(printGraph(g));
    });
}
