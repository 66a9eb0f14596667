import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of the `stageml` command itself. */
export const CliCode = registerErrorCodes({
  /** A file could not be read or written. */
  IO: 'CLI_IO',
  /** A flag or argument is invalid. */
  USAGE: 'CLI_USAGE',
  /** The demo's self-check failed (a bug: the IR text round trip was not exact). */
  DEMO: 'CLI_DEMO',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  IO: 'io',
  USAGE: { class: 'input', exitCode: 2 },
  DEMO: 'internal',
});

/** Union of CLI error codes. */
export type CliErrorCode = (typeof CliCode)[keyof typeof CliCode];

/** An error raised by the CLI (I/O and usage). */
export class CliError extends StageError<CliErrorCode> {}
