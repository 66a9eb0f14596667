import * as tf from '@tensorflow/tfjs-core';
import { type Graph, GraphBuilder, type HostTensor, StageError, hostTensor, interpret } from '@stageml/ir';
import { afterEach, describe, expect, test, vi } from 'vitest';

import { RuntimeCode } from '../errors.js';
import type { PreparedGraph } from '../executor.js';
import { TFJS_RULES, type TfRuleTable, availableTfjsBackends, createTfjsExecutor, unsupported } from './index.js';

/** Awaits `p`, expecting a rejection with a coded error; returns it for further checks. */
async function rejection(p: Promise<unknown>, code: string): Promise<StageError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e, `expected a StageError with code ${code}, got ${String(e)}`).toBeInstanceOf(StageError);
  expect((e as StageError).code).toBe(code);
  return e as StageError;
}

/** y = (x + w) · 2, z = x[idx]: a tiny graph with an input, a parameter, a constant and an index operand. */
function tinyGraph(): Graph {
  const b = new GraphBuilder('tiny');
  const x = b.input('x', ['f32', [4]]);
  const idx = b.input('idx', ['i32', [2]]);
  const w = b.param('w', ['f32', [4]]);
  b.output('y', b.mul(b.add(x, w), b.scalar(2)));
  b.output('z', b.gather(x, idx));
  return b.build();
}

const WEIGHTS = { w: hostTensor('f32', [4], [1, 2, 3, 4]) };
const INPUTS = { x: hostTensor('f32', [4], [0.5, -1, 2, 8]), idx: hostTensor('i32', [2], [3, 0]) };

afterEach(() => {
  vi.unstubAllEnvs();
});

describe('createTfjsExecutor', () => {
  test('forcing a node backend that is not installed is RT_BACKEND_UNAVAILABLE naming it', async () => {
    const e = await rejection(createTfjsExecutor({ backend: 'node' }), RuntimeCode.BACKEND_UNAVAILABLE);
    expect(e.message).toContain("'node'");
    await rejection(createTfjsExecutor({ backend: 'node-gpu' }), RuntimeCode.BACKEND_UNAVAILABLE);
  });

  test('an unknown backend name is RT_BACKEND_UNAVAILABLE, by option or by STAGEML_BACKEND', async () => {
    await rejection(createTfjsExecutor({ backend: 'tpu' as never }), RuntimeCode.BACKEND_UNAVAILABLE);
    vi.stubEnv('STAGEML_BACKEND', 'bogus');
    await rejection(createTfjsExecutor(), RuntimeCode.BACKEND_UNAVAILABLE);
  });

  test('takes the backend from STAGEML_BACKEND (with or without the tfjs- prefix); the option wins', async () => {
    vi.stubEnv('STAGEML_BACKEND', 'tfjs-cpu');
    expect((await createTfjsExecutor()).name).toBe('tfjs-cpu');
    vi.stubEnv('STAGEML_BACKEND', 'wasm');
    expect((await createTfjsExecutor()).name).toBe('tfjs-wasm');
    expect((await createTfjsExecutor({ backend: 'cpu' })).name).toBe('tfjs-cpu');
  });

  test('without a request picks the fastest backend that loads (wasm where no node binding is installed)', async () => {
    vi.stubEnv('STAGEML_BACKEND', '');
    const available = await availableTfjsBackends();
    expect(available).toEqual(expect.arrayContaining(['wasm', 'cpu']));
    expect((await createTfjsExecutor()).name).toBe(`tfjs-${available[0]!}`);
  });

  test('rejects a non-positive thread count with RT_BAD_VALUE', async () => {
    await rejection(createTfjsExecutor({ backend: 'cpu', threads: 0 }), RuntimeCode.BAD_VALUE);
  });
});

describe('prepare', () => {
  test('an op the rules mark unsupported is RT_UNSUPPORTED_OP naming the op, the executor and the node', async () => {
    const rules: TfRuleTable = { ...TFJS_RULES, gather: unsupported('for this test') };
    const executor = await createTfjsExecutor({ backend: 'cpu', rules });
    const e = await rejection(executor.prepare(tinyGraph(), WEIGHTS), RuntimeCode.UNSUPPORTED_OP);
    expect(e.message).toContain('sml.gather');
    expect(e.message).toContain('tfjs-cpu');
    expect(e.at?.node).toBe(tinyGraph().nodes.findIndex((n) => n.kind === 'op' && n.op === 'gather'));
  });

  test('a missing parameter is RT_MISSING_WEIGHT', async () => {
    const executor = await createTfjsExecutor({ backend: 'cpu' });
    await rejection(executor.prepare(tinyGraph(), {}), RuntimeCode.MISSING_WEIGHT);
  });

  test('snapshots parameter data: later changes to the caller’s arrays do not leak in', async () => {
    const executor = await createTfjsExecutor({ backend: 'cpu' });
    const w = hostTensor('f32', [4], [1, 2, 3, 4]);
    const prepared = await executor.prepare(tinyGraph(), { w });
    (w.data as Float32Array).fill(100);
    expect(Array.from((await prepared.run(INPUTS))['y']!.data)).toEqual([3, 2, 10, 24]);
    prepared.dispose();
  });
});

describe.each(['cpu', 'wasm'] as const)('run on tfjs-%s', (backend) => {
  async function prepared(graph: Graph = tinyGraph()): Promise<PreparedGraph> {
    return (await createTfjsExecutor({ backend })).prepare(graph, WEIGHTS);
  }

  test('names the executor and matches the interpreter', async () => {
    const p = await prepared();
    expect(p.executor).toBe(`tfjs-${backend}`);
    const got = await p.run(INPUTS);
    const want = interpret(tinyGraph(), { inputs: INPUTS, weights: WEIGHTS });
    expect(got['y']).toBeAllclose(want['y']!);
    expect(got['z']).toBeAllclose(want['z']!);
    p.dispose();
  });

  test('checks inputs: missing, unknown, mistyped and misshapen', async () => {
    const p = await prepared();
    await rejection(p.run({ x: INPUTS.x }), RuntimeCode.MISSING_INPUT);
    await rejection(p.run({ ...INPUTS, extra: INPUTS.x }), RuntimeCode.UNKNOWN_INPUT);
    await rejection(p.run({ ...INPUTS, x: hostTensor('f64', [4], [1, 2, 3, 4]) }), RuntimeCode.BAD_VALUE);
    await rejection(p.run({ ...INPUTS, x: hostTensor('f32', [5], [1, 2, 3, 4, 5]) }), RuntimeCode.BAD_VALUE);
    p.dispose();
  });

  test('a failing kernel is RT_EVAL_FAILED pointing at the node, and leaks nothing', async () => {
    const p = await prepared();
    await p.run(INPUTS);
    const before = tf.memory().numTensors;
    const e = await rejection(p.run({ ...INPUTS, idx: hostTensor('i32', [2], [7, 0]) }), RuntimeCode.EVAL_FAILED);
    expect(e.message).toContain('sml.gather');
    expect(e.at?.value).toBe('gather');
    expect(tf.memory().numTensors).toBe(before);
    p.dispose();
  });

  test('an out-of-range expert group fails the run with RT_EVAL_FAILED', async () => {
    const b = new GraphBuilder('moe');
    const x = b.input('x', ['f32', [2, 3]]);
    const g = b.input('g', ['i32', [2]]);
    b.output('y', b.op('groupedMatmul', [x, b.param('w', ['f32', [2, 3, 4]]), g]));
    const p = await (await createTfjsExecutor({ backend })).prepare(b.build(), { w: hostTensor('f32', [2, 3, 4], new Array<number>(24).fill(1)) });
    const x0 = hostTensor('f32', [2, 3], [1, 2, 3, 4, 5, 6]);
    expect(Array.from((await p.run({ x: x0, g: hostTensor('i32', [2], [1, 0]) }))['y']!.data)).toEqual([6, 6, 6, 6, 15, 15, 15, 15]);
    const e = await rejection(p.run({ x: x0, g: hostTensor('i32', [2], [0, 2]) }), RuntimeCode.EVAL_FAILED);
    expect(e.message).toContain('sml.grouped_matmul');
    p.dispose();
  });

  test('rejects runs after dispose with RT_DISPOSED and frees its tensors', async () => {
    const baseline = tf.memory().numTensors;
    const p = await prepared();
    await p.run(INPUTS);
    expect(tf.memory().numTensors).toBeGreaterThan(baseline);
    p.dispose();
    expect(tf.memory().numTensors).toBe(baseline);
    await rejection(p.run(INPUTS), RuntimeCode.DISPOSED);
  });

  test('device memory does not grow over 10,000 runs', async () => {
    const p = await prepared();
    const inputs: Record<string, HostTensor> = INPUTS;
    await p.run(inputs);
    const { numTensors, numBytes } = tf.memory();
    for (let i = 0; i < 10_000; i++) await p.run(inputs);
    expect(tf.memory().numTensors).toBe(numTensors);
    expect(tf.memory().numBytes).toBe(numBytes);
    p.dispose();
  });

  test('memory stays flat with per-run kernels (symbolic attributes) and resident outputs', async () => {
    const b = new GraphBuilder('symbolic');
    const x = b.input('x', ['f16', ['n', 2]]);
    const w = b.param('w', ['f32', [4]]);
    b.output('pos', b.add(b.cast(x, 'f32'), b.iota(['n', 2], 0, 'f32')));
    b.output('flat', b.reshape(x, [-1]));
    b.output('w', w);
    b.output('k', b.constant([1, 2], 'i8', [2]));
    const p = await (await createTfjsExecutor({ backend })).prepare(b.build(), WEIGHTS);
    const run = (n: number): Promise<Record<string, HostTensor>> => p.run({ x: hostTensor('f16', [n, 2], new Array<number>(2 * n).fill(0.1)) });
    await run(3);
    const { numTensors, numBytes } = tf.memory();
    for (let i = 0; i < 200; i++) await run(1 + (i % 5));
    expect(tf.memory().numTensors).toBe(numTensors);
    expect(tf.memory().numBytes).toBe(numBytes);
    const out = await run(2);
    expect(Array.from(out['pos']!.data)).toEqual([0.0999755859375, 0.0999755859375, 1.0999755859375, 1.0999755859375]);
    expect(out['w']).toBeAllclose(WEIGHTS.w);
    expect(Array.from(out['k']!.data)).toEqual([1, 2]);
    p.dispose();
  });
});

describe('backend switching', () => {
  test('graphs prepared on cpu and wasm each run on their own backend, interleaved and concurrently', async () => {
    const onCpu = await (await createTfjsExecutor({ backend: 'cpu' })).prepare(tinyGraph(), WEIGHTS);
    const onWasm = await (await createTfjsExecutor({ backend: 'wasm' })).prepare(tinyGraph(), WEIGHTS);
    const want = interpret(tinyGraph(), { inputs: INPUTS, weights: WEIGHTS });
    await onWasm.run(INPUTS);
    expect(tf.getBackend()).toBe('wasm');
    await onCpu.run(INPUTS);
    expect(tf.getBackend()).toBe('cpu');
    // Someone else switches the global engine; the wasm graph switches back for its run.
    await tf.setBackend('cpu');
    expect((await onWasm.run(INPUTS))['y']).toBeAllclose(want['y']!);
    expect(tf.getBackend()).toBe('wasm');
    const runs = Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? onCpu : onWasm).run(INPUTS));
    for (const r of await Promise.all(runs)) expect(r['y']).toBeAllclose(want['y']!);
    onCpu.dispose();
    onWasm.dispose();
  });
});
