import { StageError } from '@stageml/ir';

/** Process exit codes of the `stageml` command. */
export const ExitCode = {
  /** Success. */
  OK: 0,
  /** An unexpected internal failure (a bug: please report it). */
  INTERNAL: 1,
  /** Bad command-line usage. */
  USAGE: 2,
  /** Invalid input: a file, graph, model or value was rejected with a coded error. */
  INVALID_INPUT: 3,
  /** A file or directory could not be read or written. */
  IO: 4,
} as const;

/** One of `ExitCode`'s values. */
export type ExitCodeValue = (typeof ExitCode)[keyof typeof ExitCode];

/**
 * Exit code for an error code, by the package prefix of the code. Every package's codes are input
 * errors except I/O failures.
 */
export function exitCodeFor(err: unknown): ExitCodeValue {
  if (err instanceof StageError) {
    const code = String(err.code);
    if (code.endsWith('_IO') || code === 'CLI_IO' || code === 'CLI_LISTEN') return ExitCode.IO;
    if (code.startsWith('CLI_USAGE')) return ExitCode.USAGE;
    return ExitCode.INVALID_INPUT;
  }
  return ExitCode.INTERNAL;
}
