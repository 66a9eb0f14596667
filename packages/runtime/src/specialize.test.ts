import { mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SERVING_STAGES } from '@stageml/annotations';
import { type Graph, GraphBuilder, type HostTensor, graphInputs, graphOps, hostTensor, interpret } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { afterAll, describe, expect, it } from 'vitest';
import { compileStaged, interpreterExecutor, loadBundle, specialize, writeBundle } from './index.js';

function seeded(n: number, seed: number): number[] {
  let s = seed;
  return Array.from({ length: n }, () => {
    s = (s * 1103515245 + 12345) % 2147483648;
    return s / 2147483648 - 0.5;
  });
}

const D = 16;
const O = 12;
const R = 4;
const S = 2;
const weights: Record<string, HostTensor> = {
  W: hostTensor('f32', [O, D], seeded(O * D, 1)),
  A: hostTensor('f32', [R, D], seeded(R * D, 2)),
  B: hostTensor('f32', [O, R], seeded(O * R, 3)),
};
const x = hostTensor('f32', [5, D], seeded(5 * D, 4));
const annotations = { inputs: { x: 'request' }, params: { W: 'base', A: 'adapter', B: 'adapter' } };

/** y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ, the unmerged LoRA layer. */
function loraLayer(): Graph {
  const b = new GraphBuilder('lora');
  const xv = b.input('x', ['f32', ['batch', D]]);
  const w = b.param('W', ['f32', [O, D]]);
  const a = b.param('A', ['f32', [R, D]]);
  const bb = b.param('B', ['f32', [O, R]]);
  b.output('y', b.add(b.linear(xv, w), b.mul(b.linear(b.linear(xv, a), bb), b.scalar(S))));
  return b.build();
}

/** y = x·(W + s·B·A)ᵀ, the merged form: everything but the final linear is adapter-stage. */
function mergedLayer(): Graph {
  const b = new GraphBuilder('lora_merged');
  const xv = b.input('x', ['f32', ['batch', D]]);
  const merged = b.add(b.param('W', ['f32', [O, D]]), b.mul(b.matmul(b.param('B', ['f32', [O, R]]), b.param('A', ['f32', [R, D]])), b.scalar(S)));
  b.output('y', b.linear(xv, merged));
  return b.build();
}

const dirs: string[] = [];
function tmp(): string {
  const d = mkdtempSync(join(tmpdir(), 'stageml-bundle-'));
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('specialize on a LoRA layer', () => {
  it('folds the adapter-stage merge into one constant and leaves one linear', () => {
    const g = mergedLayer();
    const r = specialize(g, { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: weights });
    expect(graphOps(r.residual).map((n) => n.op)).toEqual(['linear']);
    expect(Object.keys(r.constants)).toEqual(['add']);
    expect(r.report.foldedOps).toBe(4);
    expect(graphInputs(r.residual).map((n) => n.name)).toEqual(['x']);
    const want = interpret(g, { inputs: { x }, weights })['y']!;
    const got = interpret(r.residual, { inputs: { x }, weights: r.constants })['y']!;
    expect(got).toBeAllclose(want, { rtol: 1e-5, atol: 1e-6 });
  });

  it('equals the unmerged, unstaged layer', () => {
    const want = interpret(loraLayer(), { inputs: { x }, weights })['y']!;
    const r = specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: weights });
    expect(interpret(r.residual, { inputs: { x }, weights: r.constants })['y']!).toBeAllclose(want, { rtol: 1e-5, atol: 1e-6 });
  });

  it('keeps the unmerged form as a residual whose constants are only the weights it reads', () => {
    const r = specialize(loraLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: weights });
    expect(Object.keys(r.constants).sort()).toEqual(['A', 'B', 'W']);
    expect(graphOps(r.residual).map((n) => n.op)).toEqual(['linear', 'linear', 'linear', 'constant', 'mul', 'add']);
  });

  it('at the base cutoff leaves adapter weights as late parameters', () => {
    const r = specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'base', values: { W: weights['W']! } });
    expect(Object.keys(r.constants)).toEqual(['W']);
    expect(r.annotations.stages.get('A')).toBe(SERVING_STAGES.index('adapter'));
  });

  it('writes a bundle that reloads and gives the same results', async () => {
    const r = specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: weights });
    const dir = join(tmp(), 'lora.bundle');
    const manifest = await writeBundle(dir, r);
    expect(manifest.cutoff).toBe('adapter');
    const loaded = await loadBundle(dir);
    expect(loaded.residual).toEqual(r.residual);
    const prepared = await interpreterExecutor.prepare(loaded.residual, loaded.constants);
    const got = (await prepared.run({ x }))['y']!;
    expect(got).toBeAllclose(interpret(mergedLayer(), { inputs: { x }, weights })['y']!, { rtol: 1e-5, atol: 1e-6 });
    await expect(writeBundle(dir, r)).rejects.toMatchObject({ code: 'BUNDLE_IO' });
    await writeBundle(dir, r, { overwrite: true, plan: { version: 1 } });
    expect((await loadBundle(dir)).plan).toEqual({ version: 1 });
  });
});

describe('specialize errors', () => {
  it('names a missing early value', () => {
    const e = expectCode(() => specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: { W: weights['W']! } }), 'RT_MISSING_VALUE');
    expect(e.message).toContain("'B'");
  });

  it('rejects a wrongly shaped early value', () => {
    expectCode(() => specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: { ...weights, A: hostTensor('f32', [R + 1, D], seeded((R + 1) * D, 9)) } }), 'RT_BAD_VALUE');
  });

  it('rejects unknown stages and names', () => {
    expectCode(() => specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'later', values: weights }), 'BTA_UNKNOWN_STAGE');
    expectCode(() => specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations: { params: { C: 'adapter' } }, cutoff: 'adapter', values: weights }), 'BTA_UNKNOWN_NAME');
  });

  it('reports a failing static node by name instead of swallowing it', () => {
    const b = new GraphBuilder('bad');
    const table = b.param('table', ['f32', [4, 2]]);
    const row = b.gather(table, b.constant([7], 'i64', [1]));
    b.output('y', b.add(b.input('x', ['f32', [1, 2]]), row));
    const e = expectCode(() => specialize(b.build(), { cutoff: 'static', values: { table: hostTensor('f32', [4, 2], seeded(8, 5)) } }), 'RT_EVAL_FAILED');
    expect(e.message).toContain('%gather');
  });
});

describe('executors and bundles reject bad input', () => {
  it('checks run-time inputs', async () => {
    const r = specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: weights });
    const p = await interpreterExecutor.prepare(r.residual, r.constants);
    await expect(p.run({})).rejects.toMatchObject({ code: 'RT_MISSING_INPUT' });
    await expect(p.run({ x, z: x })).rejects.toMatchObject({ code: 'RT_UNKNOWN_INPUT' });
    await expect(p.run({ x: hostTensor('f32', [5, D + 1], seeded(5 * (D + 1), 1)) })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
    await expect(p.run({ x: hostTensor('f64', [5, D], seeded(5 * D, 1)) })).rejects.toMatchObject({ code: 'RT_BAD_VALUE' });
    p.dispose();
    await expect(p.run({ x })).rejects.toMatchObject({ code: 'RT_DISPOSED' });
    await expect(interpreterExecutor.prepare(r.residual, {})).rejects.toMatchObject({ code: 'RT_MISSING_WEIGHT' });
  });

  it('rejects corrupt bundles with BUNDLE_INVALID', async () => {
    const r = specialize(mergedLayer(), { lattice: SERVING_STAGES, annotations, cutoff: 'adapter', values: weights });
    const root = tmp();
    const cases: [string, (dir: string) => void][] = [
      ['missing manifest', (d) => { rmSync(join(d, 'manifest.json')); }],
      ['manifest not JSON', (d) => { writeFileSync(join(d, 'manifest.json'), '{nope'); }],
      ['other version', (d) => { const m = JSON.parse(readFileSync(join(d, 'manifest.json'), 'utf8')); m.version = 99; writeFileSync(join(d, 'manifest.json'), JSON.stringify(m)); }],
      ['path escape', (d) => { const m = JSON.parse(readFileSync(join(d, 'manifest.json'), 'utf8')); m.graph = '../x.ir'; writeFileSync(join(d, 'manifest.json'), JSON.stringify(m)); }],
      ['truncated constants', (d) => { truncateSync(join(d, 'constants.safetensors'), 40); }],
      ['residual does not parse', (d) => { writeFileSync(join(d, 'residual.ir'), 'graph @x {'); }],
      ['unknown stage', (d) => { const m = JSON.parse(readFileSync(join(d, 'manifest.json'), 'utf8')); m.stages.x = 'nope'; writeFileSync(join(d, 'manifest.json'), JSON.stringify(m)); }],
    ];
    for (const [name, corrupt] of cases) {
      const dir = join(root, name.replace(/ /g, '-'));
      await writeBundle(dir, r);
      corrupt(dir);
      await expect(loadBundle(dir), name).rejects.toMatchObject({ code: 'BUNDLE_INVALID' });
    }
  });
});

describe('compileStaged', () => {
  it('traces, specializes and prepares a callable residual', async () => {
    const prog = await compileStaged(
      (b) => {
        const xv = b.input('x', ['f32', ['batch', D]]);
        const merged = b.add(b.param('W', ['f32', [O, D]]), b.mul(b.matmul(b.param('B', ['f32', [O, R]]), b.param('A', ['f32', [R, D]])), b.scalar(S)));
        return { y: b.linear(xv, merged) };
      },
      { lattice: SERVING_STAGES, ...annotations },
      { cutoff: 'adapter', values: weights },
    );
    expect(prog.executor).toBe('interpreter');
    expect(prog.report.residualOps).toBe(1);
    const want = interpret(loraLayer(), { inputs: { x }, weights })['y']!;
    expect((await prog.run({ x }))['y']!).toBeAllclose(want, { rtol: 1e-5, atol: 1e-6 });
    prog.dispose();
  });
});
