import { StageError } from '@stageml/ir';
import { expect } from 'vitest';

/** What `f` throws, or `undefined` when it returns. */
export function thrownBy(f: () => unknown): unknown {
  try {
    f();
  } catch (e) {
    return e;
  }
  return undefined;
}

/**
 * Asserts that `f` throws a coded `StageError` with `code` (tests assert on codes, never on
 * messages) and returns it for further checks (`at`, `hint`).
 */
export function expectCode<C extends string>(f: () => unknown, code: C): StageError<C> {
  const e = thrownBy(f);
  expect(e, `expected a StageError with code ${code}, got ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`).toBeInstanceOf(StageError);
  expect((e as StageError).code).toBe(code);
  return e as StageError<C>;
}
