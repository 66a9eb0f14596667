import { GraphBuilder, tensorType } from '@stageml/ir';
import { analyticCostModel, residualCost } from '@stageml/rewrite';
import { interpreterExecutor } from '@stageml/runtime';
import { beforeAll, describe, expect, it } from 'vitest';
import { type Calibration, calibrate, calibrationToJson, checkCalibration, gemmShapeClass, parseCalibration } from './calibration.js';
import { plannerCostModel } from './cost-model.js';
import { PlanCode, PlanError } from './errors.js';
import { Planner } from './planner.js';
import type { Workload } from './workload.js';

let cal: Calibration;
beforeAll(async () => {
  cal = await calibrate(interpreterExecutor, {
    shapes: [
      [1, 32, 32],
      [16, 32, 4],
      [16, 160, 144],
    ],
    repeats: 3,
    chain: 8,
    date: new Date('2026-01-02T03:04:05Z'),
  });
});

function codeOf(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    return e instanceof PlanError ? `${e.code} ${e.path ?? ''}` : 'not a PlanError';
  }
  return undefined;
}

describe('calibrate', () => {
  it('measures the executor into a valid stageml.calibration v1 document', () => {
    expect(cal).toMatchObject({
      format: 'stageml.calibration',
      version: 1,
      executor: 'interpreter',
      date: '2026-01-02T03:04:05.000Z',
    });
    expect(cal.gemm.map((g) => g.shapeClass)).toEqual(['vector', 'skinny', 'large']);
    for (const g of cal.gemm) expect(g.flopsPerSecond).toBeGreaterThan(0);
    expect(cal.dispatchUs).toBeGreaterThanOrEqual(0);
    expect(cal.bytesPerSecond).toBeGreaterThan(0);
    expect(checkCalibration(cal)).toEqual(cal);
  });

  it('round-trips through JSON text exactly', () => {
    const text = calibrationToJson(cal);
    expect(parseCalibration(text)).toEqual(cal);
    expect(calibrationToJson(parseCalibration(text))).toBe(text);
    expect(text.startsWith('{\n  "format": "stageml.calibration",\n  "version": 1,')).toBe(true);
  });

  it('rejects malformed documents naming the JSON path', () => {
    const doc = JSON.parse(calibrationToJson(cal)) as Record<string, unknown>;
    expect(codeOf(() => parseCalibration('{'))).toBe('PLAN_BAD_CALIBRATION $');
    expect(codeOf(() => checkCalibration({ ...doc, version: 2 }))).toBe('PLAN_BAD_CALIBRATION $.version');
    expect(codeOf(() => checkCalibration({ ...doc, extra: true }))).toBe('PLAN_BAD_CALIBRATION $.extra');
    expect(codeOf(() => checkCalibration({ ...doc, dispatchUs: -1 }))).toBe('PLAN_BAD_CALIBRATION $.dispatchUs');
    const gemm = (doc['gemm'] as Record<string, unknown>[]).map((g, i) => (i === 1 ? { ...g, shapeClass: 'large' } : g));
    expect(codeOf(() => checkCalibration({ ...doc, gemm }))).toBe('PLAN_BAD_CALIBRATION $.gemm[1].shapeClass');
    expect(codeOf(() => plannerCostModel({ calibration: { ...cal, gemm: [] } }))).toBe('PLAN_BAD_CALIBRATION $.gemm');
  });

  it('classifies GEMM shapes', () => {
    expect([gemmShapeClass(1, 4096, 4096), gemmShapeClass(128, 4096, 16), gemmShapeClass(128, 4096, 4096)]).toEqual(['vector', 'skinny', 'large']);
  });
});

describe('plannerCostModel', () => {
  const x = tensorType('f32', [16, 64]);
  const w = tensorType('f32', [64, 64]);
  const y = tensorType('f32', [16, 64]);

  it('is the analytic roofline without a calibration', () => {
    const a = analyticCostModel({ opOverheadSeconds: 1e-6 });
    const p = plannerCostModel({ opOverheadSeconds: 1e-6 });
    expect(p.source).toBe('analytic');
    expect(p.opCost('linear', [x, w], [y], {}, {})).toEqual(a.opCost('linear', [x, w], [y], {}, {}));
    expect(p.constantBytes(w, {})).toBe(64 * 64 * 4);
  });

  it('prices ops from measurements: dispatch plus FLOPs at the nearest shape’s rate, or bytes at the streaming rate', () => {
    const p = plannerCostModel({ calibration: cal });
    expect(p.source).toBe('calibrated');
    expect(p.description).toContain('calibrated: interpreter');
    const c = p.opCost('linear', [x, w], [y], {}, {});
    const large = cal.gemm.find((g) => g.shapeClass === 'skinny' || g.shapeClass === 'large')!;
    expect(c.flops).toBe(2 * 16 * 64 * 64);
    expect(c.seconds).toBeGreaterThan(cal.dispatchUs * 1e-6);
    expect(c.seconds).toBeLessThan(1);
    expect(large.flopsPerSecond).toBeGreaterThan(0);
    const add = p.opCost('add', [y, y], [y], {}, {});
    expect(add.seconds).toBeCloseTo(cal.dispatchUs * 1e-6 + (3 * 16 * 64 * 4) / cal.bytesPerSecond, 12);
  });

  it('implements the rewrite package’s CostModel interface (used by residualCost)', () => {
    const b = new GraphBuilder('lora');
    const xin = b.input('x', ['f32', ['batch', 64]]);
    const lin = b.linear(xin, b.param('w', ['f32', [64, 64]]));
    b.output('y', b.add(lin, b.linear(b.linear(xin, b.param('A', ['f32', [8, 64]])), b.param('B', ['f32', [64, 8]]))));
    const r = residualCost(b.build(), {
      costModel: plannerCostModel({ calibration: cal }),
      sizes: { batch: 4 },
    });
    expect(r.flops).toBeGreaterThan(0);
    expect(r.seconds).toBeGreaterThan(0);
  });

  it('prices a plan with the calibration and records where its numbers come from', () => {
    const w1: Workload = {
      dtype: 'f32',
      batch: 4,
      seq: 8,
      adapters: [
        {
          name: 'a',
          groups: [
            {
              projection: 'q_proj',
              inFeatures: 64,
              outFeatures: 64,
              rank: 8,
              layers: [0, 1],
            },
          ],
        },
      ],
    };
    const planner = new Planner(w1, {
      costModel: plannerCostModel({ calibration: cal }),
    });
    const o = planner.plan(planner.unconstrainedMemory());
    expect(o.kind === 'ok' && o.plan.costModel).toContain('calibrated: interpreter');
  });
});

describe('PlanError', () => {
  it('carries its code and path', () => {
    const e = new PlanError(PlanCode.BAD_DOCUMENT, 'broken', {
      path: '$.units[0]',
    });
    expect([e.code, e.path, e.message, e.name]).toEqual(['PLAN_BAD_DOCUMENT', '$.units[0]', '$.units[0]: broken', 'PlanError']);
  });
});
