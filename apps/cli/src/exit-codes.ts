import { classifyError } from '@stageml/ir';

/** Process exit codes of the `stageml` command (the error classes' codes are declared in `@stageml/ir`'s `ERROR_CLASSES`). */
export const ExitCode = {
  /** Success. */
  OK: 0,
  /** An unexpected internal failure (a bug: please report it): error class `internal`. */
  INTERNAL: 1,
  /** Bad command-line usage (`CLI_USAGE`). */
  USAGE: 2,
  /** Invalid input: a file, graph, model or value was rejected (error class `input`). */
  INVALID_INPUT: 3,
  /** A file or directory could not be read or written (error class `io`). */
  IO: 4,
  /** A resource or capability is missing or busy: a backend, a tool (error class `unavailable`). */
  UNAVAILABLE: 5,
} as const;

/** One of `ExitCode`'s values. */
export type ExitCodeValue = (typeof ExitCode)[keyof typeof ExitCode];

/**
 * Exit code for a thrown value, derived from the class its package registered the code with
 * (`registerErrorCodes` in `@stageml/ir`); uncoded errors are internal.
 */
export function exitCodeFor(err: unknown): ExitCodeValue {
  return classifyError(err).exitCode as ExitCodeValue;
}
