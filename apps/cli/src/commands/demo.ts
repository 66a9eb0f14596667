import type { Command } from 'commander';
import { runDemo } from '../demo.js';
import { CliCode, CliError } from '../errors.js';
import type { CliIo } from '../io.js';

/** `stageml demo`: build, verify, print and re-parse a Llama-7B-shaped graph. */
export function registerDemo(program: Command, io: CliIo): void {
  program
    .command('demo')
    .description('build a Llama-7B-shaped graph, verify, print and re-parse it')
    .option('--json', 'print timings as JSON')
    .action((opts: { json?: boolean }) => {
      const report = runDemo(opts.json === true ? () => undefined : io.out);
      if (opts.json === true) io.out(JSON.stringify(report));
      if (!report.roundTrip) throw new CliError(CliCode.DEMO, 'the text round trip was not exact');
    });
}
