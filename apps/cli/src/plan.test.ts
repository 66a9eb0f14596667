import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parsePlan } from '@stageml/planner';
import { describe, expect, it } from 'vitest';
import { ExitCode, runCli } from './index.js';

const root = fileURLToPath(new URL('../../../fixtures/peft-tiny/llama', import.meta.url));
const model = join(root, 'base');
const adapters = join(root, 'adapters');

async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runCli(args, {
    out: (l) => out.push(l),
    err: (l) => err.push(l),
  });
  return { code, out: out.join('\n'), err: err.join('\n') };
}

describe('stageml plan', () => {
  const dir = mkdtempSync(join(tmpdir(), 'stageml-plan-'));

  it('plans the fixture Llama and its 4 adapters under a small budget, explains it and writes the plan and the SVG', async () => {
    const out = join(dir, 'plan.json');
    const svg = join(dir, 'pareto.svg');
    const r = await run(['plan', '--model', model, '--adapters', adapters, '--budget', '40KiB', '--batch', '4', '--seq', '16', '--out', out, '--svg', svg, '--sweep', '8']);
    expect(r.err).toBe('');
    expect(r.code).toBe(ExitCode.OK);
    expect(r.out).toMatch(/^adapter\s+share\s+projection\s+r\s+units\s+decision/);
    for (const a of ['all-r16', 'mlp-r4-rslora', 'o-r2', 'qv-r8']) expect(r.out).toContain(a);
    expect(r.out).toMatch(/expected [\d.]+ µs per request \(optimal\); popularity-first rule [\d.]+ µs \([\d.]+× ours\)/);
    const plan = parsePlan(readFileSync(out, 'utf8'));
    // all-r16: 7 projections × 2 layers; mlp-r4-rslora: 2 × 2; o-r2: 1 × 2; qv-r8: 2 × 2.
    expect(plan.units).toHaveLength(24);
    expect(plan.memoryBytes).toBeLessThanOrEqual(40 * 1024);
    expect(plan.adapters.map((a) => a.share)).toEqual([0.25, 0.25, 0.25, 0.25]);
    expect(readFileSync(svg, 'utf8')).toMatch(/^<svg [^>]*>[\s\S]*<path d="M[\d.]+,[\d.]+H/);
  });

  it('weighs decisions by a traffic file and prints JSON', async () => {
    const traffic = join(dir, 'traffic.json');
    writeFileSync(
      traffic,
      JSON.stringify({
        format: 'stageml.traffic',
        version: 1,
        unit: 'requests',
        counts: { 'o-r2': 900, 'qv-r8': 100 },
      }),
    );
    const out = join(dir, 'plan-traffic.json');
    const r = await run(['plan', '--model', model, '--adapters', adapters, '--budget', '24576', '--traffic', traffic, '--out', out, '--json']);
    expect(r.code).toBe(ExitCode.OK);
    const s = JSON.parse(r.out) as {
      kind: string;
      memoryBytes: number;
      kinds: Record<string, number>;
      rows: {
        adapter: string;
        share: number;
        chosen: Record<string, number>;
      }[];
    };
    expect(s.kind).toBe('ok');
    expect(s.memoryBytes).toBeLessThanOrEqual(24576);
    const mat = (a: string): number => s.rows.filter((x) => x.adapter === a).reduce((t, x) => t + (x.chosen['materialize'] ?? 0), 0);
    expect(mat('o-r2')).toBeGreaterThan(0);
    // Adapters without traffic cost nothing on any path, so they take the least memory: the generic path.
    expect(s.rows.filter((x) => x.adapter === 'all-r16').every((x) => x.chosen['fallback'] === 2)).toBe(true);
    expect(s.rows.find((x) => x.adapter === 'o-r2')!.share).toBe(0.9);
  });

  it('uses a calibration file when given one', async () => {
    const calibration = join(dir, 'calibration.json');
    const gemm = [
      {
        shapeClass: 'vector',
        m: 1,
        k: 64,
        n: 64,
        seconds: 2e-5,
        flopsPerSecond: 1e9,
      },
      {
        shapeClass: 'skinny',
        m: 64,
        k: 64,
        n: 16,
        seconds: 3e-5,
        flopsPerSecond: 2e9,
      },
      {
        shapeClass: 'large',
        m: 64,
        k: 256,
        n: 256,
        seconds: 4e-3,
        flopsPerSecond: 3e9,
      },
    ];
    writeFileSync(
      calibration,
      JSON.stringify({
        format: 'stageml.calibration',
        version: 1,
        executor: 'interpreter',
        machine: 'test',
        date: '2026-01-01T00:00:00.000Z',
        gemm,
        dispatchUs: 5,
        bytesPerSecond: 1e9,
      }),
    );
    const r = await run(['plan', '--model', model, '--adapters', adapters, '--budget', '64KiB', '--calibration', calibration, '--out', join(dir, 'plan-cal.json'), '--json']);
    expect(r.code).toBe(ExitCode.OK);
    expect((JSON.parse(r.out) as { costModel: string }).costModel).toBe('calibrated: interpreter on test, 2026-01-01T00:00:00.000Z');
  });

  it('gates materialization on the quantization bound of each merged weight', async () => {
    // One plan per quantization gate: the spec, its error threshold and the plan file (plus extra flags).
    const planQuantized = (spec: string, threshold: string, out: string, ...extra: string[]): ReturnType<typeof run> =>
      run(['plan', '--model', model, '--adapters', adapters, '--budget', '1MiB', '--quantize', spec, '--quant-threshold', threshold, '--out', join(dir, out), ...extra]);
    const strict = await planQuantized('int4', '0', 'q0.json', '--json');
    expect(strict.code).toBe(ExitCode.OK);
    const s0 = JSON.parse(strict.out) as { kinds: Record<string, number>; quantization: { groups: { accepted: boolean; bound: number }[] } };
    expect(s0.kinds['materialize']).toBe(0);
    expect(s0.quantization.groups.every((g) => !g.accepted && g.bound > 0)).toBe(true);
    const loose = await planQuantized('int8:g32', '1', 'q1.json');
    expect(loose.code).toBe(ExitCode.OK);
    expect(loose.out).toMatch(/quantization gate int8:g32 ≤ 1: materialize rejected for 0 of 12 groups/);
    expect(readFileSync(join(dir, 'q1.json'), 'utf8')).toContain('"materialize"');
    const bad = await run(['plan', '--model', model, '--adapters', adapters, '--budget', '0', '--quantize', 'int3', '--out', join(dir, 'q2.json')]);
    expect(bad.err).toContain('error[PLAN_BAD_QUANT_CONFIG]');
  });

  it('reports an infeasible budget with its least memory and exit code 3', async () => {
    const r = await run(['plan', '--model', model, '--adapters', adapters, '--budget', '1024', '--no-fallback', '--out', join(dir, 'never.json')]);
    expect(r.code).toBe(ExitCode.INVALID_INPUT);
    expect(r.err).toMatch(/^error\[PLAN_INFEASIBLE\]: no plan fits 1024 bytes: the least memory any plan needs is \d+ bytes/);
  });

  it('rejects bad budgets, traffic and calibration files with their codes', async () => {
    expect((await run(['plan', '--model', model, '--adapters', adapters, '--budget', '-5', '--out', join(dir, 'x.json')])).code).toBe(ExitCode.USAGE);
    const bad = join(dir, 'bad-traffic.json');
    writeFileSync(
      bad,
      JSON.stringify({
        format: 'stageml.traffic',
        version: 1,
        counts: { ghost: 3 },
      }),
    );
    const t = await run(['plan', '--model', model, '--adapters', adapters, '--budget', '0', '--traffic', bad, '--out', join(dir, 'x.json')]);
    expect(t.code).toBe(ExitCode.INVALID_INPUT);
    expect(t.err).toContain('error[PLAN_BAD_TRAFFIC]');
    const c = await run(['plan', '--model', model, '--adapters', adapters, '--budget', '0', '--calibration', join(dir, 'missing.json'), '--out', join(dir, 'x.json')]);
    expect(c.code).toBe(ExitCode.IO);
    expect(c.err).toContain('error[CLI_IO]');
  });
});
