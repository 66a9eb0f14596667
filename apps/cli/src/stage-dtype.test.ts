import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GraphBuilder, type HostTensor, deserializeGraph, interpret, printGraph } from '@stageml/ir';
import { loraLinear } from '@stageml/peft';
import { specialize } from '@stageml/runtime';
import { loadBundle } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { beforeAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { castResidual, isLinearLoraFactor } from './stage-dtype.js';
import { fixture, prefillInputs, runCaptured as run } from './test-fixtures.js';

interface Manifest {
  inputs: { name: string; type: string }[];
  params: { name: string; type: string }[];
  outputs: { name: string; type: string }[];
}

/** Inputs of one prefill of `ids` through a staged Llama residual with an empty KV cache. */

function relError(a: HostTensor, b: HostTensor): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.data.length; i++) {
    num += (a.data[i]! - b.data[i]!) ** 2;
    den += b.data[i]! ** 2;
  }
  return Math.sqrt(num / den);
}

describe('stageml stage --dtype', () => {
  let dir: string;
  let golden: { 'llama.all-r16': Record<string, { input_ids: number[] }> };
  let want: HostTensor;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'stageml-stage-dtype-'));
    golden = JSON.parse(readFileSync(fixture('peft-tiny/golden.json'), 'utf8')) as typeof golden;
    const f = await SafetensorsFile.open(fixture('peft-tiny/golden.safetensors'));
    want = await f.readTensor('llama.all-r16.prompt0.logits');
    await f.close();
  });

  it('stages the fixture in bf16: weights bf16 (LoRA factors f32, as PEFT keeps them), the interface f32, logits within bf16 error of the f32 golden', async () => {
    const bundle = join(dir, 'bf16');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/all-r16'), '--cutoff', 'adapter', '--dtype', 'bf16', '--out', bundle]);
    expect(staged.err).toBe('');
    expect(staged.code).toBe(ExitCode.OK);
    const m = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as Manifest;
    const lora = m.params.filter((p) => /\.lora_[AB]$/.test(p.name));
    expect(lora).toHaveLength(28); // 7 projections x 2 layers, A and B
    expect(lora.every((p) => p.type.startsWith('f32['))).toBe(true);
    expect(m.params.filter((p) => !lora.includes(p)).every((p) => p.type.startsWith('bf16['))).toBe(true);
    expect(m.inputs.find((i) => i.name === 'attention_mask')?.type).toBe('f32[batch, past + seq]');
    expect(m.outputs.every((o) => o.type.startsWith('f32['))).toBe(true);
    const b = await loadBundle(bundle);
    // residual.json (for Python hosts) is the same residual as residual.ir.
    expect(printGraph(deserializeGraph(readFileSync(join(bundle, 'residual.json'), 'utf8')))).toBe(printGraph(b.residual));
    // The rotary angles stay f32 (bf16 cannot hold positions past 256); cos/sin are cast where they meet bf16.
    expect(b.residual.values.find((v) => v.name === 'rope.mul')?.type.dtype).toBe('f32');
    expect(b.residual.values.find((v) => v.name === 'rope.cos.bf16')?.type.dtype).toBe('bf16');
    expect(b.constants['model.embed_tokens.weight']?.dtype).toBe('bf16');
    expect(b.constants['adapter.all-r16.model.layers.0.self_attn.q_proj.lora_A']?.dtype).toBe('f32');
    // PEFT's casts around each LoRA linear: cast(add(cast(linear(x, W), f32), mul(linear(linear(cast(x, f32), A), B), s)), bf16).
    const byName = new Map(b.residual.values.map((v) => [v.name, v]));
    const def = (name: string) => {
      const n = b.residual.nodes[byName.get(name)!.node]!;
      return { op: n.kind === 'op' ? n.op : n.kind, dtype: byName.get(name)!.type.dtype, operands: n.operands.map((o) => b.residual.values[o]!.name) };
    };
    expect(def('layers.0.add')).toEqual({ op: 'cast', dtype: 'bf16', operands: ['layers.0.add.f32'] });
    expect(def('layers.0.add.f32')).toEqual({ op: 'add', dtype: 'f32', operands: ['layers.0.linear.f32', 'layers.0.mul'] });
    expect(def('layers.0.linear.f32')).toEqual({ op: 'cast', dtype: 'f32', operands: ['layers.0.linear'] });
    expect(def('layers.0.linear')).toEqual({ op: 'linear', dtype: 'bf16', operands: ['layers.0.rmsNorm', 'model.layers.0.self_attn.q_proj.weight'] });
    expect(def('layers.0.mul')).toEqual({ op: 'mul', dtype: 'f32', operands: ['layers.0.linear_2', 'layers.0.constant'] });
    expect(def('layers.0.linear_2')).toEqual({ op: 'linear', dtype: 'f32', operands: ['layers.0.linear_1', 'adapter.all-r16.model.layers.0.self_attn.q_proj.lora_B'] });
    expect(def('layers.0.linear_1')).toEqual({ op: 'linear', dtype: 'f32', operands: ['layers.0.rmsNorm.f32', 'adapter.all-r16.model.layers.0.self_attn.q_proj.lora_A'] });
    expect(def('layers.0.rmsNorm.f32')).toEqual({ op: 'cast', dtype: 'f32', operands: ['layers.0.rmsNorm'] });
    // Hugging Face's rounding points: the normalized value is rounded before the weight multiplies it, rotary op by op.
    expect(def('layers.0.rmsNorm')).toEqual({ op: 'mul', dtype: 'bf16', operands: ['layers.0.rmsNorm.normed', 'model.layers.0.input_layernorm.weight'] });
    expect(def('layers.0.rmsNorm.normed')).toEqual({ op: 'rmsNorm', dtype: 'bf16', operands: ['gather'] });
    expect(def('layers.0.rotary')).toEqual({ op: 'add', dtype: 'bf16', operands: ['layers.0.rotary.cos', 'layers.0.rotary.sin'] });
    expect(def('layers.0.rotary.sin')).toEqual({ op: 'mul', dtype: 'bf16', operands: ['layers.0.rotary.rotate_half', 'rope.sin.bf16'] });
    const ids = golden['llama.all-r16']['prompt0']!.input_ids;
    const out = interpret(b.residual, { inputs: prefillInputs(ids, 2, 2, 16), weights: b.constants });
    const logits = out['logits']!;
    expect(logits.dtype).toBe('f32');
    const err = relError({ ...logits, shape: logits.shape.slice(1) }, want);
    expect(err).toBeGreaterThan(1e-4); // really computed in bf16
    expect(err).toBeLessThan(3e-2);
  }, 120_000);

  it('gives gen triton and gen cuda a bf16 residual they accept', async () => {
    const bundle = join(dir, 'bf16-gen');
    expect((await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/qv-r8'), '--cutoff', 'adapter', '--dtype', 'bf16', '--adapter-dtype', 'same', '--out', bundle])).code).toBe(ExitCode.OK);
    const tri = await run(['gen', 'triton', bundle, '--out', join(dir, 'tri')]);
    expect(tri.err).toBe('');
    expect(tri.code).toBe(ExitCode.OK);
    expect(tri.out).toContain('loraLinear (bf16)');
    const cuda = await run(['gen', 'cuda', bundle, '--out', join(dir, 'cuda')]);
    expect(cuda.code).toBe(ExitCode.OK);
    const f32 = join(dir, 'f32-gen');
    expect((await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'base', '--out', f32])).code).toBe(ExitCode.OK);
    const refused = await run(['gen', 'cuda', f32, '--out', join(dir, 'cuda-f32')]);
    expect(refused.code).not.toBe(ExitCode.OK);
    expect(refused.err).toContain('SM90_UNSUPPORTED_DTYPE');
  }, 120_000);

  it('--adapter-dtype same rounds the LoRA factors and chain to bf16; a bad value is a usage error', async () => {
    const bundle = join(dir, 'bf16-same');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/all-r16'), '--cutoff', 'adapter', '--dtype', 'bf16', '--adapter-dtype', 'same', '--out', bundle]);
    expect(staged.err).toBe('');
    expect(staged.code).toBe(ExitCode.OK);
    const m = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as Manifest;
    expect(m.params.every((p) => p.type.startsWith('bf16['))).toBe(true);
    const b = await loadBundle(bundle);
    // The bf16 LoRA chain is written as the `loraLinear` op (`foldServingOps`), every operand bf16.
    const add = b.residual.values.find((v) => v.name === 'layers.0.add')!;
    const n = b.residual.nodes[add.node]!;
    expect(n.kind === 'op' ? n.op : n.kind).toBe('loraLinear');
    expect(n.operands.map((o) => b.residual.values[o]!.type.dtype)).toEqual(['bf16', 'bf16', 'bf16', 'bf16']);
    const out = interpret(b.residual, { inputs: prefillInputs(golden['llama.all-r16']['prompt0']!.input_ids, 2, 2, 16), weights: b.constants });
    const err = relError({ ...out['logits']!, shape: out['logits']!.shape.slice(1) }, want);
    expect(err).toBeGreaterThan(1e-4);
    expect(err).toBeLessThan(3e-2);
    for (const bad of ['fp8', 'F32', '']) {
      const r = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/all-r16'), '--cutoff', 'adapter', '--dtype', 'bf16', '--adapter-dtype', bad, '--out', join(dir, 'bad-adapter')]);
      expect(r.code).toBe(ExitCode.USAGE);
      expect(r.err).toContain('CLI_USAGE');
      expect(r.err).toContain(`--adapter-dtype must be one of f32, same, got '${bad}'`);
    }
  }, 120_000);

  it('--dtype checkpoint takes the checkpoint dtype (f32 here) and a bad dtype is a usage error', async () => {
    const bundle = join(dir, 'ckpt');
    expect((await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'base', '--dtype', 'checkpoint', '--out', bundle])).code).toBe(ExitCode.OK);
    const m = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as Manifest;
    expect(m.params.every((p) => p.type.startsWith('f32['))).toBe(true);
    const bad = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'base', '--dtype', 'fp8', '--out', join(dir, 'bad')]);
    expect(bad.code).toBe(ExitCode.USAGE);
    expect(bad.err).toContain('--dtype must be one of f32, bf16, f16, checkpoint');
  }, 120_000);

  it('castResidual keeps a LoRA B bias f32 too and, with adapterDtype same, rounds every factor (f16 residual)', () => {
    // The factors are known by their role (`adapterParamName`), not by the chain around them.
    const [a, bf, bb] = ['lora_A', 'lora_B', 'lora_B_bias'].map((t) => `adapter.t.m.${t}`) as [string, string, string];
    expect([a, bf, bb, 'adapter.t.model.layers.0.mlp.experts.gate.lora_A', 'w', 'lora_A'].map(isLinearLoraFactor)).toEqual([true, true, true, false, false, false]);
    const b = new GraphBuilder('one');
    const x = b.input('x', ['f32', [2, 8]]);
    const y = loraLinear(b, x, b.param('w', ['f32', [4, 8]]), b.param('bias', ['f32', [4]]), { A: b.param(a, ['f32', [2, 8]]), B: b.param(bf, ['f32', [4, 2]]), biasB: b.param(bb, ['f32', [4]]), scale: 0.25 });
    b.output('y', y);
    const g = b.build();
    const staged = specialize(g, { cutoff: 'static', shapesOnly: true, annotations: { inputs: { x: 'dynamic' }, params: { '*': 'dynamic' } } });
    const dtypes = (r: ReturnType<typeof castResidual>) => Object.fromEntries(r.residual.nodes.filter((n) => n.kind === 'param').map((n) => [r.residual.values[n.results[0]!]!.name, r.residual.values[n.results[0]!]!.type.dtype]));
    const peft = castResidual(staged, 'f16', g);
    expect(dtypes(peft)).toEqual({ w: 'f16', bias: 'f16', [a]: 'f32', [bf]: 'f32', [bb]: 'f32' });
    const opOf = (r: ReturnType<typeof castResidual>, name: string) => {
      const v = r.residual.values.find((x) => x.name === name)!;
      const n = r.residual.nodes[v.node]!;
      return [n.kind === 'op' ? n.op : n.kind, v.type.dtype, n.operands.map((o) => r.residual.values[o]!.type.dtype).join(',')];
    };
    expect(opOf(peft, 'add')).toEqual(['cast', 'f16', 'f32']);
    expect(opOf(peft, 'add.f32')).toEqual(['add', 'f32', 'f32,f32']);
    const same = castResidual(staged, 'f16', g, { adapterDtype: 'same' });
    expect(dtypes(same)).toEqual({ w: 'f16', bias: 'f16', [a]: 'f16', [bf]: 'f16', [bb]: 'f16' });
    expect(opOf(same, 'add')).toEqual(['add', 'f16', 'f16,f16']);
    // Both keep the f32 interface.
    for (const r of [peft, same]) expect(r.residual.values[r.residual.outputs[0]!.value]!.type.dtype).toBe('f32');
  });
});
