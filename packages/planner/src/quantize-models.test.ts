// Weight-only quantization on the fixture Llama, checked against this package's error bounds (it
// lives here, above @stageml/models, so no package depends on one above it).
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { SERVING_STAGES } from '@stageml/annotations';
import { GraphBuilder, type HostTensor, interpret, quantizeWeight, seededRandom } from '@stageml/ir';
import { usesMatMulNBits } from '@stageml/onnx-lower';
import { type Executor, createOrtExecutor, isOrtAvailable, loadBundle, parseWeightQuantSpec, quantizeStaged, specialize, writeBundle } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CausalLM, buildLlamaGraph, parseLlamaConfig } from '@stageml/models';
import { quantizedLinearErrorBound, weightQuantizationError } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/', import.meta.url));
const base = `${root}llama/base`;
const golden = JSON.parse(readFileSync(`${root}golden.json`, 'utf8')) as Record<string, unknown>;
const prompt = (p: number) => (golden['llama.base'] as Record<string, { input_ids: number[] }>)[`prompt${String(p)}`]!;
const ort = await isOrtAvailable();
let weights: Record<string, HostTensor>;
let exec: Executor;

beforeAll(async () => {
  const f = await SafetensorsFile.open(`${base}/model.safetensors`);
  weights = {};
  for (const k of f.names()) weights[k] = await f.readTensor(k);
  await f.close();
  if (ort) exec = await createOrtExecutor({ intraOpNumThreads: 1 });
});

function relErr(a: HostTensor, b: HostTensor): number {
  let e = 0;
  let r = 0;
  for (let i = 0; i < a.data.length; i++) {
    e += (a.data[i]! - b.data[i]!) ** 2;
    r += b.data[i]! ** 2;
  }
  return Math.sqrt(e / r);
}

const SPECS = ['int8', 'int4', 'int8:g128', 'int4:g128:asym', 'int4:channel', 'int8:g32:asym'];
const PROJECTIONS = ['model.layers.0.self_attn.q_proj.weight', 'model.layers.1.mlp.down_proj.weight', 'lm_head.weight'];

describe.runIf(ort)('quantized linears on onnxruntime stay within the planner bound', () => {
  for (const spec of SPECS) {
    it(`${spec}: ‖ΔY‖ of each projection ≤ quantizedLinearErrorBound`, async () => {
      const s = parseWeightQuantSpec(spec);
      for (const name of PROJECTIONS) {
        const w = weights[name]!;
        const [out, inF] = w.shape as [number, number];
        const bs = s.perChannel === true ? inF : s.blockSize;
        const packed = quantizeWeight(w.data, out, inF, { bits: s.bits, blockSize: bs, symmetric: s.symmetric ?? true });
        const rnd = seededRandom(out + inF);
        const x: HostTensor = { dtype: 'f32', shape: [5, inF], data: Float32Array.from({ length: 5 * inF }, () => (rnd() - 0.5) * 4) };
        const b = new GraphBuilder('q');
        const xv = b.input('x', ['f32', ['n', inF]]);
        const z = packed.zeroPoints === undefined ? undefined : b.param('z', ['u8', packed.zeroPoints.shape]);
        b.output('y', b.quantizedLinear(xv, b.param('q', ['u8', packed.qweight.shape]), b.param('s', ['f32', packed.scales.shape]), z, packed.attrs));
        const g = b.build();
        const params = { q: packed.qweight, s: packed.scales, ...(packed.zeroPoints === undefined ? {} : { z: packed.zeroPoints }) };
        const y = (await (await exec.prepare(g, params)).run({ x }))['y']!;
        // Exact x·Wᵀ in float64.
        let e2 = 0;
        for (let r = 0; r < 5; r++) {
          for (let o = 0; o < out; o++) {
            let acc = 0;
            for (let i = 0; i < inF; i++) acc += x.data[r * inF + i]! * w.data[o * inF + i]!;
            e2 += (y.data[r * out + o]! - acc) ** 2;
          }
        }
        const err = weightQuantizationError(w, packed);
        const bound = quantizedLinearErrorBound(err, x, { int8Activations: usesMatMulNBits(packed.attrs, { dtype: 'f32', shape: [5, inF] }) });
        expect(Math.sqrt(e2), `${spec} ${name}`).toBeLessThanOrEqual(bound.bound);
        expect(Math.sqrt(e2)).toBeGreaterThan(0);
        // The interpreter (dequantize, then linear) sees only the weight error.
        const ref = interpret(g, { inputs: { x }, weights: params })['y']!;
        expect(relErr(ref, y)).toBeLessThan(2e-2);
      }
    });
  }
});

describe.runIf(ort)('CausalLM with quantize', () => {
  let f32: CausalLM;
  const models = new Map<string, CausalLM>();
  beforeAll(async () => {
    f32 = await CausalLM.load(base, { executor: exec });
    for (const spec of ['int8', 'int4']) models.set(spec, await CausalLM.load(base, { executor: exec, quantize: parseWeightQuantSpec(spec) }));
  });

  // The planner's first-order prediction of the logits' relative error: the sum over quantized
  // weights of their relative weight error (each bounds the RMS relative output error of its layer
  // for isotropic inputs; errors of layers in series add to first order).
  const predicted = (spec: string): number => {
    const s = parseWeightQuantSpec(spec);
    let sum = 0;
    for (const [name, w] of Object.entries(weights)) {
      if (w.shape.length !== 2 || name === 'model.embed_tokens.weight') continue;
      const [out, inF] = w.shape as [number, number];
      sum += weightQuantizationError(w, quantizeWeight(w.data, out, inF, { bits: s.bits, blockSize: s.blockSize })).relative;
    }
    return sum;
  };

  for (const spec of ['int8', 'int4']) {
    it(`${spec} logits are within the planner's predicted relative error`, async () => {
      const bound = predicted(spec);
      for (let p = 0; p < 4; p++) {
        const ids = prompt(p).input_ids;
        const want = (await f32.forward([ids])).logits;
        const got = (await models.get(spec)!.forward([ids])).logits;
        const e = relErr(got, want);
        expect(e, `prompt ${String(p)}`).toBeLessThanOrEqual(bound);
        expect(e).toBeGreaterThan(0);
      }
    });
  }

});

describe.runIf(ort)('quantized staging round-trips through bundles', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'stageml-quant-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('writes u8 codes and f32 scales, loads them back, and runs the same', async () => {
    const config = parseLlamaConfig(readFileSync(`${base}/config.json`, 'utf8'));
    const graph = buildLlamaGraph(config);
    const staged = specialize(graph, { lattice: SERVING_STAGES, cutoff: 'adapter', values: { get: (n) => weights[n] } });
    const q = quantizeStaged(staged, { spec: parseWeightQuantSpec('int4:g32:asym') });
    expect(q.quantized.length).toBe(2 * 7 + 1);
    expect(Object.keys(q.constants).some((k) => k.endsWith('.zero_points'))).toBe(true);
    await writeBundle(join(dir, 'b'), q);
    const loaded = await loadBundle(join(dir, 'b'));
    expect(Object.keys(loaded.constants).sort()).toEqual(Object.keys(q.constants).sort());
    const ids: HostTensor = { dtype: 'i64', shape: [1, 5], data: Float64Array.from([1, 5, 9, 2, 7]) };
    const pos: HostTensor = { dtype: 'i64', shape: [1, 5], data: Float64Array.from([0, 1, 2, 3, 4]) };
    const a = await (await exec.prepare(q.residual, q.constants)).run({ input_ids: ids, position_ids: pos });
    const b = await (await exec.prepare(loaded.residual, loaded.constants)).run({ input_ids: ids, position_ids: pos });
    expect(Array.from(b['logits']!.data)).toEqual(Array.from(a['logits']!.data));
  });
});
