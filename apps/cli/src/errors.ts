import { StageError, registerErrorCodes } from '@stageml/ir';

/** Error codes of the `stageml` command itself. */
export const CliCode = registerErrorCodes({
  /** A file could not be read or written. */
  IO: 'CLI_IO',
  /** A flag or argument is invalid. */
  USAGE: 'CLI_USAGE',
  /** `stageml cluster` needs HAProxy 2.6+ and cannot run it (the hint says how to install it). */
  HAPROXY_MISSING: 'CLI_HAPROXY_MISSING',
  /** A `stageml cluster` replica or HAProxy failed to start, or the cluster stopped unasked. */
  CLUSTER_FAILED: 'CLI_CLUSTER_FAILED',
  /**
   * A `stageml cluster` replica went away while it streamed an answer: the cluster's stream guard
   * ended the client's stream with an error event carrying this code (or answered 502 when no
   * replica answered at all).
   */
  REPLICA_LOST: 'CLI_REPLICA_LOST',
  /** The server cannot listen on the address (in use, not available, permission). */
  LISTEN: 'CLI_LISTEN',
  /** The demo's self-check failed (a bug: the IR text round trip was not exact). */
  DEMO: 'CLI_DEMO',
}, {
  // Error classes (input / io / unavailable / internal): the CLI exit code and HTTP status derive from them.
  IO: 'io',
  USAGE: { class: 'input', exitCode: 2 },
  DEMO: 'internal',
  HAPROXY_MISSING: 'unavailable',
  CLUSTER_FAILED: 'internal',
  REPLICA_LOST: 'unavailable',
  LISTEN: 'io',
});

/** Union of CLI error codes. */
export type CliErrorCode = (typeof CliCode)[keyof typeof CliCode];

/** An error raised by the CLI (I/O and usage). */
export class CliError extends StageError<CliErrorCode> {}
