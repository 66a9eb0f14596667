import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type Graph, GraphBuilder, type HostTensor, graphParams, hostTensor, parseGraph, sizeOf, sym } from '@stageml/ir';
import { moeBlock } from '@stageml/moe';
import { specialize } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { expectVerifies, once, reference, requireMlirTools, runOrExplain } from '../test/mlir-tools.js';
import { type MlirLowerOptions, type RunnerCall, lowerFunction, lowerToMlir } from './index.js';

function wave(shape: readonly number[], scale = 1, phase = 0): HostTensor {
  return hostTensor('f32', shape, Array.from({ length: sizeOf(shape) }, (_, i) => scale * Math.sin(i * 0.61 + phase)));
}

function paramValues(g: Graph, scale: number): Record<string, HostTensor> {
  const out: Record<string, HostTensor> = {};
  graphParams(g).forEach((p, k) => {
    out[p.name] = wave(g.values[p.results[0]!]!.type.shape as number[], scale, k);
  });
  return out;
}

/** The LoRA layer fixture, specialized with its weights static: the residual keeps x·Wᵀ + s·(x·Aᵀ)·Bᵀ. */
function loraResidual(): { graph: Graph; constants: Record<string, HostTensor> } {
  const g = parseGraph(readFileSync(fileURLToPath(new URL('../../../fixtures/ir/lora-layer.ir', import.meta.url)), 'utf8'));
  const r = specialize(g, { cutoff: 'static', values: paramValues(g, 0.2) });
  return { graph: r.residual, constants: { ...r.constants } };
}

/** RMSNorm, q/k/v projections, rotary, causal GQA attention (4 query heads over 2 kv heads) with an additive mask, o_proj. */
function attentionBlock(): Graph {
  const b = new GraphBuilder('attention_block');
  const x = b.input('x', ['f32', ['batch', 'seq', 16]]);
  const cos = b.input('cos', ['f32', ['batch', 1, 'seq', 4]]);
  const sin = b.input('sin', ['f32', ['batch', 1, 'seq', 4]]);
  const mask = b.input('mask', ['f32', ['batch', 1, 1, 'seq']]);
  const h = b.rmsNorm(x, b.param('norm', ['f32', [16]]), 1e-6);
  const heads = (name: string, n: number): ReturnType<typeof b.input> =>
    b.transpose(b.reshape(b.linear(h, b.param(name, ['f32', [n * 4, 16]])), ['batch', 'seq', n, 4]), [0, 2, 1, 3]);
  const q = b.rotary(heads('wq', 4), cos, sin);
  const k = b.rotary(heads('wk', 2), cos, sin);
  const v = heads('wv', 2);
  const attn = b.attention(q, k, v, { causal: true }, mask);
  const merged = b.reshape(b.transpose(attn, [0, 2, 1, 3]), ['batch', 'seq', 16]);
  b.output('y', b.add(x, b.linear(merged, b.param('wo', ['f32', [16, 16]]))));
  return b.build();
}

/** A Mixtral MoE layer over token rows: router, top-2 of 4 experts, grouped SwiGLU experts, scatter-add. */
function moeLayer(): Graph {
  const b = new GraphBuilder('moe_layer');
  const x = b.input('x', ['f32', ['tokens', 8]]);
  const y = moeBlock(
    b,
    x,
    { router: b.param('router', ['f32', [4, 8]]), gateUp: b.param('gate_up', ['f32', [4, 12, 8]]), down: b.param('down', ['f32', [4, 8, 6]]) },
    { topK: 2, normalize: true },
  );
  b.output('y', y);
  return b.build();
}

/** Symbolic sizes through every shape path: expand, collapse, tensor.reshape, slices, concat, iota. */
function dynamicShapes(): Graph {
  const b = new GraphBuilder('dynamic_shapes');
  const x = b.input('x', ['f32', ['n', 6]]);
  const split = b.reshape(x, ['n', 2, 3]);
  const flat = b.reshape(split, [-1]);
  const odd = b.reshape(x, [2, 3, 'n']);
  const tail = b.slice(x, 0, 1);
  const both = b.concat([x, tail], 0);
  const pos = b.cast(b.iota(['n', 6], 0), 'f32');
  const [top, at] = b.topk(b.add(x, pos), 2, 0);
  b.output('flat', flat);
  b.output('odd', odd);
  b.output('both', both);
  b.output('top', top);
  b.output('at', at);
  b.output('rowmax', b.max(b.softmax(x, 0), [1], true));
  return b.build();
}

interface Golden {
  readonly name: string;
  readonly graph: Graph;
  readonly constants: Record<string, HostTensor>;
  readonly options: MlirLowerOptions;
  readonly values: Record<string, HostTensor>;
}

function goldens(): Golden[] {
  const lora = loraResidual();
  const attn = attentionBlock();
  const moe = moeLayer();
  const moeWeights = paramValues(moe, 0.3);
  return [
    { name: 'lora-layer', graph: lora.graph, constants: lora.constants, options: {}, values: { x: wave([3, 64]) } },
    {
      name: 'attention-block',
      graph: attn,
      constants: {},
      options: {},
      values: {
        ...paramValues(attn, 0.3),
        x: wave([2, 3, 16]),
        cos: wave([2, 1, 3, 4], 1, 0.5),
        sin: wave([2, 1, 3, 4], 1, 1.5),
        mask: hostTensor('f32', [2, 1, 1, 3], [0, 0, 0, -1e9, 0, 0]),
      },
    },
    { name: 'moe-layer', graph: moe, constants: moeWeights, options: { constants: 'resources' }, values: { x: wave([5, 8]) } },
    { name: 'dynamic-shapes', graph: dynamicShapes(), constants: {}, options: {}, values: { x: wave([4, 6]) } },
  ];
}

describe('golden MLIR of representative residuals', () => {
  const cases = goldens();
  const batch = once(() => {
    const calls: RunnerCall[] = cases.map((c) => ({ fn: lowerFunction(c.graph, c.constants, c.options), values: c.values }));
    return runOrExplain(calls, requireMlirTools());
  });

  it.each(cases.map((c, i) => [c.name, i] as const))('%s matches its golden file and verifies', { timeout: 120_000 }, async (name, i) => {
    const c = cases[i]!;
    const text = lowerToMlir(c.graph, c.constants, c.options).text;
    await expect(text).toMatchFileSnapshot(`../test/golden/${name}.mlir`);
    await expectVerifies(text, requireMlirTools());
  });

  it.each(cases.map((c, i) => [c.name, i] as const))('%s runs as the interpreter does', { timeout: 180_000 }, async (_name, i) => {
    const outputs = await batch();
    const c = cases[i]!;
    const want = reference(c.graph, { ...c.values, ...c.constants });
    for (const [name, t] of Object.entries(want)) expect(outputs[i]![name], name).toBeAllclose(t, { rtol: 1e-5, atol: 1e-5 });
  });

  it('solves a symbol known only through a linear dim (m from pair [m + n, 2]) at run time', { timeout: 120_000 }, async () => {
    // NOTE: the reference interpreter binds plain symbols only, so the expectation is computed here.
    const b = new GraphBuilder('solve');
    const x = b.input('x', ['f32', ['n', 2]]);
    const pair = b.input('pair', ['f32', ['m + n', 2]]);
    b.output('y', b.add(b.cast(b.iota(['m', 2], 0), 'f32'), b.slice(pair, 0, sym('n'))));
    b.output('n', b.sum(x, [1]));
    const values = { x: wave([3, 2]), pair: wave([7, 2]) };
    const [out] = await runOrExplain([{ fn: lowerFunction(b.build()), values }], requireMlirTools());
    const want = hostTensor('f32', [4, 2], Array.from({ length: 8 }, (_, i) => Math.fround(Math.floor(i / 2) + values.pair.data[6 + i]!)));
    expect(out!['y']).toBeAllclose(want, { rtol: 0, atol: 0 });
  });
});
