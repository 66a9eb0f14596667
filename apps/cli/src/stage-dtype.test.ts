import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type HostTensor, deserializeGraph, interpret, printGraph } from '@stageml/ir';
import { loadBundle } from '@stageml/runtime';
import { SafetensorsFile } from '@stageml/safetensors';
import { beforeAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
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

  it('stages the fixture in bf16: weights bf16, the interface f32, logits within bf16 error of the f32 golden', async () => {
    const bundle = join(dir, 'bf16');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/all-r16'), '--cutoff', 'adapter', '--dtype', 'bf16', '--out', bundle]);
    expect(staged.err).toBe('');
    expect(staged.code).toBe(ExitCode.OK);
    const m = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as Manifest;
    expect(m.params.every((p) => p.type.startsWith('bf16['))).toBe(true);
    expect(m.inputs.find((i) => i.name === 'attention_mask')?.type).toBe('f32[batch, past + seq]');
    expect(m.outputs.every((o) => o.type.startsWith('f32['))).toBe(true);
    const b = await loadBundle(bundle);
    // residual.json (for Python hosts) is the same residual as residual.ir.
    expect(printGraph(deserializeGraph(readFileSync(join(bundle, 'residual.json'), 'utf8')))).toBe(printGraph(b.residual));
    // The rotary angles stay f32 (bf16 cannot hold positions past 256); cos/sin are cast where they meet bf16.
    expect(b.residual.values.find((v) => v.name === 'rope.mul')?.type.dtype).toBe('f32');
    expect(b.residual.values.find((v) => v.name === 'rope.cos.bf16')?.type.dtype).toBe('bf16');
    expect(b.constants['model.embed_tokens.weight']?.dtype).toBe('bf16');
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
    expect((await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/qv-r8'), '--cutoff', 'adapter', '--dtype', 'bf16', '--out', bundle])).code).toBe(ExitCode.OK);
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

  it('--dtype checkpoint takes the checkpoint dtype (f32 here) and a bad dtype is a usage error', async () => {
    const bundle = join(dir, 'ckpt');
    expect((await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'base', '--dtype', 'checkpoint', '--out', bundle])).code).toBe(ExitCode.OK);
    const m = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as Manifest;
    expect(m.params.every((p) => p.type.startsWith('f32['))).toBe(true);
    const bad = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'base', '--dtype', 'fp8', '--out', join(dir, 'bad')]);
    expect(bad.code).toBe(ExitCode.USAGE);
    expect(bad.err).toContain('--dtype must be one of f32, bf16, f16, checkpoint');
  }, 120_000);
});
