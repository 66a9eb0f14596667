import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { hostTensor } from '@stageml/ir';
import { thrownBy } from '@stageml/testkit';
import { describe, expect, it } from 'vitest';
import {
  type ExpertLora,
  MoeCode,
  type MoeModelShape,
  type MoePlan,
  MoePlanError,
  buildMoePlan,
  checkMoePlan,
  describeMoeAdapter,
  layerPlanOf,
  moePlanToJson,
  parseMoePlan,
  validateMoePlan,
} from './index.js';

const doc = readFileSync(fileURLToPath(new URL('../../../docs/moe-plan.md', import.meta.url)), 'utf8');
const blocks = [...doc.matchAll(/```json\n([\s\S]*?)```/g)].map((m) => m[1]!);
const SHAPE = JSON.parse(blocks[0]!) as MoeModelShape;
const EXAMPLE = blocks[1]!;
const L0 = 'model.layers.0.mlp.experts';

/** Asserts `f` throws MOE_BAD_PLAN at `path`. */
function expectPlanError(f: () => unknown, path: string): void {
  const e = thrownBy(f);
  expect(e).toBeInstanceOf(MoePlanError);
  expect(e).toMatchObject({ code: MoeCode.BAD_PLAN, path });
  expect((e as Error).message.startsWith(`${path}: `)).toBe(true);
}

/** The example plan as a mutable JSON document. */
function exampleDoc(): { format: unknown; version: unknown; model?: unknown; units: Record<string, unknown>[]; [k: string]: unknown } {
  return JSON.parse(EXAMPLE) as ReturnType<typeof exampleDoc>;
}

describe('the documented example (docs/moe-plan.md)', () => {
  it('parses, validates, and prints back to the same bytes', () => {
    const plan = parseMoePlan(EXAMPLE, SHAPE);
    expect(plan.units).toHaveLength(8);
    expect(moePlanToJson(plan, SHAPE)).toBe(EXAMPLE);
  });

  it('gives the layer plan the doc states', () => {
    expect(layerPlanOf(parseMoePlan(EXAMPLE), SHAPE, 'experts-r4', L0)).toEqual({
      gate_up_proj: ['materialize', 'materialize', 'residual', 'fallback'],
      down_proj: ['residual', 'residual', 'residual', 'fallback'],
    });
  });
});

describe('checkMoePlan / validateMoePlan', () => {
  const cases: [string, (d: ReturnType<typeof exampleDoc>) => void, string][] = [
    ['unknown version', (d) => (d.version = 2), '$.version'],
    ['a version given as a string', (d) => (d.version = '1'), '$.version'],
    ['another format', (d) => (d.format = 'stageml.residual-plan'), '$.format'],
    ['an unknown top-level field', (d) => (d['plans'] = []), '$.plans'],
    ['units that are not an array', (d) => ((d as Record<string, unknown>)['units'] = {}), '$.units'],
    ['a unit that is not an object', (d) => (d.units[1] = 3 as never), '$.units[1]'],
    ['an unknown unit field', (d) => (d.units[2]!['kind'] = 'x'), '$.units[2].kind'],
    ['an unknown choice', (d) => (d.units[3]!['choice'] = 'merge'), '$.units[3].choice'],
    ['an unknown projection', (d) => (d.units[4]!['projection'] = 'w1'), '$.units[4].projection'],
    ['a fractional expert', (d) => (d.units[5]!['expert'] = 1.5), '$.units[5].expert'],
    ['a negative expert', (d) => (d.units[5]!['expert'] = -1), '$.units[5].expert'],
    ['an empty adapter name', (d) => (d.units[0]!['adapter'] = ''), '$.units[0].adapter'],
    ['an expert out of range', (d) => (d.units[6]!['expert'] = 4), '$.units[6].expert'],
    ['an adapter not in the shape description', (d) => (d.units[7]!['adapter'] = 'nope'), '$.units[7].adapter'],
    ['a layer not in the model', (d) => (d.units[1]!['layer'] = 'model.layers.9.mlp.experts'), '$.units[1].layer'],
    ['a unit planned twice', (d) => d.units.push({ ...d.units[2]!, choice: 'fallback' }), '$.units[8]'],
    ['a missing unit', (d) => d.units.splice(3, 1), '$.units'],
    ['a non-string reason', (d) => (d.units[0]!['reason'] = 1), '$.units[0].reason'],
  ];
  for (const [what, mutate, path] of cases) {
    it(`rejects ${what} with MOE_BAD_PLAN at ${path}`, () => {
      const d = exampleDoc();
      mutate(d);
      expectPlanError(() => checkMoePlan(d, SHAPE), path);
    });
  }

  it('rejects a layer or projection the adapter does not target', () => {
    const shape: MoeModelShape = {
      layers: [...SHAPE.layers, { name: 'model.layers.1.mlp.experts', numExperts: 4 }],
      adapters: [{ name: 'experts-r4', targets: [{ layer: L0, projections: ['gate_up_proj'] }] }],
    };
    const plan = parseMoePlan(EXAMPLE);
    expectPlanError(() => { validateMoePlan(plan, shape); }, '$.units[4].projection');
    const moved = { ...plan, units: plan.units.map((u, i) => (i === 0 ? { ...u, layer: 'model.layers.1.mlp.experts' } : u)) };
    expectPlanError(() => { validateMoePlan(moved, shape); }, '$.units[0].layer');
  });

  it('rejects text that is not JSON at $', () => {
    expectPlanError(() => parseMoePlan('{"format": '), '$');
    expectPlanError(() => parseMoePlan('[]'), '$');
  });

  it('accepts a plan that leaves an adapter out entirely', () => {
    const shape: MoeModelShape = { ...SHAPE, adapters: [...SHAPE.adapters, { name: 'other', targets: [{ layer: L0, projections: ['down_proj'] }] }] };
    expect(() => parseMoePlan(EXAMPLE, shape)).not.toThrow();
  });

  it('checks the plan before printing it', () => {
    const bad = { ...parseMoePlan(EXAMPLE), version: 3 } as unknown as MoePlan;
    expectPlanError(() => moePlanToJson(bad), '$.version');
  });
});

describe('buildMoePlan / layerPlanOf', () => {
  it('plans every unit in canonical order', () => {
    const plan = buildMoePlan(SHAPE, (u) => (u.expert % 2 === 0 ? 'materialize' : 'residual'), { model: 'm' });
    expect(plan.units.map((u) => `${u.projection}:${String(u.expert)}:${u.choice}`)).toEqual([
      'gate_up_proj:0:materialize',
      'gate_up_proj:1:residual',
      'gate_up_proj:2:materialize',
      'gate_up_proj:3:residual',
      'down_proj:0:materialize',
      'down_proj:1:residual',
      'down_proj:2:materialize',
      'down_proj:3:residual',
    ]);
    expect(() => { validateMoePlan(plan, SHAPE); }).not.toThrow();
  });

  it('serves an adapter without a compiled plan by fallback everywhere', () => {
    const empty = buildMoePlan(SHAPE, () => 'materialize', { adapters: [] });
    expect(empty.units).toEqual([]);
    expect(layerPlanOf(empty, SHAPE, 'experts-r4', L0)).toEqual({ gate_up_proj: new Array(4).fill('fallback'), down_proj: new Array(4).fill('fallback') });
  });

  it('refuses an invalid plan or an unknown adapter or layer', () => {
    const plan = parseMoePlan(EXAMPLE);
    expectPlanError(() => layerPlanOf({ ...plan, units: plan.units.slice(1) }, SHAPE, 'experts-r4', L0), '$.units');
    expectPlanError(() => layerPlanOf(plan, SHAPE, 'nope', L0), '$.units');
    expectPlanError(() => layerPlanOf(plan, SHAPE, 'experts-r4', 'model.layers.7.mlp.experts'), '$.units');
  });
});

describe('describeMoeAdapter', () => {
  it('lists the projections each layer has factors for', () => {
    const t = hostTensor('f32', [1, 1, 1], [0]);
    const lora = (projection: ExpertLora['projection']): ExpertLora => ({ projection, A: t, B: t, rank: 1, scale: 1 });
    const byLayer = new Map<string, ExpertLora[]>([
      [L0, [lora('down_proj'), lora('gate_up_proj')]],
      ['model.layers.1.mlp.experts', []],
      ['model.layers.2.mlp.experts', [lora('down_proj')]],
    ]);
    expect(describeMoeAdapter('a', byLayer)).toEqual({
      name: 'a',
      targets: [
        { layer: L0, projections: ['gate_up_proj', 'down_proj'] },
        { layer: 'model.layers.2.mlp.experts', projections: ['down_proj'] },
      ],
    });
  });
});
