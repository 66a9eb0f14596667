import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostTensor } from '@stageml/ir';
import { writeSafetensors } from '@stageml/safetensors';
import { beforeAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { fixture, runCaptured as run } from './test-fixtures.js';

describe('stageml stage + stageml lower mlir', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'stageml-stage-lower-'));
  });

  it('stages the fixture Llama with an adapter, lowers the whole residual and verifies it with mlir-opt', async () => {
    const bundle = join(dir, 'llama');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/qv-r8'), '--cutoff', 'adapter', '--out', bundle]);
    expect(staged.err).toBe('');
    expect(staged.code).toBe(ExitCode.OK);
    expect(staged.out).toContain("staged @llama at 'adapter'");
    const manifest = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8')) as { cutoff: string; inputs: { name: string }[] };
    expect(manifest.cutoff).toBe('adapter');
    expect(manifest.inputs.map((i) => i.name)).toContain('attention_mask');

    const out = join(dir, 'llama.mlir');
    const lowered = await run(['lower', 'mlir', bundle, '--out', out, '--verify']);
    expect(lowered.err).toBe('');
    expect(lowered.code).toBe(ExitCode.OK);
    expect(lowered.out).toContain('verified');
    const text = readFileSync(out, 'utf8');
    expect(text).toContain('func.func @llama(');
    expect(text).toContain('{stageml.constant = "model.embed_tokens.weight"}');
  }, 120_000);

  it('lowers one Mixtral layer with expert LoRA using dense_resource blobs', async () => {
    const bundle = join(dir, 'mixtral');
    const staged = await run(['stage', '--model', fixture('peft-tiny/mixtral/base'), '--adapter', fixture('peft-tiny/mixtral/adapters/experts-r4'), '--layers', '1', '--cutoff', 'adapter', '--out', bundle]);
    expect(staged.code).toBe(ExitCode.OK);
    const out = join(dir, 'mixtral.mlir');
    const lowered = await run(['lower', 'mlir', bundle, '--out', out, '--constants', 'resources', '--inline-limit', '0', '--verify', '--json']);
    expect(lowered.code).toBe(ExitCode.OK);
    const summary = JSON.parse(lowered.out) as { resources: number; constantArguments: number; verified: boolean };
    expect(summary.resources).toBeGreaterThan(10);
    expect(summary.constantArguments).toBe(0);
    expect(summary.verified).toBe(true);
    expect(readFileSync(out, 'utf8')).toContain('dialect_resources');
  }, 120_000);

  it('stages a bare graph with annotations and weights', async () => {
    const ann = join(dir, 'ann.json');
    writeFileSync(ann, JSON.stringify({ inputs: { x: 'dynamic' }, defaultParam: 'static' }));
    const weights = join(dir, 'w.safetensors');
    const t = (shape: number[]): ReturnType<typeof hostTensor> => hostTensor('f32', shape, Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => (i % 7) / 7));
    await writeSafetensors(weights, { w: t([96, 64]), bias: t([96]), lora_A: t([8, 64]), lora_B: t([96, 8]) });
    const bundle = join(dir, 'lora');
    const staged = await run(['stage', '--graph', fixture('ir/lora-layer.ir'), '--annotations', ann, '--weights', weights, '--cutoff', 'static', '--out', bundle]);
    expect(staged.err).toBe('');
    expect(staged.code).toBe(ExitCode.OK);
    const lowered = await run(['lower', 'mlir', bundle, '--out', join(dir, 'lora.mlir'), '--function', 'lora_residual']);
    expect(lowered.code).toBe(ExitCode.OK);
    expect(readFileSync(join(dir, 'lora.mlir'), 'utf8')).toContain('func.func @lora_residual(%x: tensor<?x64xf32>');
  });

  it('reports an op the lowering cannot handle as LOWER_UNSUPPORTED_OP naming the op', async () => {
    const graph = join(dir, 'noisy.ir');
    writeFileSync(graph, 'graph @noisy {\n  %x = input : f32[4]\n  %r = sml.random_uniform() {shape = [4]} : f32[4]\n  %y = sml.add(%x, %r) : f32[4]\n  return y = %y\n}\n');
    const bundle = join(dir, 'noisy');
    expect((await run(['stage', '--graph', graph, '--cutoff', 'static', '--out', bundle])).code).toBe(ExitCode.OK);
    const r = await run(['lower', 'mlir', bundle, '--out', join(dir, 'noisy.mlir')]);
    expect(r.code).toBe(ExitCode.INVALID_INPUT);
    expect(r.err).toMatch(/^error\[LOWER_UNSUPPORTED_OP\]: .*sml\.random_uniform/);
  });

  it('refuses ambiguous sources and existing bundles without --force', async () => {
    const both = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--graph', fixture('ir/lora-layer.ir'), '--cutoff', 'base', '--out', join(dir, 'x')]);
    expect(both.code).toBe(ExitCode.USAGE);
    const graph = join(dir, 'plain.ir');
    writeFileSync(graph, 'graph @plain {\n  %x = input : f32[4]\n  %y = sml.exp(%x) : f32[4]\n  return y = %y\n}\n');
    const bundle = join(dir, 'twice');
    expect((await run(['stage', '--graph', graph, '--cutoff', 'static', '--out', bundle])).code).toBe(ExitCode.OK);
    const again = await run(['stage', '--graph', graph, '--cutoff', 'static', '--out', bundle]);
    expect(again.code).toBe(ExitCode.IO);
    expect(again.err).toContain('--force');
    expect((await run(['stage', '--graph', graph, '--cutoff', 'static', '--out', bundle, '--force'])).code).toBe(ExitCode.OK);
  });

  it('rejects an unknown constants mode as a usage error', async () => {
    const r = await run(['lower', 'mlir', join(dir, 'lora'), '--out', join(dir, 'x.mlir'), '--constants', 'inline']);
    expect(r.code).toBe(ExitCode.USAGE);
  });
});
