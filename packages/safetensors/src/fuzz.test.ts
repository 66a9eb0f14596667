import { describe, expect, it } from 'vitest';

import { checkFile, checkFileLazy, fuzzInput, runFuzz } from './fuzz.js';

describe('reader fuzzing', () => {
  it('2000 seeded mutations each end in a coded error or reference-exact reads', () => {
    const report = runFuzz({ seed: 1, iterations: 2000, caseLimitMs: 500 });
    expect(report.failures).toEqual([]);
    expect(report.outcomes['ok']).toBeGreaterThan(100);
    const codes = Object.keys(report.outcomes).filter((k) => k.startsWith('ST_'));
    expect(codes).toEqual(
      expect.arrayContaining(['ST_BAD_JSON', 'ST_DUPLICATE_KEY', 'ST_BAD_HEADER', 'ST_BAD_DTYPE', 'ST_OFFSETS', 'ST_OVERLAP', 'ST_GAP', 'ST_SIZE_MISMATCH', 'ST_TRUNCATED', 'ST_HEADER_TOO_LARGE', 'ST_BAD_METADATA']),
    );
  });

  it('the lazy reader agrees with the in-memory reader on every mutated file', async () => {
    for (let i = 0; i < 300; i++) {
      const { file } = fuzzInput(7, i);
      const lazy = await checkFileLazy(file);
      const sync = checkFile(file);
      if (lazy !== sync) expect.fail(`case ${String(i)}: lazy ${lazy}, in-memory ${sync}`);
    }
  });
});
