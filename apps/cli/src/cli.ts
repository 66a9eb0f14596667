import { Command, CommanderError } from 'commander';
import { StageError } from '@stageml/ir';
import { registerBench } from './commands/bench.js';
import { registerCluster } from './commands/cluster.js';
import { registerDemo } from './commands/demo.js';
import { registerGen } from './commands/gen.js';
import { registerGenerate } from './commands/generate.js';
import { registerInspect } from './commands/inspect.js';
import { registerLower } from './commands/lower.js';
import { registerPlan } from './commands/plan.js';
import { registerRun } from './commands/run.js';
import { registerStage } from './commands/stage.js';
import { registerServe } from './commands/serve.js';
import { ExitCode, exitCodeFor } from './exit-codes.js';
import type { CliIo } from './io.js';

export type { CliIo } from './io.js';

const defaultIo: CliIo = {
  out: (line) => process.stdout.write(`${line}\n`),
  err: (line) => process.stderr.write(`${line}\n`),
};

/** Every command, registered in help order. Each lives in its own module under commands/. */
const COMMANDS: readonly ((program: Command, io: CliIo) => void)[] = [registerInspect, registerRun, registerGenerate, registerServe, registerCluster, registerDemo, registerBench, registerStage, registerLower, registerPlan, registerGen];

function buildProgram(io: CliIo): Command {
  const program = new Command('stageml')
    .description('StageML: staged specialization of ML inference over one typed tensor IR')
    .version('0.1.0')
    .exitOverride()
    .configureOutput({
      writeOut: (s) => {
        io.out(s.trimEnd());
      },
      writeErr: (s) => {
        io.err(s.trimEnd());
      },
    });
  for (const register of COMMANDS) register(program, io);
  return program;
}

/**
 * Runs the `stageml` command with `argv` (without the node and script entries) and returns the
 * exit code; errors are printed as `error[CODE]: message` and mapped to exit codes.
 */
export async function runCli(argv: readonly string[], io: CliIo = defaultIo): Promise<number> {
  const program = buildProgram(io);
  try {
    // vLLM's two-letter short flag, which commander has no form for.
    await program.parseAsync(argv.map((a) => (a === '-tp' ? '--tensor-parallel-size' : a.startsWith('-tp=') ? `--tensor-parallel-size=${a.slice(4)}` : a)), { from: 'user' });
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
    // A system error (errno code) is an I/O failure, not a bug: coded, no stack trace.
    const errno = (e as { code?: unknown; syscall?: unknown } | null)?.code;
    if (e instanceof Error && typeof errno === 'string' && /^E[A-Z0-9]+$/.test(errno)) {
      io.err(`error[CLI_IO]: ${e.message}`);
      return ExitCode.IO;
    }
    const detail = process.env['STAGEML_DEBUG'] === '1' && e instanceof Error ? (e.stack ?? e.message) : e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    io.err(`internal error: ${detail}`);
    if (process.env['STAGEML_DEBUG'] !== '1') io.err('  hint: set STAGEML_DEBUG=1 for a stack trace, and please report it');
    return ExitCode.INTERNAL;
  }
}
