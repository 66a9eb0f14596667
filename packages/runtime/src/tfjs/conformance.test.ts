import { type DType, OP_KEYS } from '@stageml/ir';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { beforeAll, describe, expect, test } from 'vitest';

import type { Executor } from '../executor.js';
import { CONFORMANCE_CASES } from './conformance/index.js';
import { TFJS_RULES, type TfRuleTable, createTfjsExecutor } from './index.js';

// Tolerances: the case's override, else the dtype's default (f16/bf16 a few of their ulps, since the
// device computes in f32 and rounds each result while the interpreter computes in f64). f64 runs in
// f32 on tfjs, so its outputs get the f32 tolerance.
const TFJS_TOLERANCE = { toleranceDType: (d: DType): DType => (d === 'f64' ? 'f32' : d) };

describe('conformance cases', () => {
  test('cover every op of the registry', () => {
    expect(Object.keys(CONFORMANCE_CASES).sort()).toEqual([...OP_KEYS].sort());
    for (const k of OP_KEYS) expect(CONFORMANCE_CASES[k].length, k).toBeGreaterThan(0);
  });

  test('every op has a tfjs lowering (no unsupported entries)', () => {
    const rules: TfRuleTable = TFJS_RULES;
    expect(OP_KEYS.filter((k) => rules[k].kind === 'unsupported')).toEqual([]);
  });
});

describe.each(['cpu', 'wasm'] as const)('tfjs-%s matches the interpreter', (backend) => {
  let executor: Executor;
  beforeAll(async () => {
    executor = await createTfjsExecutor({ backend });
  });

  test.each([...OP_KEYS])('%s', async (key) => {
    for (const c of CONFORMANCE_CASES[key]) await expectMatchesInterpreter(executor, c, TFJS_TOLERANCE);
  });
});
