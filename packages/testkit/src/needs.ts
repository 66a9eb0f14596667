import { describe, it } from 'vitest';

/**
 * A `describe` whose tests need something this machine may lack (Python with torch, a binary):
 * skipped where it is missing, except in CI (`CI` set), where the suite must run — there one test
 * fails with `missing()`, the coded error naming what to install.
 */
export function describeNeeding(name: string, available: boolean, missing: () => Error, fn: () => void): void {
  if (!available && process.env['CI'] !== undefined) {
    describe(name, () => {
      it(`needs what is missing here (${name})`, () => {
        throw missing();
      });
    });
    return;
  }
  describe.skipIf(!available)(name, fn);
}
