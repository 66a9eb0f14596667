import { Command, CommanderError } from 'commander';
import { StageError, printGraph } from '@stageml/ir';
import { runDemo } from './demo.js';
import { ExitCode, exitCodeFor } from './exit-codes.js';
import { formatSummary, loadGraphFile, summarizeGraph } from './inspect.js';

/** Where the CLI writes; tests capture it. */
export interface CliIo {
  readonly out: (line: string) => void;
  readonly err: (line: string) => void;
}

const defaultIo: CliIo = {
  out: (line) => process.stdout.write(`${line}\n`),
  err: (line) => process.stderr.write(`${line}\n`),
};

function buildProgram(io: CliIo): Command {
  const program = new Command('stageml')
    .description('StageML: staged specialization of ML inference over one typed tensor IR')
    .version('0.1.0')
    .exitOverride()
    .configureOutput({ writeOut: (s) => { io.out(s.trimEnd()); }, writeErr: (s) => { io.err(s.trimEnd()); } });

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

  program
    .command('demo')
    .description('build a Llama-7B-shaped graph, verify, print and re-parse it')
    .option('--json', 'print timings as JSON')
    .action((opts: { json?: boolean }) => {
      const report = runDemo(opts.json === true ? () => undefined : io.out);
      if (opts.json === true) io.out(JSON.stringify(report));
      if (!report.roundTrip) throw new StageError('CLI_DEMO', 'the text round trip was not exact');
    });
  return program;
}

/**
 * Runs the `stageml` command with `argv` (without the node and script entries) and returns the
 * exit code; errors are printed as `error[CODE]: message` and mapped to exit codes.
 */
export async function runCli(argv: readonly string[], io: CliIo = defaultIo): Promise<number> {
  const program = buildProgram(io);
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return ExitCode.OK;
  } catch (e) {
    if (e instanceof CommanderError) {
      return e.exitCode === 0 ? ExitCode.OK : ExitCode.USAGE;
    }
    if (e instanceof StageError) {
      io.err(`error[${String(e.code)}]: ${e.message}`);
      if (e.hint !== undefined) io.err(`  hint: ${e.hint}`);
      return exitCodeFor(e);
    }
    io.err(`internal error: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    return ExitCode.INTERNAL;
  }
}
