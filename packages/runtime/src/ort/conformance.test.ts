import { OP_KEYS } from '@stageml/ir';
import { ONNX_RULES, type OnnxRuleTable } from '@stageml/onnx-lower';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { beforeAll, describe, expect, test } from 'vitest';

import type { Executor } from '../executor.js';
import { CONFORMANCE_CASES } from '../tfjs/conformance/index.js';
import { createOrtExecutor } from './index.js';

describe('onnxruntime matches the interpreter', () => {
  let executor: Executor;
  beforeAll(async () => {
    executor = await createOrtExecutor({ intraOpNumThreads: 1 });
  });

  test('every op of the registry has an ONNX lowering (no unsupported entries)', () => {
    const rules: OnnxRuleTable = ONNX_RULES;
    expect(OP_KEYS.filter((k) => rules[k].kind === 'unsupported')).toEqual([]);
  });

  test.each([...OP_KEYS])('%s', async (key) => {
    for (const c of CONFORMANCE_CASES[key]) await expectMatchesInterpreter(executor, c);
  });
});
