// Every op of the native runner against the reference interpreter, on the shared conformance cases
// the tfjs, onnxruntime and torch executors pass. Cases with values of a dtype the runner lacks
// (f64, f16, bf16; i8 outside the int8 factor tables' ops) must be refused at prepare with
// RT_UNSUPPORTED_OP, as must every other op.
import { type Graph, OP_KEYS } from '@stageml/ir';
import { expectMatchesInterpreter } from '@stageml/testkit';
import { describe, expect, test } from 'vitest';

import { CONFORMANCE_CASES } from '../tfjs/conformance/index.js';
import { CPU_NATIVE_OPS, createCpuNativeExecutor } from './index.js';

const RUNS = new Set(['f32', 'i64', 'i32', 'u8', 'bool']);
// i8 values: the int8 factor tables `quantizedLoraBank` reads (and gathers and casts, decomposed).
const I8_OPS = new Set(['quantizedLoraBank', 'gather', 'indexSelect', 'cast', 'reshape']);
const runnable = (g: Graph, key: string): boolean => g.values.every((v) => RUNS.has(v.type.dtype) || (v.type.dtype === 'i8' && I8_OPS.has(key)));

describe('cpu-native matches the interpreter', () => {
  const executor = createCpuNativeExecutor({ threads: 2 });

  test.each([...CPU_NATIVE_OPS])('%s', async (key) => {
    const cases = CONFORMANCE_CASES[key];
    expect(cases.some((c) => runnable(c.graph, key)), 'at least one case runs').toBe(true);
    for (const c of cases) {
      if (runnable(c.graph, key)) await expectMatchesInterpreter(executor, c);
      else await expect(executor.prepare(c.graph, c.weights), c.name).rejects.toMatchObject({ code: 'RT_UNSUPPORTED_OP' });
    }
  });

  test.each(OP_KEYS.filter((k) => !CPU_NATIVE_OPS.includes(k)))('%s is refused at prepare', async (key) => {
    for (const c of CONFORMANCE_CASES[key]) await expect(executor.prepare(c.graph, c.weights), c.name).rejects.toMatchObject({ code: 'RT_UNSUPPORTED_OP' });
  });
});
