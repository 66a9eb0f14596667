import { checkMoePlan } from '@stageml/moe';
import { beforeAll, describe, expect, it } from 'vitest';
import { popularityPlan } from './baseline.js';
import { PlanCode, PlanError } from './errors.js';
import { executableKinds, executorCapabilities } from './executor-caps.js';
import { explainPlan, formatExplanation, paretoSvg, paretoSweep } from './explain.js';
import { MOE_UNIT_KINDS, llamaWorkload } from './llama.js';
import { toMoePlan } from './moe-bridge.js';
import { type Plan, parsePlan, planToJson } from './plan.js';
import { Planner } from './planner.js';
import { loadFixture } from './test-fixtures.js';
import { TrafficCounter, parseTraffic, traffic } from './traffic.js';
import { validatePlan, validatePlanDocument } from './validate.js';
import type { Workload } from './workload.js';

/** Expects `f` to throw a `PlanError` with `code`. */
function expectCode(f: () => unknown, code: string): void {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(PlanError);
    expect((e as PlanError).code).toBe(code);
    return;
  }
  expect.unreachable(`expected ${code}`);
}

let llama: Workload;
let mixtral: Workload;
beforeAll(async () => {
  const l = await loadFixture('llama');
  llama = llamaWorkload(l.config, l.adapters, {
    batch: 4,
    seq: 16,
    model: 'peft-tiny/llama',
  });
  const m = await loadFixture('mixtral');
  mixtral = llamaWorkload(m.config, m.adapters, { batch: 4, seq: 16 });
});

function okPlan(planner: Planner, budget: number, t?: ReturnType<typeof traffic>): Plan {
  const o = planner.plan(budget, t);
  if (o.kind !== 'ok') throw new PlanError(PlanCode.OVER_BUDGET, 'expected a plan');
  return o.plan;
}

describe('llamaWorkload', () => {
  it("takes Phi-3's fused qkv_proj / gate_up_proj modules (regression: refused as not a Llama projection)", async () => {
    const { readFile } = await import('node:fs/promises');
    const { fileURLToPath } = await import('node:url');
    const { parseLlamaConfig } = await import('@stageml/models');
    const { loadLoraAdapter } = await import('@stageml/peft');
    const dir = fileURLToPath(new URL('../../../fixtures/hf-families/phi3/', import.meta.url));
    const config = parseLlamaConfig(await readFile(`${dir}config.json`, 'utf8'));
    const w = llamaWorkload(config, [await loadLoraAdapter(`${dir}adapters/fused-all-r4`)], { batch: 2, seq: 8 });
    expect(w.adapters[0]!.groups.map((g) => `${g.projection}:${String(g.inFeatures)}x${String(g.outFeatures)}`)).toEqual(['o_proj:64x64', 'down_proj:96x64', 'qkv_proj:64x128', 'gate_up_proj:64x192']);
  });

  it('has one group per (projection, shape, rank) of every adapter, shapes read from the factors', () => {
    expect(llama.adapters.map((a) => a.name)).toEqual(['all-r16', 'mlp-r4-rslora', 'o-r2', 'qv-r8']);
    const all = llama.adapters[0]!.groups;
    expect(all.map((g) => g.projection)).toEqual(['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']);
    expect(all.find((g) => g.projection === 'k_proj')).toMatchObject({
      inFeatures: 64,
      outFeatures: 32,
      rank: 16,
      layers: [0, 1],
    });
    expect(llama.adapters[3]!.groups.map((g) => `${g.projection}:${String(g.rank)}`)).toEqual(['q_proj:8', 'v_proj:8']);
  });

  it('plans MoE experts per unit with the MoE plan choices only', () => {
    const experts = mixtral.adapters.find((a) => a.name === 'experts-r4')!.groups;
    expect(experts.map((g) => [g.projection, g.experts, g.rowShare, g.allowed])).toEqual([
      ['gate_up_proj', 4, 0.5, MOE_UNIT_KINDS],
      ['down_proj', 4, 0.5, MOE_UNIT_KINDS],
    ]);
  });

  it('exports the expert units as a valid stageml.moe-plan', () => {
    const planner = new Planner(mixtral);
    const plan = okPlan(planner, Math.round(planner.unconstrainedMemory() / 2));
    const moe = toMoePlan(plan);
    expect(moe.units).toHaveLength(2 * 2 * 4);
    const layers = [0, 1].map((l) => ({
      name: `model.layers.${String(l)}.mlp.experts`,
      numExperts: 4,
    }));
    const shape = {
      layers,
      adapters: [
        {
          name: 'experts-r4',
          targets: layers.map((l) => ({
            layer: l.name,
            projections: ['gate_up_proj', 'down_proj'] as const,
          })),
        },
      ],
    };
    expect(checkMoePlan(moe, shape)).toEqual(moe);
  });
});

describe('Planner', () => {
  it('is infeasible below the least memory, with that memory', () => {
    const strict: Workload = {
      ...llama,
      adapters: llama.adapters.map((a) => ({
        ...a,
        groups: a.groups.map((g) => ({
          ...g,
          allowed: ['materialize', 'residual'] as const,
        })),
      })),
    };
    const planner = new Planner(strict);
    const min = planner.minMemory();
    expect(min).toBeGreaterThan(0);
    expect(planner.plan(min - 1)).toEqual({
      kind: 'infeasible',
      minMemory: min,
    });
    expect(planner.plan(min).kind).toBe('ok');
  });

  it('spends more memory for lower cost as the budget grows, and always beats or ties the popularity rule', () => {
    const planner = new Planner(llama);
    const t = traffic({
      'all-r16': 10,
      'mlp-r4-rslora': 300,
      'o-r2': 500,
      'qv-r8': 40,
    });
    const sweep = paretoSweep(planner, t, 12);
    for (let i = 1; i < sweep.length; i++) expect(sweep[i]!.optimal!).toBeLessThanOrEqual(sweep[i - 1]!.optimal!);
    for (const p of sweep) if (p.popularity !== undefined) expect(p.optimal!).toBeLessThanOrEqual(p.popularity * (1 + 1e-12));
    expect(sweep.some((p) => p.popularity !== undefined && p.optimal! < p.popularity * 0.999)).toBe(true);
    const svg = paretoSvg(sweep, { mark: sweep[5]!.budgetBytes });
    expect(svg).toMatch(/^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/);
    expect(svg).toContain('optimal (exact)');
    expect(svg.match(/<circle /g)).toHaveLength(sweep.length);
  });

  it('re-plans when live traffic shifts to another adapter', () => {
    const planner = new Planner(llama);
    const budget = Math.round(planner.unconstrainedMemory() / 15);
    const counter = new TrafficCounter();
    for (let i = 0; i < 90; i++) counter.record('qv-r8', 16);
    counter.record('o-r2', 16);
    const before = okPlan(planner, budget, counter.snapshot());
    counter.reset();
    for (let i = 0; i < 90; i++) counter.record('o-r2', 16);
    counter.record('qv-r8', 16);
    const after = okPlan(planner, budget, counter.snapshot('tokens'));
    const mat = (p: Plan, a: string): number => p.units.filter((u) => u.adapter === a && u.kind === 'materialize').length;
    expect(mat(before, 'qv-r8')).toBeGreaterThan(mat(after, 'qv-r8'));
    expect(mat(after, 'o-r2')).toBeGreaterThan(mat(before, 'o-r2'));
  });

  it('explains every group with the numbers of every kind', () => {
    const planner = new Planner(llama);
    const plan = okPlan(planner, Math.round(planner.unconstrainedMemory() / 3));
    const rows = explainPlan(planner, plan);
    expect(rows).toHaveLength(planner.groups.length);
    expect(rows.reduce((a, r) => a + Object.values(r.chosen).reduce((x, y) => x + y, 0), 0)).toBe(plan.units.length);
    const lines = formatExplanation(rows);
    expect(lines[0]).toMatch(/^adapter\s+share\s+projection/);
    expect(lines).toHaveLength(rows.length + 2);
  });

  it('uses only the kinds the executor can run', () => {
    const noBank = {
      name: 'no-gather',
      supportsOp: (op: string) => op !== 'gather' && op !== 'indexSelect',
      lateBinding: false,
    };
    expect(executableKinds(noBank)).toEqual(['materialize', 'residual']);
    expect(executableKinds(executorCapabilities('tfjs-cpu'))).toEqual(['materialize', 'residual', 'grouped-bank', 'fallback']);
    // onnxruntime (the default executor) is described by its rule table, like every executor.
    expect(executableKinds(executorCapabilities('onnxruntime'))).toEqual(['materialize', 'residual', 'grouped-bank', 'fallback']);
    expectCode(() => executorCapabilities('no-such-executor'), PlanCode.BAD_OPTION);
    const planner = new Planner(llama, { executor: noBank });
    const plan = okPlan(planner, planner.unconstrainedMemory());
    expect(new Set(plan.units.map((u) => u.kind)).has('fallback')).toBe(false);
    // A plan made for the interpreter uses kinds this executor cannot run.
    const generic = new Planner(llama);
    const wide = okPlan(generic, 0);
    expectCode(() => {
      validatePlanDocument(wide, noBank);
    }, PlanCode.NOT_EXECUTABLE);
    const onlyFallback: Workload = {
      ...llama,
      adapters: [
        {
          name: 'x',
          groups: [{ ...llama.adapters[0]!.groups[0]!, allowed: ['fallback'] }],
        },
      ],
    };
    expectCode(() => new Planner(onlyFallback, { executor: noBank }), PlanCode.NOT_EXECUTABLE);
  });

  it('rejects bad options and workloads with coded errors', () => {
    const planner = new Planner(llama);
    expectCode(() => planner.plan(-1), PlanCode.BAD_OPTION);
    expectCode(() => planner.plan(1.5), PlanCode.BAD_OPTION);
    expectCode(() => new Planner(llama, { fallbackPenalty: 0.5 }), PlanCode.BAD_OPTION);
    expectCode(() => new Planner(llama, { executor: 'cuda-magic' }), PlanCode.BAD_OPTION);
    expectCode(
      () =>
        new Planner({
          ...llama,
          adapters: [llama.adapters[0]!, llama.adapters[0]!],
        }),
      PlanCode.BAD_WORKLOAD,
    );
    expectCode(
      () =>
        new Planner({
          ...llama,
          adapters: [
            {
              name: 'z',
              groups: [{ ...llama.adapters[0]!.groups[0]!, rank: 0 }],
            },
          ],
        }),
      PlanCode.BAD_WORKLOAD,
    );
    expectCode(() => new Planner({ ...llama, batch: 0 }), PlanCode.BAD_WORKLOAD);
  });
});

describe('traffic', () => {
  it('parses stageml.traffic and rejects bad documents', () => {
    expect(parseTraffic('{"format":"stageml.traffic","version":1,"unit":"tokens","counts":{"o-r2":5}}').counts).toEqual({ 'o-r2': 5 });
    expectCode(() => parseTraffic('{'), PlanCode.BAD_TRAFFIC);
    expectCode(() => parseTraffic('{"format":"stageml.traffic","version":2,"counts":{}}'), PlanCode.BAD_TRAFFIC);
    expectCode(() => parseTraffic('{"format":"stageml.traffic","version":1,"counts":{"a":-1}}'), PlanCode.BAD_TRAFFIC);
    expectCode(() => new Planner(llama).plan(0, traffic({ nobody: 1 })), PlanCode.BAD_TRAFFIC);
  });
});

describe('validatePlan', () => {
  let planner: Planner;
  let plan: Plan;
  beforeAll(() => {
    planner = new Planner(llama);
    plan = okPlan(planner, Math.round(planner.unconstrainedMemory() / 3));
  });
  const edit = (f: (units: Plan['units'][number][]) => void, top: Partial<Plan> = {}): Plan => {
    const units = plan.units.map((u) => ({ ...u }));
    f(units);
    return { ...plan, ...top, units };
  };

  it('accepts the planner’s plan and its JSON round trip', () => {
    validatePlan(plan, planner);
    validatePlan(parsePlan(planToJson(plan)), planner);
  });

  it('names each violation with its code', () => {
    expectCode(() => {
      validatePlan(
        edit((u) => u.pop()),
        planner,
      );
    }, PlanCode.ACCOUNTING_MISMATCH);
    const dropped = edit((u) => u.pop());
    const fixed = {
      ...dropped,
      memoryBytes: dropped.units.reduce((a, u) => a + u.memoryBytes, 0),
      expectedSeconds: dropped.units.reduce((a, u) => a + 0.25 * u.seconds, 0),
    };
    expectCode(() => {
      validatePlan(fixed, planner);
    }, PlanCode.MISSING_UNIT);
    expectCode(() => {
      validatePlan(
        edit((u) => u.push({ ...u[0]! })),
        planner,
      );
    }, PlanCode.DUPLICATE_UNIT);
    expectCode(() => {
      validatePlan(
        edit((u) => (u[0] = { ...u[0]!, layer: 9 })),
        planner,
      );
    }, PlanCode.UNKNOWN_UNIT);
    expectCode(() => {
      validatePlan(
        edit((u) => (u[0] = { ...u[0]!, rank: 3 })),
        planner,
      );
    }, PlanCode.SHAPE_MISMATCH);
    expectCode(() => {
      validatePlan(
        edit(() => undefined, { budgetBytes: plan.memoryBytes - 1 }),
        planner,
      );
    }, PlanCode.OVER_BUDGET);
    expectCode(() => {
      validatePlan(
        edit(() => undefined, { memoryBytes: plan.memoryBytes + 1 }),
        planner,
      );
    }, PlanCode.ACCOUNTING_MISMATCH);
    expectCode(() => {
      validatePlan(
        edit((u) => (u[0] = { ...u[0]!, seconds: u[0]!.seconds * 2 })),
        planner,
      );
    }, PlanCode.ACCOUNTING_MISMATCH);
    const strict = new Planner({
      ...llama,
      adapters: llama.adapters.map((a) => ({
        ...a,
        groups: a.groups.map((g) => ({
          ...g,
          allowed: ['materialize', 'residual', 'grouped-bank'] as const,
        })),
      })),
    });
    const fb = okPlan(planner, 0);
    expectCode(() => {
      validatePlan(fb, strict);
    }, PlanCode.KIND_NOT_ALLOWED);
  });

  it('rejects malformed plan documents with the JSON path', () => {
    const text = planToJson(plan);
    const bad = (f: (d: Record<string, unknown>) => void): string => {
      const d = JSON.parse(text) as Record<string, unknown>;
      f(d);
      return JSON.stringify(d);
    };
    expectCode(() => parsePlan('nope'), PlanCode.BAD_DOCUMENT);
    expectCode(() => parsePlan(bad((d) => (d['version'] = 2))), PlanCode.BAD_DOCUMENT);
    expectCode(() => parsePlan(bad((d) => (d['extra'] = 1))), PlanCode.BAD_DOCUMENT);
    const kind = bad((d) => ((d['units'] as Record<string, unknown>[])[2]!['kind'] = 'merge'));
    expect(() => parsePlan(kind)).toThrow(expect.objectContaining({ code: PlanCode.BAD_DOCUMENT, path: '$.units[2].kind' }));
  });
});

describe('popularityPlan', () => {
  it('materializes whole adapters, first fit in traffic order, the rest residual', () => {
    const planner = new Planner(llama);
    const t = traffic({
      'all-r16': 1,
      'mlp-r4-rslora': 2,
      'o-r2': 4,
      'qv-r8': 3,
    });
    const budget = Math.round(planner.unconstrainedMemory() / 2);
    const o = popularityPlan(planner, budget, t);
    expect(o.kind).toBe('ok');
    if (o.kind !== 'ok') return;
    const kinds = (a: string): Set<string> => new Set(o.plan.units.filter((u) => u.adapter === a).map((u) => u.kind));
    expect(kinds('o-r2')).toEqual(new Set(['materialize']));
    for (const a of ['all-r16', 'mlp-r4-rslora', 'qv-r8']) expect(kinds(a).has('materialize') && kinds(a).size > 1).toBe(false);
    const best = planner.plan(budget, t);
    expect(best.kind === 'ok' && best.cost).toBeLessThan(o.cost);
  });
});
