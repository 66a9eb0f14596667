import { type Executor, EXECUTOR_ENV, EXECUTOR_NAMES as RUNTIME_EXECUTORS, RuntimeCode, RuntimeError, isExecutorName, selectExecutor } from '@stageml/runtime';

/** Executor names `--executor` accepts: `auto` (the fastest available here, measured once) and each runtime executor. */
export const EXECUTOR_NAMES = ['auto', ...RUNTIME_EXECUTORS] as const;

/** One of `EXECUTOR_NAMES`. */
export type CliExecutorName = (typeof EXECUTOR_NAMES)[number];

/**
 * The executor used when `--executor` is absent and `STAGEML_EXECUTOR` is unset: the reference
 * interpreter (exact), which the `run`/`generate` help texts document.
 */
export const DEFAULT_EXECUTOR: CliExecutorName = 'interpreter';

/** Options of `resolveExecutor`. */
export interface ResolveExecutorOptions {
  /** Receives the line saying which executor `auto` chose and why. */
  readonly log?: ((line: string) => void) | undefined;
}

/**
 * Resolves an `--executor` name: `auto` measures the available executors once (`selectExecutor`,
 * remembered in memory and in a file under the temp directory), a concrete name creates that
 * executor, and no name means `STAGEML_EXECUTOR` if set, else `DEFAULT_EXECUTOR`. Unknown names,
 * and executors that do not load here, are `RT_BACKEND_UNAVAILABLE`.
 */
export async function resolveExecutor(name: string | undefined, opts: ResolveExecutorOptions = {}): Promise<Executor> {
  const env = process.env[EXECUTOR_ENV];
  const wanted = name ?? (env === undefined || env === '' ? DEFAULT_EXECUTOR : env);
  if (wanted !== 'auto' && !isExecutorName(wanted)) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `unknown executor '${wanted}' (available: ${EXECUTOR_NAMES.join(', ')})`);
  }
  const selection = await selectExecutor({ force: wanted, ...(opts.log === undefined ? {} : { log: opts.log }) });
  return selection.executor;
}
