import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GraphBuilder } from '@stageml/ir';
import { specialize, writeBundle } from '@stageml/runtime';
import { expectCode } from '@stageml/testkit';
import { afterAll, describe, expect, it } from 'vitest';
import { loraGraph, moeGraph } from '../../triton-gen/test/graphs.js';
import { CUDA_CASES } from '../test/cases.js';
import { Sm90Code } from './errors.js';
import { generateCuda, generateCudaFromBundle } from './generate.js';

const D = { inDim: 4096, outDim: 4096 };

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('generateCuda', () => {
  for (const [name, g] of Object.entries(CUDA_CASES)) {
    it(`emits the golden translation units for ${name}`, async () => {
      const out = generateCuda(g);
      for (const [file, text] of Object.entries(out.files)) {
        if (file.endsWith('.h') || file.endsWith('.cuh')) continue;
        await expect(text).toMatchFileSnapshot(`../test/golden/${name}/${file}`);
      }
    });
  }

  it('carries the ABI header and the kernel templates verbatim', async () => {
    const out = generateCuda(CUDA_CASES['lora-bf16']!);
    await expect(out.files['stageml_abi.h']).toMatchFileSnapshot('../test/golden/stageml_abi.h');
    await expect(out.files['stageml_sm90.cuh']).toMatchFileSnapshot('../test/golden/stageml_sm90.cuh');
    expect(out.files['stageml_sm90.cuh']).toContain('mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32');
  });

  it('registers one linear entry for a LoRA linear and three for a bank', () => {
    expect(generateCuda(CUDA_CASES['lora-bf16']!).entries.map((e) => [e.kind, e.rank, e.rankPad])).toEqual([['linear', 16, 16]]);
    expect(generateCuda(CUDA_CASES['bank-bf16']!).entries.map((e) => [e.name, e.rankPad, e.blockM])).toEqual([
      ['lora_bank_y.base', 16, 0],
      ['lora_bank_y.shrink', 64, 16],
      ['lora_bank_y.expand', 64, 16],
    ]);
  });

  it('names each unit\'s entry function by the hash of its text', () => {
    const a = generateCuda(CUDA_CASES['lora-bf16']!).files['lora_linear_y.cu']!;
    const b = generateCuda(loraGraph('bf16', D, 64)).files['lora_linear_y.cu']!;
    const fn = (t: string): string | undefined => /stageml_kernels_([0-9a-f]{8})\(/.exec(t)?.[1];
    expect(fn(a)).toMatch(/^[0-9a-f]{8}$/);
    expect(fn(a)).not.toBe(fn(b));
  });

  it('rejects f32 (the tensor-core kernels take f16/bf16)', () => {
    expectCode(() => generateCuda(loraGraph('f32', D, 16)), Sm90Code.UNSUPPORTED_DTYPE);
  });

  it('rejects dims that break 16-byte accesses', () => {
    expectCode(() => generateCuda(loraGraph('bf16', { inDim: 4096, outDim: 4096 }, 12)), Sm90Code.BAD_SHAPE);
    expectCode(() => generateCuda(loraGraph('bf16', { inDim: 100, outDim: 64 }, 8)), Sm90Code.BAD_SHAPE);
  });

  it('rejects patterns the kernels lack', () => {
    expectCode(() => generateCuda(loraGraph('bf16', D, 128)), Sm90Code.UNSUPPORTED_PATTERN);
    expectCode(() => generateCuda(loraGraph('bf16', D, 16, 2, true)), Sm90Code.UNSUPPORTED_PATTERN);
  });

  it('leaves MoE routing to the host, and rejects it under strict', () => {
    const g = moeGraph('bf16', 64, 32, 4, 8);
    const out = generateCuda(g);
    // The 4-expert router GEMM (out dim 4) breaks the 16-byte rule: it is left to the host too.
    expect(out.kernels.map((k) => k.kind)).toEqual(['moeLora', 'moeLora']);
    expect(out.hostOps.map((h) => h.op)).toContain('softmax');
    expect(out.hostOps.find((h) => h.op === 'linear')?.reason).toMatch(/^SM90_BAD_SHAPE/);
    expectCode(() => generateCuda(g, { strict: true }), Sm90Code.UNSUPPORTED_OP);
  });

  it('rejects graphs with nothing to generate and symbolic specialized dims', () => {
    const b = new GraphBuilder('plain');
    b.output('y', b.silu(b.input('x', ['bf16', [4]])));
    expectCode(() => generateCuda(b.build()), Sm90Code.NO_KERNELS);
    const d = new GraphBuilder('dyn');
    d.output('y', d.linear(d.input('x', ['bf16', ['n', 'k']]), d.input('W', ['bf16', [8, 'k']])));
    expectCode(() => generateCuda(d.build()), Sm90Code.DYNAMIC_DIM);
  });
});

describe('generateCudaFromBundle', () => {
  it('generates from a bundle written by specialize + writeBundle', async () => {
    const root = mkdtempSync(join(tmpdir(), 'stageml-sm90-'));
    dirs.push(root);
    await writeBundle(join(root, 'bundle'), specialize(CUDA_CASES['moe-bf16']!, { cutoff: 'static', shapesOnly: true }));
    const out = await generateCudaFromBundle(join(root, 'bundle'), join(root, 'gen'));
    expect(readdirSync(join(root, 'gen')).sort()).toEqual(Object.keys(out.files).sort());
    const manifest = JSON.parse(readFileSync(join(root, 'gen', 'manifest.json'), 'utf8')) as { arch: string; entries: { kind: string }[] };
    expect(manifest.arch).toBe('sm_90a');
    expect(manifest.entries.map((e) => e.kind)).toEqual(['moe']);
    // A second run into the now non-empty directory is refused without overwrite.
    await expect(generateCudaFromBundle(join(root, 'bundle'), join(root, 'gen'))).rejects.toMatchObject({ code: Sm90Code.IO });
    await generateCudaFromBundle(join(root, 'bundle'), join(root, 'gen'), { overwrite: true });
  });
});
