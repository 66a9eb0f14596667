import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadBundle } from '@stageml/runtime';
import { beforeAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { fixture, runCaptured as run } from './test-fixtures.js';

describe('stageml stage --quantize', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'stageml-quant-cli-'));
  });

  it('writes a bundle whose linear weights are int4 codes, scales and zero points', async () => {
    const bundle = join(dir, 'int4');
    const r = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'adapter', '--out', bundle, '--quantize', 'int4:g32:asym']);
    expect(r.err).toBe('');
    expect(r.code).toBe(ExitCode.OK);
    expect(r.out).toContain('quantized (int4:g32:asym): 15 linear weights');
    const b = await loadBundle(bundle);
    expect(b.constants['model.layers.0.self_attn.q_proj.weight.qweight']).toMatchObject({ dtype: 'u8', shape: [64, 2, 16] });
    expect(b.constants['model.layers.0.self_attn.q_proj.weight']).toBeUndefined();
    expect(readFileSync(join(bundle, 'residual.ir'), 'utf8')).toContain('sml.quantized_linear');
  });

  it('--quantize auto picks per projection under --max-error', async () => {
    const loose = join(dir, 'auto-loose');
    expect((await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'adapter', '--out', loose, '--quantize', 'auto', '--max-error', '0.5'])).out).toContain('15 linear weights');
    const strict = join(dir, 'auto-strict');
    expect((await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'adapter', '--out', strict, '--quantize', 'auto', '--max-error', '1e-9'])).out).toContain('0 linear weights');
    const b = await loadBundle(loose);
    // int4 (4-bit codes: 16 bytes per block of 32) wherever the bound allows it.
    expect(b.constants['model.layers.1.mlp.up_proj.weight.qweight']?.shape).toEqual([176, 2, 16]);
  });

  it('rejects bad specs and --max-error without auto, writing nothing', async () => {
    const bad = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'adapter', '--out', join(dir, 'x'), '--quantize', 'int3']);
    expect(bad.code).not.toBe(ExitCode.OK);
    expect(bad.err).toContain('int3');
    const noAuto = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'adapter', '--out', join(dir, 'y'), '--quantize', 'int8', '--max-error', '0.1']);
    expect(noAuto.err).toContain('--max-error applies to --quantize auto only');
    const noErr = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--cutoff', 'adapter', '--out', join(dir, 'z'), '--quantize', 'auto']);
    expect(noErr.err).toContain('--max-error');
  });
});
