// Structural checks of the family features of buildLlamaGraph on random weights: a decoder with every
// feature at once (fused projections, partial rotary, q/k norms, sandwich (1 + w) norms, GELU-tanh,
// scaled embeddings, attention scale, per-layer windows, soft-capping, two rope bases, longrope)
// decodes with a KV cache exactly as its full forward, longrope picks its tables by the last
// position, and cpu-native and onnxruntime agree with the interpreter.
import { type Graph, type HostTensor, graphParams, hostTensor, seededRandom } from '@stageml/ir';
import { type Executor, createCpuNativeExecutor, createOrtExecutor, interpreterExecutor } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { type LlamaGraphOptions, type LlamaShape, type RotaryTables, buildLlamaGraph, ropeInvFreq } from './index.js';
import { maxAbsDiff } from './test-support.js';

const SHAPE: LlamaShape = {
  vocabSize: 50, hiddenSize: 32, intermediateSize: 40, numLayers: 3, numHeads: 4, numKvHeads: 2, headDim: 12, rmsNormEps: 1e-6,
  fusedQkv: true, fusedGateUp: true, rotaryDim: 8, qkNorm: 'head', normLayout: 'sandwich', normOffset: true, hiddenAct: 'gelu_tanh',
  embedScale: Math.fround(Math.sqrt(32)), attentionScale: 0.2, attnSoftcap: 4, finalSoftcap: 6, layerWindows: [3, null, 5], tieWordEmbeddings: true,
};
const ROTARY: RotaryTables = { invFreq: ropeInvFreq(8, 10000), localInvFreq: ropeInvFreq(8, 100), scale: 1.1 };

function weights(g: Graph): Record<string, HostTensor> {
  const rand = seededRandom(7);
  const out: Record<string, HostTensor> = {};
  for (const p of graphParams(g)) {
    const shape = g.values[p.results[0]!]!.type.shape as number[];
    const n = shape.reduce((a, b) => a * b, 1);
    out[p.name] = hostTensor('f32', shape, Float32Array.from({ length: n }, () => (rand() * 2 - 1) * (shape.length === 1 ? 0.3 : 1 / Math.sqrt(shape.at(-1)!))));
  }
  return out;
}

async function run(exec: Executor, g: Graph, w: Record<string, HostTensor>, inputs: Record<string, HostTensor>): Promise<Record<string, HostTensor>> {
  const prepared = await exec.prepare(g, w);
  try {
    return await prepared.run(inputs);
  } finally {
    prepared.dispose();
  }
}

const ids = [3, 17, 9, 44, 2, 31, 8, 12, 5];
const seqInputs = (tokens: readonly number[], start: number) => ({
  input_ids: hostTensor('i64', [1, tokens.length], tokens),
  position_ids: hostTensor('i64', [1, tokens.length], tokens.map((_, i) => start + i)),
});

describe('buildLlamaGraph family features', () => {
  const opts: LlamaGraphOptions = { rotary: ROTARY, windowLimit: 64 };
  const full = buildLlamaGraph(SHAPE, opts);
  const cached = buildLlamaGraph(SHAPE, { ...opts, kvCache: true });
  const w = weights(full);

  it('decoding token by token with a KV cache equals the full forward (windows, soft-capping, two rope bases)', async () => {
    const want = (await run(interpreterExecutor, full, w, seqInputs(ids, 0)))['logits']!;
    const V = SHAPE.vocabSize;
    let past: Record<string, HostTensor> = {};
    for (let l = 0; l < SHAPE.numLayers; l++) {
      past[`past_key.${String(l)}`] = hostTensor('f32', [1, 2, 0, 12], []);
      past[`past_value.${String(l)}`] = hostTensor('f32', [1, 2, 0, 12], []);
    }
    // a prefill of 4 tokens, then one token at a time
    const steps = [ids.slice(0, 4), ...ids.slice(4).map((t) => [t])];
    let at = 0;
    for (const step of steps) {
      const out = await run(interpreterExecutor, cached, w, { ...seqInputs(step, at), ...past });
      const got = out['logits']!.data.subarray((step.length - 1) * V);
      at += step.length;
      expect(maxAbsDiff({ dtype: 'f32', shape: [V], data: got }, { dtype: 'f32', shape: [V], data: want.data.subarray((at - 1) * V, at * V) }), `position ${String(at - 1)}`).toBeLessThan(1e-5);
      past = {};
      for (let l = 0; l < SHAPE.numLayers; l++) {
        past[`past_key.${String(l)}`] = out[`present_key.${String(l)}`]!;
        past[`past_value.${String(l)}`] = out[`present_value.${String(l)}`]!;
      }
    }
  });

  it('the windows matter: without them the logits past the window differ', async () => {
    // One rope base for all layers, so only the windows differ.
    const oneRope = { ...opts, rotary: { invFreq: ROTARY.invFreq } };
    const noWindow = buildLlamaGraph({ ...SHAPE, layerWindows: [null, null, null] }, oneRope);
    const a = (await run(interpreterExecutor, buildLlamaGraph(SHAPE, oneRope), w, seqInputs(ids, 0)))['logits']!;
    const b = (await run(interpreterExecutor, noWindow, w, seqInputs(ids, 0)))['logits']!;
    const V = SHAPE.vocabSize;
    // Position 2 is inside every window; position 8 is past them.
    expect(maxAbsDiff({ dtype: 'f32', shape: [3, V], data: a.data.subarray(0, 3 * V) }, { dtype: 'f32', shape: [3, V], data: b.data.subarray(0, 3 * V) })).toBeLessThan(1e-6);
    expect(maxAbsDiff({ dtype: 'f32', shape: [V], data: a.data.subarray(8 * V) }, { dtype: 'f32', shape: [V], data: b.data.subarray(8 * V) })).toBeGreaterThan(1e-3);
  });

  it('longrope: a row whose last position + 1 exceeds the original length takes the long tables, else the short ones', async () => {
    const long = ropeInvFreq(8, 500);
    const withLong = buildLlamaGraph(SHAPE, { ...opts, rotary: { ...ROTARY, long: { invFreq: long, originalMax: 6 } } });
    const shortOnly = full;
    const longOnly = buildLlamaGraph(SHAPE, { ...opts, rotary: { ...ROTARY, invFreq: long } });
    for (const [n, ref] of [
      [6, shortOnly],
      [7, longOnly],
    ] as const) {
      const inputs = seqInputs(ids.slice(0, n), 0);
      const got = (await run(interpreterExecutor, withLong, w, inputs))['logits']!;
      const want = (await run(interpreterExecutor, ref, w, inputs))['logits']!;
      expect(maxAbsDiff(got, want), `${String(n)} tokens`).toBe(0);
    }
  });

  for (const [name, make] of [
    ['cpu-native', () => createCpuNativeExecutor({ threads: 2 })],
    ['onnxruntime', () => createOrtExecutor()],
  ] as const) {
    it(`${name} agrees with the interpreter (full forward and a cached step, longrope included)`, async () => {
      const exec = await make();
      const g = buildLlamaGraph(SHAPE, { ...opts, kvCache: true, attentionMask: true, rotary: { ...ROTARY, long: { invFreq: ropeInvFreq(8, 500), originalMax: 6 } } });
      const inputs: Record<string, HostTensor> = { ...seqInputs(ids, 0), attention_mask: hostTensor('f32', [1, ids.length], new Array<number>(ids.length).fill(0)) };
      for (let l = 0; l < SHAPE.numLayers; l++) {
        inputs[`past_key.${String(l)}`] = hostTensor('f32', [1, 2, 0, 12], []);
        inputs[`past_value.${String(l)}`] = hostTensor('f32', [1, 2, 0, 12], []);
      }
      const want = await run(interpreterExecutor, g, w, inputs);
      const got = await run(exec, g, w, inputs);
      expect(maxAbsDiff(got['logits']!, want['logits']!)).toBeLessThan(1e-4);
      expect(maxAbsDiff(got['present_key.2']!, want['present_key.2']!)).toBeLessThan(1e-4);
    });
  }
});

describe('buildLlamaGraph residual norms', () => {
  const count = (g: Graph, op: string): number => g.nodes.filter((n) => n.kind === 'op' && n.op === op).length;
  /** An `add` whose sum an `rmsNorm` reads: what the graph should hold as one `skipRmsNorm` instead. */
  const addThenNorm = (g: Graph): number =>
    g.nodes.filter((n) => n.kind === 'op' && n.op === 'rmsNorm' && (() => {
      const src = g.nodes[g.values[n.operands[0]!]!.node]!;
      return src.kind === 'op' && src.op === 'add';
    })()).length;

  it.each([
    ['pre', false, 2 * 3],
    ['pre', true, 2 * 3 - 1],
    ['sandwich', false, 2 * 3],
    ['post', false, 1],
    ['post', true, 0],
  ] as const)('layout %s (last logits only: %s): every residual add normalized next is one skipRmsNorm (%i)', (normLayout, lastLogitsOnly, want) => {
    const shape: LlamaShape = { vocabSize: 50, hiddenSize: 32, intermediateSize: 40, numLayers: 3, numHeads: 4, numKvHeads: 2, normLayout };
    const g = buildLlamaGraph(shape, { lastLogitsOnly });
    expect(count(g, 'skipRmsNorm')).toBe(want);
    expect(addThenNorm(g)).toBe(0);
  });
});
