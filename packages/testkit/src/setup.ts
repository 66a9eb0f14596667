import fc from 'fast-check';
import { expect } from 'vitest';

import { toBeAllclose } from './allclose.js';

// One place sets property-test effort: CI and local runs use STAGEML_FC_RUNS (default 100), and
// every failure prints its seed and path so it can be replayed with `fc.assert(…, { seed, path })`.
const runs = Number(process.env['STAGEML_FC_RUNS'] ?? '100');
fc.configureGlobal({ numRuns: Number.isFinite(runs) && runs > 0 ? runs : 100, verbose: fc.VerbosityLevel.Verbose });

// `expect(actual).toBeAllclose(expected, { rtol, atol })`; its types are declared in allclose.ts.
expect.extend({ toBeAllclose });
