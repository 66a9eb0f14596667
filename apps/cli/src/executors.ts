import { type Executor, RuntimeCode, RuntimeError, interpreterExecutor } from '@stageml/runtime';

/** Executor names the CLI accepts. */
export const EXECUTOR_NAMES = ['interpreter'] as const;

/** Resolves an `--executor` name; unknown names are `RT_BACKEND_UNAVAILABLE`. */
export function resolveExecutor(name: string | undefined): Promise<Executor> {
  if (name === undefined || name === 'interpreter') return Promise.resolve(interpreterExecutor);
  return Promise.reject(new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `unknown executor '${name}' (available: ${EXECUTOR_NAMES.join(', ')})`));
}
