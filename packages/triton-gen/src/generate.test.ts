import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SERVING_STAGES } from '@stageml/annotations';
import { GraphBuilder } from '@stageml/ir';
import { specialize, writeBundle } from '@stageml/runtime';
import { expectCode } from '@stageml/testkit';
import { afterAll, describe, expect, it } from 'vitest';
import { bankGraph, bgmvGraph, loraGraph, moeGraph } from '../test/graphs.js';
import { itWithTool } from '../test/tools.js';
import { TritonCode } from './errors.js';
import { generateTriton, generateTritonFromBundle } from './generate.js';

const D = { inDim: 4096, outDim: 4096 };
const CASES = {
  'lora-bf16': loraGraph('bf16', D, 16, 2),
  'lora-bias-f32': loraGraph('f32', { inDim: 72, outDim: 40 }, 12, 0.5, true),
  'bank-f16': bankGraph('f16', D, [8, 16, 64]),
  'bgmv-bf16': bgmvGraph('bf16', D, 64, 16),
  'moe-bf16': moeGraph('bf16', 256, 128, 8, 16),
};

const dirs: string[] = [];
function tmp(): string {
  const d = mkdtempSync(join(tmpdir(), 'stageml-triton-'));
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('generateTriton', () => {
  for (const [name, g] of Object.entries(CASES)) {
    it(`emits the golden files for ${name}`, async () => {
      const out = generateTriton(g);
      for (const [file, text] of Object.entries(out.files)) {
        if (file === 'stageml_triton_common.py' && name !== 'lora-bf16') continue;
        await expect(text).toMatchFileSnapshot(`../test/golden/${name}/${file}`);
      }
    });
  }

  itWithTool('python3', 'emits Python that compiles (python3 -m py_compile)', () => {
    const dir = tmp();
    const files: string[] = [];
    for (const [name, g] of Object.entries(CASES)) {
      for (const [file, text] of Object.entries(generateTriton(g).files)) {
        if (!file.endsWith('.py')) continue;
        const path = join(dir, `${name}-${file}`);
        writeFileSync(path, text);
        files.push(path);
      }
    }
    const r = spawnSync('python3', ['-m', 'py_compile', ...files], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
  });

  it('specializes kernels to the pattern dims and keys autotuning by row bucket', () => {
    const out = generateTriton(CASES['lora-bf16']);
    const kernel = out.files['lora_linear_y.py']!;
    expect(kernel).toContain('K = tl.constexpr(4096)');
    expect(kernel).toContain('R_PAD = tl.constexpr(16)');
    expect(kernel).toContain('key=["M_BUCKET", "LORA_MODE", "T_SPLIT"]');
    expect(kernel).toContain('do_not_specialize=["M"]');
  });

  it('lists routing ops as host ops, and rejects them under strict', () => {
    const out = generateTriton(CASES['moe-bf16']);
    expect(out.hostOps.map((h) => h.op)).toContain('topk');
    expect(out.hostOps.find((h) => h.op === 'softmax')?.reason).toMatch(/host executor/);
    const e = expectCode(() => generateTriton(CASES['moe-bf16'], { strict: true }), TritonCode.UNSUPPORTED_OP);
    expect(e.at?.graph).toBe('moe');
  });

  it('rejects graphs with nothing to generate', () => {
    const b = new GraphBuilder('plain');
    b.output('y', b.silu(b.input('x', ['f32', [4]])));
    expectCode(() => generateTriton(b.build()), TritonCode.NO_KERNELS);
  });

  it('rejects dtypes the kernels do not take', () => {
    expectCode(() => generateTriton(loraGraph('f64', { inDim: 8, outDim: 8 }, 2)), TritonCode.UNSUPPORTED_DTYPE);
  });

  it('rejects symbolic dims the kernels specialize on', () => {
    const b = new GraphBuilder('dyn');
    b.output('y', b.linear(b.input('x', ['f16', ['n', 'd']]), b.input('W', ['f16', [8, 'd']])));
    const e = expectCode(() => generateTriton(b.build()), TritonCode.DYNAMIC_DIM);
    expect(e.at?.value).toBe('linear');
  });
});

describe('generateTritonFromBundle', () => {
  it('generates from a bundle written by specialize + writeBundle', async () => {
    const g = loraGraph('f16', { inDim: 64, outDim: 32 }, 8);
    const annotations = { inputs: { x: 'request' }, params: { W: 'base', A: 'adapter', B: 'adapter' } };
    const r = specialize(g, { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', shapesOnly: true });
    const root = tmp();
    await writeBundle(join(root, 'bundle'), r);
    const out = await generateTritonFromBundle(join(root, 'bundle'), join(root, 'gen'));
    expect(out.kernels.map((k) => k.kind)).toEqual(['loraLinear']);
    expect(readdirSync(join(root, 'gen')).sort()).toEqual(Object.keys(out.files).sort());
    const manifest = JSON.parse(readFileSync(join(root, 'gen', 'manifest.json'), 'utf8')) as { kernels: { name: string }[] };
    expect(manifest.kernels.map((k) => k.name)).toEqual(['lora_linear_y']);
  });

  it('fails with TRITON_IO when the output cannot be written', async () => {
    const g = loraGraph('f16', { inDim: 64, outDim: 32 }, 8);
    const r = specialize(g, { lattice: SERVING_STAGES, annotations: { inputs: { x: 'request' }, params: { W: 'base', A: 'adapter', B: 'adapter' } }, cutoff: 'adapter', shapesOnly: true });
    const root = tmp();
    await writeBundle(join(root, 'bundle'), r);
    writeFileSync(join(root, 'file'), '');
    await expect(generateTritonFromBundle(join(root, 'bundle'), join(root, 'file', 'gen'))).rejects.toMatchObject({ code: TritonCode.IO });
  });

  it('refuses a non-empty output directory unless overwrite, leaving its files alone', async () => {
    const g = loraGraph('f16', { inDim: 64, outDim: 32 }, 8);
    const r = specialize(g, { lattice: SERVING_STAGES, annotations: { inputs: { x: 'request' }, params: { W: 'base', A: 'adapter', B: 'adapter' } }, cutoff: 'adapter', shapesOnly: true });
    const root = tmp();
    await writeBundle(join(root, 'bundle'), r);
    mkdirSync(join(root, 'gen'));
    writeFileSync(join(root, 'gen', 'notes.txt'), 'mine');
    await expect(generateTritonFromBundle(join(root, 'bundle'), join(root, 'gen'))).rejects.toMatchObject({ code: TritonCode.IO });
    expect(readFileSync(join(root, 'gen', 'notes.txt'), 'utf8')).toBe('mine');
    await generateTritonFromBundle(join(root, 'bundle'), join(root, 'gen'), { overwrite: true });
    expect(readdirSync(join(root, 'gen'))).not.toContain('notes.txt');
  });
});
