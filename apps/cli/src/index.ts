/**
 * @packageDocumentation
 * `@stageml/cli`: the `stageml` command. `runCli(argv)` runs it in-process (tests use this);
 * `bin.ts` is the executable. Errors print as `error[CODE]: message` and map to exit codes
 * (`ExitCode`).
 */
export { runCli } from './cli.js';
export type { CliIo } from './cli.js';
export { ExitCode, exitCodeFor } from './exit-codes.js';
export type { ExitCodeValue } from './exit-codes.js';
export { CliCode, CliError } from './errors.js';
export type { CliErrorCode } from './errors.js';
export { formatSummary, loadGraphFile, summarizeGraph } from './inspect.js';
export type { GraphSummary } from './inspect.js';
export { runDemo } from './demo.js';
export type { DemoReport } from './demo.js';
