import { fc, test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';
import { popularityPlan } from './baseline.js';
import { parsePlan, planToJson } from './plan.js';
import { Planner } from './planner.js';
import { traffic } from './traffic.js';
import { validatePlan } from './validate.js';
import { PLAN_KINDS, type UnitGroup, type Workload, workloadUnitCount } from './workload.js';

const dim = fc.constantFrom(8, 16, 32, 64, 96);

const group = (projection: string): fc.Arbitrary<UnitGroup> =>
  fc
    .record({
      inFeatures: dim,
      outFeatures: dim,
      rank: fc.integer({ min: 1, max: 8 }),
      layers: fc.uniqueArray(fc.integer({ min: 0, max: 5 }), {
        minLength: 1,
        maxLength: 3,
      }),
      experts: fc.option(fc.integer({ min: 1, max: 2 }), { nil: undefined }),
      allowed: fc.option(fc.subarray([...PLAN_KINDS], { minLength: 1 }), {
        nil: undefined,
      }),
    })
    .map(({ experts, allowed, ...g }) => ({
      projection,
      ...g,
      ...(experts === undefined ? {} : { experts, rowShare: 0.5 }),
      ...(allowed === undefined ? {} : { allowed }),
    }));

/** Workloads of at most 12 units, small enough to enumerate every plan. */
const workload: fc.Arbitrary<Workload> = fc
  .record({
    dtype: fc.constantFrom('f32' as const, 'f16' as const),
    batch: fc.integer({ min: 1, max: 8 }),
    seq: fc.integer({ min: 1, max: 16 }),
    adapters: fc.uniqueArray(
      fc.record({
        name: fc.constantFrom('a', 'b', 'c', 'd'),
        groups: fc.tuple(group('q_proj'), fc.option(group('down_proj'), { nil: undefined })),
      }),
      { minLength: 1, maxLength: 4, selector: (a) => a.name },
    ),
  })
  .map(({ adapters, ...w }) => ({
    ...w,
    adapters: adapters.map((a) => ({
      name: a.name,
      groups: a.groups.filter((g): g is UnitGroup => g !== undefined),
    })),
  }))
  .filter((w) => workloadUnitCount(w) <= 12);

const instance = fc.record({
  workload,
  counts: fc.array(fc.nat({ max: 1000 }), { minLength: 4, maxLength: 4 }),
  budgetFraction: fc.double({ min: -0.05, max: 1.1, noNaN: true }),
});

/** The cheapest charged-memory-feasible assignment of every unit, by enumeration. */
function bruteForce(planner: Planner, shares: readonly number[], budget: number): number | undefined {
  const units = planner.groups.flatMap((g) =>
    Array.from({ length: g.units }, () =>
      g.costs.usable.map((k) => ({
        m: planner.chargedBytes(g, k),
        c: shares[g.adapterIndex]! * g.costs.kinds[k].seconds,
      })),
    ),
  );
  let best = Number.POSITIVE_INFINITY;
  const visit = (u: number, m: number, c: number): void => {
    if (m > budget) return;
    if (u === units.length) {
      best = Math.min(best, c);
      return;
    }
    for (const o of units[u]!) visit(u + 1, m + o.m, c + o.c);
  };
  visit(0, 0, 0);
  return Number.isFinite(best) ? best : undefined;
}

describe('Planner.plan', () => {
  test.prop([instance], { numRuns: 500 })('finds the brute-force optimum, validates, and round-trips', ({ workload: w, counts, budgetFraction }) => {
    const planner = new Planner(w);
    const t = traffic(Object.fromEntries(w.adapters.map((a, i) => [a.name, counts[i]!])));
    const budget = Math.max(0, Math.round(budgetFraction * planner.unconstrainedMemory(t)));
    const outcome = planner.plan(budget, t);
    const want = bruteForce(planner, planner.shares(t), budget);
    if (want === undefined) {
      expect(outcome).toEqual({
        kind: 'infeasible',
        minMemory: planner.minMemory(),
      });
      expect(planner.minMemory()).toBeGreaterThan(budget);
      return;
    }
    expect(outcome.kind).toBe('ok');
    if (outcome.kind !== 'ok') return;
    expect(outcome.cost).toBeCloseTo(want, 12);
    expect(Math.abs(outcome.cost - want)).toBeLessThanOrEqual(1e-9 * want + 1e-300);
    expect(outcome.memory).toBeLessThanOrEqual(budget);
    validatePlan(outcome.plan, planner);
    const text = planToJson(outcome.plan);
    expect(parsePlan(text)).toEqual(outcome.plan);
    expect(planToJson(parsePlan(text))).toBe(text);
    const popular = popularityPlan(planner, budget, t);
    if (popular.kind === 'ok') {
      validatePlan(popular.plan, planner);
      expect(popular.cost).toBeGreaterThanOrEqual(outcome.cost * (1 - 1e-12));
    }
  });

  test.prop([instance, fc.array(fc.nat({ max: 1000 }), { minLength: 4, maxLength: 4 })], { numRuns: 100 })(
    're-planning with new traffic reuses the prepared planner and equals planning from scratch',
    ({ workload: w, budgetFraction }, counts2) => {
      const planner = new Planner(w);
      const t2 = traffic(Object.fromEntries(w.adapters.map((a, i) => [a.name, counts2[i]!])));
      const budget = Math.max(0, Math.round(budgetFraction * planner.unconstrainedMemory()));
      planner.plan(budget);
      const again = planner.plan(budget, t2);
      const fresh = new Planner(w).plan(budget, t2);
      expect(again.kind).toBe(fresh.kind);
      if (again.kind === 'ok' && fresh.kind === 'ok') expect(again.cost).toBeCloseTo(fresh.cost, 15);
    },
  );
});
