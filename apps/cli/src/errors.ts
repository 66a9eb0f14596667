import { StageError } from '@stageml/ir';

/** Error codes of the `stageml` command itself. */
export const CliCode = {
  /** A file could not be read or written. */
  IO: 'CLI_IO',
  /** A flag or argument is invalid. */
  USAGE: 'CLI_USAGE',
  /** The server cannot listen on the address (in use, not available, permission). */
  LISTEN: 'CLI_LISTEN',
} as const;

/** Union of CLI error codes. */
export type CliErrorCode = (typeof CliCode)[keyof typeof CliCode];

/** An error raised by the CLI (I/O and usage). */
export class CliError extends StageError<CliErrorCode> {}
